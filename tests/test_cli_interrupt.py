"""Ctrl-C in a `sharding-lab` command, as a terminal sends it: SIGINT to the whole foreground process
group, the ranks included. The command says so in one line and exits with status 130 (128 + SIGINT, as
SIGTERM gives 143); the ranks, stopped by their parent, print nothing; nothing is left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # starts the CLI and its ranks

REPO = Path(__file__).resolve().parent.parent
INTERRUPTED = "interrupted; every rank stopped"


def rank_pids(parent: int) -> list[int]:
    """The parent's rank processes: its spawned children, not multiprocessing's resource tracker."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            command = (stat.parent / "cmdline").read_bytes().decode(errors="replace")
        except (OSError, IndexError):
            continue
        if int(fields[1]) == parent and fields[0] != "Z" and "spawn_main" in command:
            found.append(int(stat.parent.name))
    return sorted(found)


def running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_for(condition, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while not (found := condition()):
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        time.sleep(0.05)
    return found


def shared_semaphores() -> set[str]:
    return {name for name in os.listdir("/dev/shm") if name.startswith("sem.")} if os.path.isdir("/dev/shm") else set()


def in_process_group(pid: int) -> bool:
    """Whether a rank holds a socket: its process group's store, so torch is imported and the group up
    (the parent's queues are pipes). A lab's batch follows at once: seconds, on a 2-core machine."""
    try:
        return any(os.readlink(fd).startswith("socket:") for fd in Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return False


# (the command after `sharding-lab`, when to press Ctrl-C). "starting": as soon as the ranks' processes
# exist, while they still import; "running": once every rank's process group is up, in the batch;
# "idle": warm pool ranks waiting between batches (the lab server after one answer, as `run --all`'s
# pools between world sizes).
CASES = {
    "measure starting": (["measure", "--strategy", "zero3", "--world-size", "2"], "starting"),
    "measure running": (["measure", "--strategy", "zero3", "--world-size", "2"], "running"),
    "run running": (["run", "what-fsdp-shards", "--export", "{tmp}/lab-results.json"], "running"),
    "serve-labs idle": (["serve-labs"], "idle"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_ctrl_c_prints_one_line_exits_130_and_leaves_no_rank_or_file(case, tmp_path):
    argv, when = CASES[case]
    argv = [arg.format(tmp=tmp_path) for arg in argv]
    temp = tmp_path / "tmp"
    temp.mkdir()
    semaphores = shared_semaphores()
    env = {**os.environ, "TMPDIR": str(temp), "PYTHONWARNINGS": "ignore"}  # torch's import warnings aside
    command = subprocess.Popen(
        [sys.executable, "-m", "sharding_lab.cli", *argv], cwd=REPO, env=env, text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    try:
        if when == "idle":
            command.stdin.write(json.dumps({"lab": "what-fsdp-shards", "world_size": 2}) + "\n")
            command.stdin.flush()
            assert "result" in json.loads(command.stdout.readline()), "the lab ran; its pool is now idle"
        ranks = wait_for(lambda: len(pids := rank_pids(command.pid)) == 2 and pids, 120, "two ranks")
        if when == "running":
            wait_for(lambda: all(map(in_process_group, ranks)), 120, "both ranks in their process group")
        assert command.poll() is None, "interrupted before it finished"
        os.killpg(command.pid, signal.SIGINT)  # as Ctrl-C: to every process of the group
        out, err = command.communicate(timeout=60)
    finally:
        if command.poll() is None:
            os.killpg(command.pid, signal.SIGKILL)
            command.wait()
    assert (command.returncode, err) == (130, f"sharding-lab {argv[0]}: {INTERRUPTED}\n")  # no Traceback
    assert out == ""
    wait_for(lambda: not any(map(running, ranks)), 10, "every rank gone")
    assert [path.name for path in temp.iterdir() if path.name.startswith("sharding-lab")] == []
    assert list(tmp_path.glob("*lab-results.json*")) == [], "no export, whole or partial"
    wait_for(lambda: shared_semaphores() - semaphores == set(), 10, "its semaphores unlinked")


def test_a_second_ctrl_c_while_the_first_unwinds_is_ignored_and_the_handler_comes_back():
    from sharding_lab.engine.launch import sigint_unwinds

    before = signal.getsignal(signal.SIGINT)
    with sigint_unwinds():
        handler = signal.getsignal(signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):
            handler(signal.SIGINT, None)
        handler(signal.SIGINT, None)  # an impatient second Ctrl-C: the ranks are still being stopped
    assert signal.getsignal(signal.SIGINT) is before
