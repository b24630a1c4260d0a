"""Start N ranks and run one function on each, or run under torchrun unchanged.

`run_ranks(fn, world_size, *args)` calls `fn(ctx, *args)` on every rank and returns the results in
rank order. `ctx` carries the rank, the device and the 1-D device mesh, built here and passed
explicitly. Two ways to get ranks:

- On its own, it spawns `world_size` processes on this machine (CPU + gloo by default) that meet at the
  store rank 0 opens on 127.0.0.1, on a port the OS picks (`Meeting`). A rank that raises, dies or stops
  making progress ends the whole run with `RankFailed` naming that rank, and every process it started
  is gone when it returns or raises.
  `Placement.SHARED_GPU` puts all of them on cuda:0 over gloo; `Placement.RANK_VIEW` starts one process
  that is rank 0 of `world_size` on torch's fake process group (real memory, collectives answered
  without moving data), and returns that one rank's result.
- Under torchrun (RANK, WORLD_SIZE and LOCAL_RANK in the environment), this process is one rank:
  NCCL on cuda:LOCAL_RANK when CUDA is present, gloo on CPU otherwise, several nodes through
  torchrun's rendezvous. The results are exchanged so every rank returns the full list.

Pass several configurations to one call when you can: starting processes and importing torch costs
seconds, a process group can run many configurations in a row.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import itertools
import multiprocessing as mp
import os
import pickle
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from sharding_lab.parent_death import die_with_parent
from sharding_lab.run_config import Placement

_LABEL_WIDTH = 96  # bytes of shared memory per rank for its last progress label
# A run out of time whose ranks recorded progress this recently (or within a quarter of the timeout)
# is called slow, not hung: marks come at each step's forward, backward and optimizer.
SLOW_NOT_HUNG_S = 60.0


class RankFailed(RuntimeError):
    """A rank raised, died or hung; the run was ended and every rank process stopped. `reason` says what
    happened in a line or two; `details` holds the rank's traceback or Python stack, for a developer
    (`details_of`'s, when another rank's: a rank that died silently leaves only its peer's)."""

    def __init__(self, rank: int, reason: str, details: str = "", details_name: str = "traceback",
                 details_of: int | None = None):
        self.rank = rank
        self.reason = reason
        self.details = details
        self.details_name = details_name
        self.details_of = rank if details_of is None else details_of
        super().__init__(f"rank {rank} failed: {reason}")

    def for_user(self) -> str:
        """The failure as a user reads it: never a raw traceback. The details go to a file of their own,
        named in the message."""
        if not self.details:
            return str(self)
        try:
            with tempfile.NamedTemporaryFile(
                "w", prefix=f"sharding-lab-rank{self.details_of}-", suffix=".txt", delete=False
            ) as file:
                file.write(self.details + "\n")
        except OSError as error:
            return (f"{self} (rank {self.details_of}'s {self.details_name} could not be saved: "
                    f"{error.strerror or error})")
        return f"{self} (rank {self.details_of}'s {self.details_name}: {file.name})"


def for_user(error: BaseException) -> str:
    """Any engine failure as a user reads it: a RankFailed's reason (details saved aside), anything else
    as its type and message."""
    return error.for_user() if isinstance(error, RankFailed) else f"{type(error).__name__}: {error}"


def _error_report() -> tuple[str, str]:
    """The exception a rank is handling, as (its type and the first line of its message, its traceback)."""
    error = sys.exc_info()[1]
    lines = str(error).strip().splitlines()
    return (f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__), traceback.format_exc()


@dataclass
class RankContext:
    """What a rank's function gets: who it is, where it runs, and the mesh over all ranks."""

    rank: int
    world_size: int
    local_rank: int
    backend: str  # "gloo", "nccl", or "fake" in a rank view
    device: Any  # torch.device
    mesh: Any  # torch.distributed.device_mesh.DeviceMesh, 1-D over every rank, dim name "dp"
    _progress_counts: Any = field(default=None, repr=False)
    _progress_labels: Any = field(default=None, repr=False)

    def mark(self, label: str) -> None:
        """Record progress. If the run hangs, the rank that got least far is named as the culprit."""
        if self._progress_counts is None:
            return
        self._progress_counts[self.rank] += 1
        encoded = label.encode()[: _LABEL_WIDTH - 1].ljust(_LABEL_WIDTH, b"\0")
        start = self.rank * _LABEL_WIDTH
        self._progress_labels[start : start + _LABEL_WIDTH] = encoded


def under_torchrun() -> bool:
    return all(name in os.environ for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))


