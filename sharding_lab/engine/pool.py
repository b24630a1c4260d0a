"""Warm ranks: a pool of rank processes per world size, kept alive between runs.

Starting a rank costs a process, `import torch` and a process group: seconds on a small machine, more
than a lab's own training steps. `RankPool` starts `world_size` ranks once (torch imported, process
group up, the same `RankContext` as `launch.run_ranks`) and hands them one batch after another;
`Pools` keeps one pool per (world size, device, placement), starts each lazily on its first batch and
ends a pool that sat idle longer than `idle_timeout_s`.

Crash and hang handling is `launch.py`'s: a rank that raises, dies or stops making progress ends the
batch with `RankFailed` naming it (its Python stack for a hang), and the whole pool is torn down, every
process gone, before the error reaches the caller; the next batch starts a fresh pool (as it does when a
rank was found dead before a batch: killed while idle, which is no batch's failure). Ranks die with
the process that owns the pool, even when it is killed with SIGKILL. Nothing of the owner runs then, so its
pool's folder (`sharding-lab-pool-<owner pid>-*` in the temporary directory) stays: the next pool to start,
in any process, removes those whose owner is gone.

Batch functions follow `run_ranks`' rule: module-level, importable by name, `fn(ctx, *args)`. Each rank
reports its result and the seconds it spent in `fn` (`RankPool.last_rank_seconds`: the slowest rank's).
"""

from __future__ import annotations

import ctypes
import faulthandler
import gc
import multiprocessing as mp
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sharding_lab.engine import launch
from sharding_lab.engine.launch import RankContext
from sharding_lab.parent_death import die_with_parent
from sharding_lab.pool_folders import FOLDER_PREFIX, remove_stale_folders
from sharding_lab.run_config import Placement

IDLE_TIMEOUT_S = 300.0  # a pool holds one torch per rank in memory; five quiet minutes and it goes
# A warm rank's collective starts with its batch, so a process group timing out with the batch raised
# gloo's timeout in the healthy rank before the hang check named the rank that stopped: it outlasts it.
GROUP_TIMEOUT_MARGIN_S = 30.0
_STOP = None  # the task that ends a rank's loop


class RankPool:
    """`world_size` rank processes with the process group up, running one batch at a time."""

    def __init__(self, world_size: int, *, device: str = "cpu", placement: Placement = Placement.RANKS,
                 group_timeout_s: float = 600.0):
        if placement is Placement.AUTO:
            raise ValueError("resolve Placement.AUTO first (run_config.resolve_placement)")
        self.world_size, self.device, self.placement = world_size, device, placement
        self.group_timeout_s = group_timeout_s  # the process group's own timeout for a collective
        self.last_used = time.monotonic()
        self.last_rank_seconds = 0.0
        self.batches = 0
        self._processes: list = []
        self._tasks: list = []

    @property
    def started(self) -> bool:
        return bool(self._processes)

    @property
    def pids(self) -> list[int]:
        return [process.pid for process in self._processes]

    def start(self) -> None:
        context = mp.get_context("spawn")
        processes_wanted = 1 if self.placement is Placement.RANK_VIEW else self.world_size
        self._results = context.Queue()
        self._tasks = [context.SimpleQueue() for _ in range(processes_wanted)]
        self._counts = context.Array(ctypes.c_longlong, processes_wanted, lock=False)
        self._labels = context.Array(ctypes.c_char, processes_wanted * launch._LABEL_WIDTH, lock=False)
        remove_stale_folders()
        self._stack_dir = tempfile.TemporaryDirectory(prefix=f"{FOLDER_PREFIX}{os.getpid()}-")
        meeting = launch.Meeting.new(context)
        self._processes = [
            context.Process(
                target=_pool_rank_main,
                args=(rank, self.world_size, meeting, self.device, self.placement, self.group_timeout_s,
                      self._tasks[rank], self._results, self._counts, self._labels, self._stack_dir.name,
                      os.getpid()),
                name=f"sharding-lab-pool{self.world_size}-rank{rank}",
                daemon=True,
            )
            for rank in range(processes_wanted)
        ]
        try:
            launch.start_ranks(self._processes)
        except BaseException:
            self.close()
            raise

    def run(self, fn: Callable[..., Any], *args: Any, timeout_s: float = 600.0,
            on_progress: Callable[[str], None] | None = None) -> list[Any]:
        """`fn(ctx, *args)` on every rank; their results in rank order (rank 0's only in a rank view).
        A failure or hang raises `RankFailed` after the pool is torn down."""
        if self.started and (ended := [rank for rank, process in enumerate(self._processes) if not process.is_alive()]):
            # Killed while idle (the OOM killer, a `kill`): not this batch's failure, so a fresh pool runs it.
            code = self._processes[ended[0]].exitcode
            how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
            print(f"sharding-lab: rank {ended[0]} of the warm {self.world_size}-rank pool ended while idle ({how}); "
                  "starting a fresh pool", file=sys.stderr)
            self.close(graceful=False)
        if not self.started:
            self.start()
        try:
            for task in self._tasks:
                task.put((fn, args))
            reports = launch._collect(self._processes, self._results, self._counts, self._labels,
                                      Path(self._stack_dir.name), timeout_s, on_progress)
        except BaseException:
            self.close(graceful=False)
            raise
        self.batches += 1
        self.last_used = time.monotonic()
        self.last_rank_seconds = max(seconds for _, seconds in reports)
        return [result for result, _ in reports]

    def close(self, *, graceful: bool = True) -> None:
        """Stop every rank (asked first when `graceful`, then terminated, then killed) and remove what
        the pool made."""
        if not self._processes:
            return
        for process, task in zip(self._processes, self._tasks, strict=True):
            if graceful and process.is_alive():
                try:
                    task.put(_STOP)
                except (OSError, ValueError):
                    pass
        try:
            deadline = time.monotonic() + (3.0 if graceful else 0.0)
            for process in self._processes:
                if process.pid is not None:  # a start that raised (a SIGTERM, say) left the rest unstarted
                    process.join(timeout=max(0.0, deadline - time.monotonic()))
        finally:  # a SIGTERM landing in the wait above (the parent died as stdin ended) still ends the ranks
            launch._stop_all(self._processes)
            self._results.close()
            self._results.cancel_join_thread()
            self._stack_dir.cleanup()
            self._processes, self._tasks = [], []


