"""Warm ranks (sharding_lab.engine.pool): a pool is reused across batches (the same rank processes); a
rank that dies or hangs ends its batch with RankFailed, the pool is torn down with nothing left behind
and the next batch builds a fresh one; an idle pool ends by itself; labs of one call share a pool."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_lab_runs import wait_for
from test_sharding_launch import children_of_this_process, crash_in_rank_1, hang_in_rank_1, sum_of_ranks

from sharding_lab.engine.launch import RankFailed
from sharding_lab.engine.pool import Pools

pytestmark = pytest.mark.slow


@pytest.fixture
def before() -> list[str]:
    return children_of_this_process()


def new_children(before: list[str]) -> list[str]:
    return [command for command in children_of_this_process() if command not in before]


def killed_in_rank_1_mid_run(ctx):
    import torch
    import torch.distributed as dist

    ctx.mark("in the collective")
    if ctx.rank == 1:
        time.sleep(0.5)  # rank 0 is already waiting in the all-reduce
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(torch.ones(1))
    return ctx.rank


def pid_of(ctx):
    return os.getpid()


def test_a_pool_is_reused_across_batches_and_closing_it_leaves_nothing(before):
    with Pools(idle_timeout_s=None) as pools:
        first = pools.run(sum_of_ranks, 2, 10.0, timeout_s=120)
        pids = pools.pool(2).pids
        second = pools.run(sum_of_ranks, 2, 20.0, timeout_s=120)
        assert [r["sum"] for r in first] == [11.0, 11.0] and [r["sum"] for r in second] == [21.0, 21.0]
        assert pools.run(pid_of, 2, timeout_s=120) == pids, "the same rank processes ran every batch"
        assert pools.pool(2).batches == 3 and pools.rank_seconds > 0
    assert new_children(before) == []


def test_a_rank_killed_mid_run_ends_it_clearly_and_the_pool_is_rebuilt(before):
    with Pools(idle_timeout_s=None) as pools:
        old = pools.run(pid_of, 2, timeout_s=120)
        with pytest.raises(RankFailed) as failure:
            pools.run(killed_in_rank_1_mid_run, 2, timeout_s=120)
        assert failure.value.rank == 1 and "signal 9" in failure.value.reason
        assert pools.pool(2) is None and new_children(before) == [], "torn down: every rank gone"
        # Rank 1 left no traceback: the one saved is rank 0's, and the message says so.
        message = failure.value.for_user()
        saved = Path(message.rsplit(": ", 1)[1].rstrip(")"))
        try:
            assert "rank 0 then failed" in message and f"(rank 0's traceback: {saved})" in message, message
            assert saved.name.startswith("sharding-lab-rank0-") and "killed_in_rank_1_mid_run" in saved.read_text()
        finally:
            saved.unlink()
        with pytest.raises(RankFailed, match="injected crash"):
            pools.run(crash_in_rank_1, 2, timeout_s=120)
        assert new_children(before) == []
        new = pools.run(sum_of_ranks, 2, 1.0, timeout_s=120)
        assert [r["sum"] for r in new] == [2.0, 2.0]
        assert not set(pools.pool(2).pids) & set(old), "a fresh pool"
    assert new_children(before) == []


def test_a_rank_that_died_while_the_pool_was_idle_does_not_fail_the_next_batch(before, capfd):
    # The OOM killer or a `kill` between labs: the next lab used to fail, blamed for a death it never saw.
    with Pools(idle_timeout_s=None) as pools:
        old = pools.run(pid_of, 2, timeout_s=120)
        os.kill(old[1], signal.SIGKILL)
        wait_for(lambda: not pools.pool(2)._processes[1].is_alive(), 10, "rank 1 gone")
        assert [r["sum"] for r in pools.run(sum_of_ranks, 2, 1.0, timeout_s=120)] == [2.0, 2.0]
        assert not set(pools.pool(2).pids) & set(old), "a fresh pool ran it"
        assert "rank 1 of the warm 2-rank pool ended while idle (killed by signal 9)" in capfd.readouterr().err
    assert new_children(before) == []


def test_a_hung_rank_ends_the_batch_at_the_timeout_with_its_stack(before):
    with Pools(idle_timeout_s=None) as pools:
        pools.run(pid_of, 2, timeout_s=120)  # warm: the timeout below is the batch's alone
        started = time.monotonic()
        with pytest.raises(RankFailed) as failure:
            pools.run(hang_in_rank_1, 2, timeout_s=5)
        assert failure.value.rank == 1 and "hung" in failure.value.reason
        assert "hang_in_rank_1" in failure.value.details or "time.sleep" in failure.value.details
        assert time.monotonic() - started < 5 + 10
        assert pools.pool(2) is None and new_children(before) == []
    assert new_children(before) == []


def test_a_start_interrupted_between_ranks_raises_its_own_error_and_leaves_nothing(before, monkeypatch):
    # A SIGTERM can land while the pool starts its ranks: the first has started, the second never will.
    import multiprocessing.context

    from sharding_lab.engine.pool import RankPool

    real_start, starts = multiprocessing.context.SpawnProcess.start, []

    def start_then_interrupt(process):
        starts.append(process.name)
        if len(starts) == 2:
            raise SystemExit(143)
        real_start(process)

    monkeypatch.setattr(multiprocessing.context.SpawnProcess, "start", start_then_interrupt)
    pool = RankPool(2)
    with pytest.raises(SystemExit):  # not "can only join a started process" from the cleanup
        pool.start()
    assert len(starts) == 2 and not pool.started
    assert new_children(before) == []


def test_a_sigterm_during_a_graceful_close_still_ends_every_rank_and_removes_the_folder(before, monkeypatch):
    # The app killed outright: the lab server reads the end of its stdin and closes its pools while the
    # kernel's SIGTERM (its parent-death signal) lands, raising SystemExit in the wait for the ranks.
    import multiprocessing.context

    from sharding_lab.engine.pool import RankPool

    pool = RankPool(2)
    pool.run(pid_of, timeout_s=120)
    folder = Path(pool._stack_dir.name)
    real_join = multiprocessing.context.SpawnProcess.join

    def join_interrupted(process, timeout=None):
        monkeypatch.setattr(multiprocessing.context.SpawnProcess, "join", real_join)
        raise SystemExit(143)

    monkeypatch.setattr(multiprocessing.context.SpawnProcess, "join", join_interrupted)
    with pytest.raises(SystemExit):
        pool.close()
    assert new_children(before) == [] and not folder.exists() and not pool.started


def test_an_idle_pool_ends_by_itself(before):
    pools = Pools(idle_timeout_s=1.0)
    try:
        pools.run(pid_of, 2, timeout_s=120)
        assert len(new_children(before)) == 2
        deadline = time.monotonic() + 15
        while pools.pool(2) is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pools.pool(2) is None and new_children(before) == []
        assert len(pools.run(pid_of, 2, timeout_s=120)) == 2, "the next batch starts a fresh one"
    finally:
        pools.close()
    assert new_children(before) == []


def test_labs_share_the_pool_within_a_call_and_across_requests_to_the_lab_server(before):
    from sharding_lab.engine import lab_server

    labs = ["adam-optimizer-state", "zero-stages-model-states"]
    with Pools(idle_timeout_s=None) as pools:
        answers = [lab_server.answer(json.dumps({"lab": lab, "world_size": 2}), pools, 240) for lab in labs]
        assert [a["result"]["lab"] for a in answers] == labs, answers
        pids = pools.pool(2).pids
        assert lab_server.answer('{"lab": "nope", "world_size": 2}', pools, 240) == {"error": "unknown lab 'nope'"}
        from sharding_lab.engine.run_labs import run_labs

        timings: dict = {}
        both = run_labs(labs, 2, pools=pools, timings=timings)
        assert [run["lab"] for run in both] == labs and all(run["holds"] for run in both)
        assert pools.pool(2).pids == pids and timings["rank_s"] > 0
    # The server's own loop: a line per request, a line per answer, pools gone when stdin ends.
    out = io.StringIO()
    lab_server.serve(io.StringIO('{"lab": "adam-optimizer-state", "world_size": 2}\nnot json\n'), out, idle_timeout_s=None)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert lines[0]["result"]["lab"] == "adam-optimizer-state" and "bad request" in lines[1]["error"]
    assert new_children(before) == []


@pytest.mark.parametrize(("line", "says"), [
    ("{}", "no 'lab' or 'world_size'; send a JSON object such as"),
    ('{"lab": "adam-optimizer-state"}', "no 'world_size'"),
    ("[1, 2]", "list, not a JSON object"),
    ("not json", "not JSON"),
    ("[" * 5000 + "]" * 5000, "not JSON"),
])
def test_a_malformed_request_line_is_answered_with_what_to_send(line, says):
    from sharding_lab.engine import lab_server

    before = children_of_this_process()
    with Pools(idle_timeout_s=None) as pools:
        answer = lab_server.answer(line, pools, 240)
        assert children_of_this_process() == before  # refused before any rank started
    assert says in answer["error"] and "Traceback" not in answer["error"]


def test_a_hang_in_a_pool_warmed_with_the_same_timeout_names_the_hung_rank_not_its_peer(before):
    # As in `serve-labs`, where every batch has the same timeout: the healthy rank waiting in the
    # collective must not time out in gloo (and be blamed) before the hang check names rank 1.
    with Pools(idle_timeout_s=None) as pools:
        pools.run(pid_of, 2, timeout_s=15)
        with pytest.raises(RankFailed) as failure:
            pools.run(hang_in_rank_1, 2, timeout_s=15)
        assert failure.value.rank == 1 and "hung" in failure.value.reason, failure.value
        assert pools.pool(2) is None and new_children(before) == []
    assert new_children(before) == []


def test_stale_pool_folders_are_removed_only_when_their_owner_is_gone(tmp_path):
    from sharding_lab.pool_folders import remove_stale_folders

    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    unreaped = subprocess.Popen([sys.executable, "-c", "pass"])  # a zombie until the end: dead all the same
    os.waitid(os.P_PID, unreaped.pid, os.WEXITED | os.WNOWAIT)
    names = {
        f"sharding-lab-pool-{ended.pid}-abc": False,  # kept?
        f"sharding-lab-pool-{unreaped.pid}-abc": False,
        f"sharding-lab-pool-{os.getpid()}-abc": True,  # this process's own
        f"sharding-lab-pool-{os.getppid()}-abc": True,  # a live owner
        "sharding-lab-pool-x1y2z3ab": True,  # from before folders named their owner: cannot tell
        f"sharding-lab-{ended.pid}-abc": True,  # a plain launch's, not a pool's
    }
    for name in names:
        (tmp_path / name).mkdir()
        (tmp_path / name / "rank0.txt").write_text("")
    try:
        assert sorted(remove_stale_folders(str(tmp_path))) == sorted(name for name, kept in names.items() if not kept)
    finally:
        unreaped.wait()
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(name for name, kept in names.items() if kept)


def test_a_pool_whose_owner_is_pid_1_runs(tmp_path):
    # `sharding-lab run` as a container's entrypoint (pid 1): each rank took its parent's pid for "the parent
    # is gone" and exited 1 ("rank 0 failed: process died without reporting (exit code 1)").
    from test_lab_server import as_pid_1

    done = subprocess.run([*as_pid_1(), sys.executable, "-m", "sharding_lab.cli", "run", "adam-optimizer-state",
                           "--world-size", "2", "--json"], capture_output=True, text=True, timeout=240,
                          env={**os.environ, "TMPDIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1])["holds"] is True