@contextlib.contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """Within it, SIGTERM (the study app's stop, a `kill`) raises SystemExit(143), so this process
    unwinds as from any error: its ranks are stopped and its temporary files removed, where the default
    action would leave them and the semaphores its ranks share. Not under torchrun (its agent stops ranks
    its own way) nor off the main thread; the previous handler comes back on leaving."""
    with _handling(signal.SIGTERM, _exit_on_sigterm):
        yield


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def _handling(signum: int, handler: Callable[[int, object], None]) -> Iterator[None]:
    """`handler` for `signum` within it, the previous one back on leaving; nothing under torchrun (its
    agent stops ranks its own way) nor off the main thread (only it may set handlers)."""
    if under_torchrun() or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signum, handler)
    try:
        yield
    finally:
        signal.signal(signum, previous)


# Longer than stopping ranks takes once interrupted: each is sent SIGTERM, then SIGKILL after 3 s.
_UNWIND_S = 10.0


@contextlib.contextmanager
def sigint_unwinds() -> Iterator[None]:
    """Within it, SIGINT (a terminal's Ctrl-C) raises KeyboardInterrupt, which unwinds as SIGTERM does
    (ranks stopped, folders removed), and a second one within `_UNWIND_S` is ignored: an impatient second
    Ctrl-C would cut that clean-up short. A later one raises again, in case the first was lost (raised in
    a finalizer, which only prints it). Same conditions as `sigterm_unwinds`; the previous handler comes
    back on leaving."""
    interrupted_at = -_UNWIND_S

    def interrupt(signum: int, frame: object) -> None:
        nonlocal interrupted_at
        if time.monotonic() - interrupted_at < _UNWIND_S:
            return
        interrupted_at = time.monotonic()
        raise KeyboardInterrupt

    with _handling(signal.SIGINT, interrupt):
        yield


_ranks_started = 0  # rank processes this process started: an interrupt says it stopped them


def ranks_started() -> int:
    return _ranks_started


