"""The launcher: ranks meet over gloo and return results in rank order; a rank that raises, dies or
hangs ends the whole run with RankFailed naming it, and no process is left behind."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from sharding_lab.engine.launch import RankFailed, run_ranks, sigterm_unwinds, timed_out

pytestmark = pytest.mark.slow


def children_of_this_process() -> list[str]:
    """Command lines of live (non-zombie) processes whose parent is this one, read from /proc.

    Python's multiprocessing resource tracker is left out: one per parent, shared by every launch,
    it exits with the parent and runs no rank.
    """
    me, found = os.getpid(), []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            command = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        state, parent = fields[0], int(fields[1])
        if parent == me and state != "Z" and "resource_tracker" not in command:
            found.append(command)
    return found


@pytest.fixture(autouse=True)
def children_before_the_test() -> list[str]:
    """Children that were already there (e.g. Playwright's driver from a browser test earlier in the session)."""
    return children_of_this_process()


def new_children(before: list[str]) -> list[str]:
    return [command for command in children_of_this_process() if command not in before]


# Rank functions live at module level: each rank is a fresh process that imports them by name.


def sum_of_ranks(ctx, offset):
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(ctx.rank)])
    dist.all_reduce(t, group=ctx.mesh.get_group())
    return {"rank": ctx.rank, "world_size": ctx.world_size, "mesh": ctx.mesh.size(), "sum": t.item() + offset,
            "backend": ctx.backend, "device": str(ctx.device)}


def crash_in_rank_1(ctx):
    import torch
    import torch.distributed as dist

    ctx.mark("before the collective")
    if ctx.rank == 1:
        raise RuntimeError("injected crash")
    dist.all_reduce(torch.ones(1))  # rank 0 waits here for a peer that will never come
    return ctx.rank


def hang_in_rank_1(ctx):
    import torch
    import torch.distributed as dist

    if ctx.rank == 1:
        time.sleep(3600)  # hung before it ever reaches the collective
    ctx.mark("waiting in all_reduce")
    dist.all_reduce(torch.ones(1))
    return ctx.rank


def killed_in_rank_1(ctx):
    import torch
    import torch.distributed as dist

    if ctx.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(torch.ones(1))
    return ctx.rank


def test_each_rank_runs_the_function_and_results_come_back_in_rank_order(children_before_the_test):
    results = run_ranks(sum_of_ranks, 2, 10.0, timeout_s=120)
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["world_size"] == r["mesh"] == 2 for r in results)
    assert [r["sum"] for r in results] == [11.0, 11.0]  # 0 + 1, through a real all-reduce
    assert {(r["backend"], r["device"]) for r in results} == {("gloo", "cpu")}
    assert new_children(children_before_the_test) == []


def test_a_crash_in_rank_1_ends_the_run_naming_rank_1(children_before_the_test):
    started = time.monotonic()
    with pytest.raises(RankFailed) as failure:
        run_ranks(crash_in_rank_1, 2, timeout_s=120)
    assert failure.value.rank == 1
    # The reason names the exception in one line; the traceback is kept aside for a developer.
    assert failure.value.reason == "raised RuntimeError: injected crash"
    assert "Traceback" in failure.value.details and "crash_in_rank_1" in failure.value.details
    assert time.monotonic() - started < 60  # not the timeout: the error ended it
    assert new_children(children_before_the_test) == []


def out_of_memory_in_rank_0(ctx):
    import torch
    import torch.distributed as dist

    if ctx.rank == 0:  # what the caching allocator raises when a GPU is full
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.\nSee the documentation.")
    dist.all_reduce(torch.ones(1))
    return ctx.rank


def test_a_rank_out_of_gpu_memory_is_named_with_where_to_find_the_peak(children_before_the_test):
    with pytest.raises(RankFailed) as failure:
        run_ranks(out_of_memory_in_rank_0, 2, timeout_s=120)
    assert failure.value.rank == 0
    assert failure.value.reason == (
        "raised OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
        "(`sharding-lab plan` gives a configuration's peak per GPU without running it)"
    )
    assert new_children(children_before_the_test) == []


def test_under_torchrun_a_rank_that_raises_is_reported_as_a_spawned_one_is(tmp_path):
    import socket
    import subprocess
    import sys

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # The environment torchrun gives its one rank of one: this process is rank 0, nothing is spawned.
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port), "PYTHONPATH": str(Path(__file__).parent)}
    script = (
        "from sharding_lab.engine.launch import RankFailed, run_ranks\n"
        "from test_sharding_launch import out_of_memory_in_rank_0\n"
        "try:\n"
        "    run_ranks(out_of_memory_in_rank_0, 1, timeout_s=60)\n"
        "except RankFailed as failure:\n"
        "    print(failure.rank, failure.reason, 'Traceback' in failure.details, sep='|')\n"
    )
    completed = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert completed.stdout.strip().split("|") == [
        "0",
        "raised OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
        "(`sharding-lab plan` gives a configuration's peak per GPU without running it)",
        "True",
    ], completed.stderr