class Pools:
    """One `RankPool` per (world size, device, placement), started on first use and ended when idle.

    A watcher thread ends pools idle for `idle_timeout_s` (None: never; `close()` ends them all).
    Use as a context manager or call `close()`: no rank outlives it.
    """

    def __init__(self, idle_timeout_s: float | None = IDLE_TIMEOUT_S):
        self.idle_timeout_s = idle_timeout_s
        self.rank_seconds = 0.0  # seconds the ranks spent in batch functions (slowest rank), all pools
        self._pools: dict[tuple, RankPool] = {}
        self._lock = threading.Lock()  # held while a pool runs a batch, and while the watcher looks
        self._closed = threading.Event()
        self._watcher: threading.Thread | None = None
        if idle_timeout_s is not None:
            self._watcher = threading.Thread(target=self._watch, name="sharding-lab-pools-idle", daemon=True)
            self._watcher.start()

    def __enter__(self) -> Pools:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def pool(self, world_size: int, device: str = "cpu", placement: Placement = Placement.RANKS) -> RankPool | None:
        """The pool for these ranks if one is up (for inspection); None otherwise."""
        return self._pools.get((world_size, device, placement))

    def run(self, fn: Callable[..., Any], world_size: int, *args: Any, device: str = "cpu",
            placement: Placement = Placement.RANKS, timeout_s: float = 600.0,
            on_progress: Callable[[str], None] | None = None) -> list[Any]:
        """`launch.run_ranks`, on the warm pool for these ranks: started if none is up (or the last one
        failed), torn down when a rank fails or hangs."""
        key = (world_size, device, placement)
        with self._lock:
            if self._closed.is_set():
                raise RuntimeError("these pools are closed")
            pool = self._pools.get(key)
            if pool is None or not pool.started:
                pool = self._pools[key] = RankPool(world_size, device=device, placement=placement,
                                                   group_timeout_s=timeout_s + GROUP_TIMEOUT_MARGIN_S)
            try:
                results = pool.run(fn, *args, timeout_s=timeout_s, on_progress=on_progress)
            except BaseException:
                self._pools.pop(key, None)  # torn down by run(); the next batch builds a fresh one
                raise
            self.rank_seconds += pool.last_rank_seconds
            return results

    def close_idle(self, idle_s: float) -> int:
        """End the pools that ran nothing for `idle_s` seconds; how many were ended."""
        with self._lock:
            now = time.monotonic()
            idle = [key for key, pool in self._pools.items() if now - pool.last_used >= idle_s]
            for key in idle:
                self._pools[key].close()
                del self._pools[key]
            return len(idle)

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            for pool in self._pools.values():
                pool.close()
            self._pools.clear()

    def _watch(self) -> None:
        interval = min(max(self.idle_timeout_s / 4, 0.05), 5.0)
        while not self._closed.wait(interval):
            self.close_idle(self.idle_timeout_s)


# --- inside a rank ----------------------------------------------------------------------------------


def _freeze_heap() -> None:
    """Collect, then move every surviving object out of the collector's sight (gc.freeze).

    torch's import leaves about a million objects; a full collection walks them all (0.14 s each on a
    small CPU), and measure.py collects before and after every configuration. Frozen, they are skipped:
    a collection then walks only what the batch made. Runs between batches, off the clock."""
    gc.collect()
    gc.freeze()


def _pool_rank_main(rank, world_size, meeting, device_type, placement, group_timeout_s, tasks, results,
                    counts, labels, stack_dir, owner):
    launch.ignore_sigint()  # a Ctrl-C is the owner's to handle: it stops this rank
    die_with_parent(owner)
    os.dup2(2, 1)  # stdout belongs to the parent (its --json output or its protocol)
    sys.stdout = sys.stderr
    stack_file = open(Path(stack_dir) / f"rank{rank}.txt", "w")  # noqa: SIM115 - open for the process's life
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    try:
        device, backend, mesh = launch._init_rank(
            rank, world_size, rank, device_type, meeting, group_timeout_s, placement
        )
        ctx = RankContext(rank, world_size, rank, backend, device, mesh, counts, labels)
        ctx.mark("started")
    except BaseException:
        results.put((rank, "error", launch._error_report()))
        sys.exit(1)
    _freeze_heap()
    while (task := tasks.get()) is not _STOP:
        fn, args = task
        try:
            started = time.perf_counter()
            result = fn(ctx, *args)
            results.put((rank, "ok", (result, time.perf_counter() - started)))
        except BaseException:
            results.put((rank, "error", launch._error_report()))
            sys.exit(1)
        ctx.mark("idle")
        _freeze_heap()  # what the batch imported (FSDP, the trackers) stays; its garbage is gone
    import torch.distributed as dist

    dist.destroy_process_group()