def start_ranks(processes) -> None:
    """Start rank processes (multiprocessing's, not yet started) that ignore SIGINT. A terminal's Ctrl-C
    goes to its whole foreground process group, ranks included; their parent stops them as its own
    interrupt unwinds, so a rank's KeyboardInterrupt would only add a traceback per rank. SIGINT is
    blocked while they start, because a signal mask survives fork and exec where a handler does not: a
    rank cannot be interrupted while it imports, before `ignore_sigint` runs in it (multiprocessing
    starts its resource tracker the same way). This process's own SIGINT is only deferred: handled once
    the mask is restored, or at once where another of its threads took it."""
    global _ranks_started
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        for process in processes:
            process.start()
            _ranks_started += 1
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def ignore_sigint() -> None:
    """In a rank started by `start_ranks`: SIGINT ignored, then unblocked (a pending one is dropped)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def run_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    device: str = "cpu",
    placement: Placement = Placement.RANKS,
    timeout_s: float = 600.0,
    on_progress: Callable[[str], None] | None = None,
) -> list[Any]:
    """Run `fn(ctx, *args)` on `world_size` ranks and return their results in rank order (only rank 0's
    in a rank view).

    `fn` must be importable by name (a module-level function), because ranks are fresh processes.
    `device` is "cpu" (gloo) or "cuda" (NCCL, one GPU per rank, unless `placement` says otherwise);
    under torchrun the environment decides and `world_size` must match WORLD_SIZE. `on_progress`
    receives rank 0's latest `ctx.mark(...)` label whenever it changes (spawned ranks only).
    """
    if under_torchrun():
        if int(os.environ["WORLD_SIZE"]) != world_size:
            raise ValueError(f"asked for {world_size} ranks but torchrun started {os.environ['WORLD_SIZE']}")
        return _run_under_torchrun(fn, args, timeout_s)
    if placement is Placement.AUTO:
        raise ValueError("resolve Placement.AUTO first (run_config.resolve_placement)")
    return _spawn_ranks(fn, world_size, args, device, placement, timeout_s, on_progress)


def cuda_device_count() -> int:
    """The CUDA GPUs torch sees, asked of a fresh interpreter so this process never imports torch."""
    probe = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"
    completed = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    if completed.returncode != 0:
        raise RuntimeError(f"could not ask torch for the CUDA devices: {completed.stderr.strip()[-500:]}")
    return int(completed.stdout.strip().splitlines()[-1])


def is_reporting_rank() -> bool:
    """Whether this process should print results: always on its own, rank 0 alone under torchrun."""
    return not under_torchrun() or int(os.environ["RANK"]) == 0


# --- inside a rank ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Meeting:
    """Where spawned ranks meet: rank 0 opens the process group's store on a port the OS picks and
    publishes it in `port` (shared memory, 0 until then); the others wait for it. A port picked free in
    the parent and bound by rank 0 seconds later, after importing torch, could be taken meanwhile."""

    port: Any  # a multiprocessing RawValue of c_int

    @classmethod
    def new(cls, context) -> Meeting:
        return cls(context.RawValue(ctypes.c_int, 0))

    def store(self, rank: int, world_size: int, timeout_s: float):
        import torch.distributed as dist

        timeout = timedelta(seconds=timeout_s)
        if rank == 0:
            store = dist.TCPStore("127.0.0.1", 0, world_size, is_master=True, timeout=timeout, wait_for_workers=False)
            self.port.value = store.port
            return store
        deadline = time.monotonic() + timeout_s
        while (port := self.port.value) == 0:
            if time.monotonic() > deadline:
                raise TimeoutError(f"rank 0 did not open the ranks' store within {timeout_s:g} s")
            time.sleep(0.01)
        return dist.TCPStore("127.0.0.1", port, world_size, is_master=False, timeout=timeout)


def _init_rank(
    rank: int,
    world_size: int,
    local_rank: int,
    device_type: str,
    meeting: Meeting | None,
    timeout_s: float,
    placement: Placement = Placement.RANKS,
):
    """This rank's device, backend and mesh; spawned ranks meet at `meeting`, torchrun's (None) at its
    environment's store."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    gpu = 0 if placement in (Placement.RANK_VIEW, Placement.SHARED_GPU) else local_rank
    if device_type == "cuda":
        if gpu >= torch.cuda.device_count():  # checked by the parent too; a rank never shows CUDA's own error
            raise RuntimeError(
                f"rank {rank} needs cuda:{gpu}, but this machine has {torch.cuda.device_count()} CUDA GPU(s)"
            )
        torch.cuda.set_device(gpu)
        device, backend = torch.device("cuda", gpu), "nccl" if placement is Placement.RANKS else "gloo"
    else:
        device, backend = torch.device("cpu"), "gloo"
    timeout = timedelta(seconds=timeout_s)
    if placement is Placement.RANK_VIEW:
        from sharding_lab.engine import _torch_internals as internals

        backend = "fake"
        dist.init_process_group("fake", rank=rank, world_size=world_size, store=internals.fake_store())
    elif meeting is None:
        dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world_size, timeout=timeout)
    else:
        store = meeting.store(rank, world_size, timeout_s)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
    mesh = init_device_mesh(device_type, (world_size,), mesh_dim_names=("dp",))
    return device, backend, mesh


def _rank_main(
    rank, world_size, meeting, device_type, placement, timeout_s, fn, args, results, counts, labels, stack_dir,
    parent,
):
    ignore_sigint()
    die_with_parent(parent)
    # Stdout belongs to the parent (its --json output); a rank's prints go to stderr instead.
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    stack_file = open(Path(stack_dir) / f"rank{rank}.txt", "w")  # noqa: SIM115 - open for the process's life
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    try:
        device, backend, mesh = _init_rank(rank, world_size, rank, device_type, meeting, timeout_s, placement)
        ctx = RankContext(rank, world_size, rank, backend, device, mesh, counts, labels)
        ctx.mark("started")
        result = fn(ctx, *args)
        results.put((rank, "ok", result))
    except BaseException:
        results.put((rank, "error", _error_report()))
        sys.exit(1)
    # Tear down after reporting: a peer's failure must not turn a finished rank's result into an error.
    import torch.distributed as dist

    dist.destroy_process_group()