def test_a_hang_in_rank_1_ends_the_run_at_the_timeout_naming_rank_1(children_before_the_test):
    started = time.monotonic()
    with pytest.raises(RankFailed) as failure:
        # The timeout covers start-up too (importing torch on a loaded 2-core machine takes seconds).
        run_ranks(hang_in_rank_1, 2, timeout_s=15)
    assert failure.value.rank == 1
    assert "hung" in failure.value.reason and "\n" not in failure.value.reason
    assert "time.sleep" in failure.value.details or "hang_in_rank_1" in failure.value.details  # its stack
    assert time.monotonic() - started < 15 + 15
    assert new_children(children_before_the_test) == []


def test_a_timeout_before_any_rank_started_says_so_and_a_hang_names_the_laggard():
    # Start-up takes seconds (torch's import, the process group), and the timeout covers it.
    rank, reason, _ = timed_out({0: (0, ""), 1: (0, "")}, [0, 1], 0.5, quiet_s=0.5)
    assert rank == 0 and reason.startswith("did not start within 0.5 s: no rank had yet imported torch")
    assert "timeout covers that start-up" in reason and "hung" not in reason
    # One rank started and the other did not, and nothing moved for 50 s: a hang, naming the one that
    # got least far.
    rank, reason, _ = timed_out({0: (3, "step 1 forward"), 1: (0, "")}, [0, 1], 60, quiet_s=50)
    assert rank == 1 and reason == ("hung: no progress for 50 s and no result within 60 s. Progress: rank 0 at "
                                    "'step 1 forward'; rank 1 at '(not started)'.")


def test_a_run_still_recording_progress_when_time_runs_out_is_called_slow_not_hung():
    # gpt2-small's labs on 2 CPU cores: both ranks in a backward 7 s after their last mark, at 600 s.
    progress = {0: (40, "zero1 (6/13): step 1 backward"), 1: (40, "zero1 (6/13): step 1 backward")}
    rank, reason, details = timed_out(progress, [0, 1], 600, quiet_s=7)
    assert rank == 0 and not reason.startswith("hung") and details == "Python stack when the time ran out"
    assert reason.startswith("still running when the 600 s timeout ran out: a rank recorded progress 7 s before, "
                             "so the run is slow, not hung; allow it more time (--timeout)")
    # A quiet spell of at least a minute, or of a quarter of the timeout, is a hang.
    assert timed_out(progress, [0, 1], 600, quiet_s=60)[1].startswith("hung: no progress for 60 s")
    assert timed_out(progress, [0, 1], 20, quiet_s=5)[1].startswith("hung: no progress for 5 s")
    assert timed_out(progress, [0, 1], 20, quiet_s=4)[1].startswith("still running")


def test_a_rank_killed_by_a_signal_is_named(children_before_the_test):
    with pytest.raises(RankFailed) as failure:
        run_ranks(killed_in_rank_1, 2, timeout_s=120)
    assert failure.value.rank == 1
    assert "signal 9" in failure.value.reason and "out-of-memory killer" in failure.value.reason
    assert new_children(children_before_the_test) == []


def launcher_with_two_hanging_ranks(tmp_path: Path, *, unwinding: bool, env: dict | None = None):
    """A parent process running `run_ranks(hang_in_rank_1, 2)` (inside `sigterm_unwinds` when
    `unwinding`), once both of its ranks are up: the parent and the ranks' pids."""
    import subprocess
    import sys

    script = tmp_path / "parent.py"
    run = "run_ranks(hang_in_rank_1, 2, timeout_s=600)"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from test_sharding_launch import hang_in_rank_1\n"
        "from sharding_lab.engine.launch import run_ranks, sigterm_unwinds\n"
        "if __name__ == '__main__':\n"
        + (f"    with sigterm_unwinds():\n        {run}\n" if unwinding else f"    {run}\n")
    )
    parent = subprocess.Popen([sys.executable, str(script)], stderr=subprocess.DEVNULL, env=env)
    ranks: list[int] = []
    deadline = time.monotonic() + 60
    while len(ranks) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
        ranks = [int(p.parent.name) for p in Path("/proc").glob("[0-9]*/stat")
                 if _parent_of(p) == parent.pid and "resource_tracker" not in _cmdline(p.parent)]
    assert len(ranks) == 2
    return parent, ranks