def _run_under_torchrun(fn, args, timeout_s: float) -> list[Any]:
    import torch
    import torch.distributed as dist

    rank, world_size, local_rank = (int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    device, backend, mesh = _init_rank(rank, world_size, local_rank, device_type, None, timeout_s)
    try:
        try:
            result = fn(RankContext(rank, world_size, local_rank, backend, device, mesh), *args)
        except Exception:  # this process is the rank: its error, reported as a spawned rank's would be
            raise _raised(rank, *_error_report()) from None
        return _exchange(result, rank, world_size, timeout_s)
    finally:
        dist.destroy_process_group()


_exchanges = itertools.count()  # every rank makes the same calls in the same order


def _exchange(obj: Any, rank: int, world_size: int, timeout_s: float) -> list[Any]:
    """Every rank's `obj`, in rank order, on every rank, through torchrun's store rather than a collective.

    A gloo collective's work can outlive the call on gloo's own thread, holding the Python tensors it
    moved. If the process exits first, that thread drops them while the interpreter shuts down and
    aborts the rank ("terminate called without an active exception", after the results were printed):
    3 of 8 launches of a 2-rank measure on torch 2.11, 1 of 6 on 2.13. The store moves bytes, no tensors.
    """
    import torch.distributed as dist

    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timedelta(seconds=timeout_s)
    )
    # torchrun's store outlives a restarted worker, whose count starts over: the attempt is in the key.
    prefix = f"sharding_lab/results/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{next(_exchanges)}/"
    store.set(f"{prefix}{rank}", pickle.dumps(obj))
    return [pickle.loads(store.get(f"{prefix}{peer}")) for peer in range(world_size)]


# --- the parent that spawns ranks -------------------------------------------------------------------


def _spawn_ranks(
    fn, world_size: int, args: tuple, device_type: str, placement: Placement, timeout_s: float, on_progress
) -> list[Any]:
    context = mp.get_context("spawn")
    results = context.Queue()
    processes_wanted = 1 if placement is Placement.RANK_VIEW else world_size
    counts = context.Array(ctypes.c_longlong, processes_wanted, lock=False)
    labels = context.Array(ctypes.c_char, processes_wanted * _LABEL_WIDTH, lock=False)
    meeting = Meeting.new(context)
    with tempfile.TemporaryDirectory(prefix="sharding-lab-") as stack_dir:
        processes = [
            context.Process(
                target=_rank_main,
                args=(
                    rank, world_size, meeting, device_type, placement, timeout_s, fn, args, results, counts,
                    labels, stack_dir, os.getpid(),
                ),
                name=f"sharding-lab-rank{rank}",
                daemon=True,  # terminated by multiprocessing when the parent exits normally
            )
            for rank in range(processes_wanted)
        ]
        try:
            start_ranks(processes)
            return _collect(processes, results, counts, labels, Path(stack_dir), timeout_s, on_progress)
        finally:
            _stop_all(processes)
            results.close()
            results.cancel_join_thread()


def _collect(processes, results, counts, labels, stack_dir: Path, timeout_s: float, on_progress) -> list[Any]:
    world_size = len(processes)
    done: dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s
    shown = ""
    marks, last_mark_at = sum(counts), time.monotonic()  # when any rank last recorded progress
    while len(done) < world_size:
        if on_progress and (label := _label(labels, 0)) != shown:
            on_progress(shown := label)
        if (now_marks := sum(counts)) != marks:
            marks, last_mark_at = now_marks, time.monotonic()
        try:
            rank, status, payload = results.get(timeout=0.2)
        except queue.Empty:
            rank, status, payload = -1, "waiting", None
        if status == "ok":
            done[rank] = payload
            continue
        errors = {rank: payload} if status == "error" else {}
        if errors or _died_silently(processes, done, errors):
            # Let the other ranks' reports (and a silent death's exit code) arrive before judging: a
            # rank that reported its result and then died tearing down is not a failure.
            _drain(results, processes, done, errors, grace_s=1.0)
            if errors or _died_silently(processes, done, errors):
                raise _root_cause(processes, done, errors)
        if time.monotonic() > deadline:
            _raise_hung(processes, done, counts, labels, stack_dir, timeout_s, time.monotonic() - last_mark_at)
    return [done[rank] for rank in range(world_size)]


def _died_silently(processes, done: dict, errors: dict) -> list[int]:
    """Ranks whose process ended badly without reporting anything (killed, or exited in C++)."""
    return [
        rank
        for rank, process in enumerate(processes)
        if rank not in done and rank not in errors and process.exitcode not in (None, 0)
    ]


def _drain(results, processes, done: dict, errors: dict, grace_s: float) -> None:
    """Collect what the other ranks report for a moment after the first failure."""
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if all(r in done or r in errors or p.exitcode is not None for r, p in enumerate(processes)):
            break
        try:
            rank, status, payload = results.get(timeout=0.1)
        except queue.Empty:
            continue
        (errors if status == "error" else done)[rank] = payload
    try:  # whatever is already queued
        while True:
            rank, status, payload = results.get_nowait()
            (errors if status == "error" else done)[rank] = payload
    except queue.Empty:
        pass


def _root_cause(processes, done: dict, errors: dict) -> RankFailed:
    """A rank that died without a word caused its peers' errors; otherwise the first error reported."""
    silent = _died_silently(processes, done, errors)
    if silent:
        rank = silent[0]
        code = processes[rank].exitcode
        how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
        if code == -signal.SIGKILL:
            how += ": SIGKILL, on Linux most often the kernel's out-of-memory killer"
        reason = f"process died without reporting ({how})"
        if errors:
            peer, (summary, trace) = next(iter(errors.items()))
            return RankFailed(rank, f"{reason}; rank {peer} then failed: {summary}", trace, details_of=peer)
        return RankFailed(rank, reason)
    rank, (summary, trace) = next(iter(errors.items()))
    return _raised(rank, summary, trace)


def _raised(rank: int, summary: str, trace: str) -> RankFailed:
    """Rank `rank` raised the exception `summary` names."""
    if summary.startswith("OutOfMemoryError"):
        summary += " (`sharding-lab plan` gives a configuration's peak per GPU without running it)"
    return RankFailed(rank, f"raised {summary}", trace)


def _label(labels, rank: int) -> str:
    """The last progress label rank `rank` recorded, "" before its first."""
    raw = bytes(labels[rank * _LABEL_WIDTH : (rank + 1) * _LABEL_WIDTH])
    return raw.rstrip(b"\0").decode(errors="replace")


def _raise_hung(processes, done, counts, labels, stack_dir: Path, timeout_s: float, quiet_s: float) -> None:
    unfinished = [rank for rank in range(len(processes)) if rank not in done]
    progress = {rank: (counts[rank], _label(labels, rank)) for rank in range(len(processes))}
    culprit, reason, details_name = timed_out(progress, unfinished, timeout_s, quiet_s)
    for rank in unfinished:
        if processes[rank].is_alive():
            os.kill(processes[rank].pid, signal.SIGUSR1)  # faulthandler dumps its Python stack
    time.sleep(0.5)
    stack_file = stack_dir / f"rank{culprit}.txt"  # absent if the rank had not yet reached its main
    stack = stack_file.read_text(errors="replace").strip() if stack_file.exists() else ""
    raise RankFailed(culprit, reason, stack, details_name)


def timed_out(progress: dict[int, tuple[int, str]], unfinished: list[int], timeout_s: float,
              quiet_s: float) -> tuple[int, str, str]:
    """(the rank to name, the reason, what its stack shows) for a run out of time, from each rank's
    (progress marks, last label) and the seconds since any rank last recorded progress."""
    # The rank that got least far is the one the others are waiting for.
    least = min(progress[rank][0] for rank in unfinished)
    laggards = [rank for rank in unfinished if progress[rank][0] == least]
    if not any(marks for marks, _ in progress.values()):
        # Not a hang in the run: the timeout, which covers start-up, ended before any rank was ready.
        return (laggards[0], f"did not start within {timeout_s:g} s: no rank had yet imported torch and joined the "
                "process group, which takes seconds; the timeout covers that start-up, so allow more (--timeout)",
                "Python stack when the time ran out")
    where = "; ".join(f"rank {r} at {progress[r][1] or '(not started)'!r}" for r in unfinished)
    who = "" if len(laggards) == 1 else f" (ranks {laggards} equally far; naming the first)"
    if quiet_s < min(SLOW_NOT_HUNG_S, timeout_s / 4):
        # Still recording progress when the time ran out: a large model on slow devices, not a hang.
        return (laggards[0], f"still running when the {timeout_s:g} s timeout ran out: a rank recorded progress "
                f"{quiet_s:.0f} s before, so the run is slow, not hung; allow it more time (--timeout){who}. "
                f"Progress: {where}.", "Python stack when the time ran out")
    return (laggards[0], f"hung: no progress for {quiet_s:.0f} s and no result within {timeout_s:g} s{who}. "
            f"Progress: {where}.", "Python stack when it was found hung")


def _stop_all(processes) -> None:
    processes = [p for p in processes if p.pid is not None]  # a start that raised left the rest unstarted
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join(timeout=3)
        if process.is_alive():
            process.kill()
            process.join()