def test_ranks_die_with_a_parent_killed_without_cleanup(tmp_path):
    # A parent that starts two hanging ranks and is then SIGKILLed.
    parent, ranks = launcher_with_two_hanging_ranks(tmp_path, unwinding=False)
    parent.kill()
    parent.wait()
    time.sleep(1.0)
    survivors = [pid for pid in ranks if Path(f"/proc/{pid}").exists() and _state(pid) != "Z"]
    for pid in survivors:  # do not leave them running if the launcher failed to
        os.kill(pid, signal.SIGKILL)
    assert survivors == []


def test_a_sigtermed_launcher_stops_its_ranks_and_removes_its_files(tmp_path):
    temp = tmp_path / "tmp"
    temp.mkdir()
    semaphores = shared_semaphores()
    parent, ranks = launcher_with_two_hanging_ranks(tmp_path, unwinding=True, env={**os.environ, "TMPDIR": str(temp)})
    assert [path.name for path in temp.iterdir() if path.name.startswith("sharding-lab-")], "the ranks' folder"
    parent.terminate()
    assert parent.wait(20) == 143, "SystemExit(128 + SIGTERM): it unwound"
    assert all(_state(pid) in ("gone", "Z") for pid in ranks)
    assert [path.name for path in temp.iterdir() if path.name.startswith("sharding-lab-")] == []
    assert shared_semaphores() - semaphores == set()


def test_sigterm_unwinds_only_where_it_may_and_puts_the_handler_back(monkeypatch):
    before = signal.getsignal(signal.SIGTERM)
    with sigterm_unwinds():
        during = signal.getsignal(signal.SIGTERM)
        with pytest.raises(SystemExit) as exit_info:
            during(signal.SIGTERM, None)
    assert exit_info.value.code == 143 and during is not before
    assert signal.getsignal(signal.SIGTERM) is before
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    with sigterm_unwinds():  # a torchrun rank: its agent's SIGTERM keeps its default meaning
        assert signal.getsignal(signal.SIGTERM) is before


def shared_semaphores() -> set[str]:
    """Python's named semaphores (multiprocessing's queues and locks), which a SIGKILLed launcher leaves."""
    return {name for name in os.listdir("/dev/shm") if name.startswith("sem.")} if os.path.isdir("/dev/shm") else set()


def _parent_of(stat: Path) -> int | None:
    try:
        return int(stat.read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError):
        return None


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def test_a_rank_that_cannot_start_raises_its_own_error_and_leaves_no_process(children_before_the_test):
    """`fn` must be importable by name: a lambda cannot be pickled for a fresh process, so the first
    start raises, and the ranks after it were never started. That error must come out, not one from
    stopping processes that never ran ("can only join a started process")."""
    with pytest.raises(Exception) as raised:
        run_ranks(lambda ctx: ctx.rank, 2, timeout_s=30)
    assert not isinstance(raised.value, AssertionError), raised.value
    assert "pickle" in f"{type(raised.value).__name__} {raised.value}".lower(), raised.value
    assert children_of_this_process() == children_before_the_test


def test_a_launcher_that_is_pid_1_runs_its_ranks(tmp_path):
    # `sharding-lab measure` as a container's entrypoint (pid 1): each rank took its parent's pid for "the
    # parent is gone" and exited 1 before it started ("process died without reporting (exit code 1)").
    import json
    import subprocess
    import sys

    from test_lab_server import as_pid_1

    done = subprocess.run([*as_pid_1(), sys.executable, "-m", "sharding_lab.cli", "measure", "--strategy", "zero2",
                           "--world-size", "2", "--json"], capture_output=True, text=True, timeout=240,
                          env={**os.environ, "TMPDIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["config"]["world_size"] == 2


def test_ranks_meet_at_the_port_rank_0s_store_bound_and_a_late_rank_0_is_named():
    # No port is picked ahead of the bind (another process could take it meanwhile): rank 0's store
    # binds one the OS gives it and publishes it; a peer connects there and sees what rank 0 wrote.
    import multiprocessing

    from sharding_lab.engine.launch import Meeting

    meeting = Meeting.new(multiprocessing.get_context("spawn"))
    assert meeting.port.value == 0
    owner = meeting.store(0, 2, timeout_s=10)
    assert meeting.port.value == owner.port > 0
    owner.set("from-rank-0", b"hello")
    assert meeting.store(1, 2, timeout_s=10).get("from-rank-0") == b"hello"

    unopened = Meeting.new(multiprocessing.get_context("spawn"))
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="rank 0 did not open the ranks' store within 0.3 s"):
        unopened.store(1, 2, timeout_s=0.3)
    assert 0.3 <= time.monotonic() - started < 5
