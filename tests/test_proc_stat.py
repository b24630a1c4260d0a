"""/proc/<pid>/stat read as the state and group `ps` shows."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from live_server import wait_for

from sharding_lab.proc_stat import ProcessStat, every_process, own_threads, read_stat

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux's /proc")


def _ps(pid: int, field: str) -> str:
    return subprocess.run(["ps", "-o", f"{field}=", "-p", str(pid)], capture_output=True, text=True).stdout.strip()


def _once_asleep(pid: int) -> ProcessStat:
    """The child's stat once it has reached its sleep: on a loaded machine it may still be running ("R") or
    loading its program ("D")."""
    return wait_for(lambda: (stat := read_stat(pid)) is not None and stat.state == "S" and stat, 30, "the child asleep")


def test_a_sleeping_child_has_the_state_and_group_ps_gives():
    child = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        stat = _once_asleep(child.pid)
        assert stat is not None and stat.live
        assert stat.state == _ps(child.pid, "stat")[0] == "S"
        assert stat.group == int(_ps(child.pid, "pgid")) == child.pid  # a new session leads its own group
    finally:
        child.kill()
        child.wait()


def test_a_command_name_holding_a_parenthesis_and_spaces_is_read_past():
    # A process may rename only itself: this one takes a name that mimics the fields after it.
    script = "import pathlib, sys, time; pathlib.Path('/proc/self/comm').write_text('x) Z 1 2'); print(flush=True); time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    try:
        child.stdout.readline()
        assert Path(f"/proc/{child.pid}/comm").read_text() == "x) Z 1 2\n"
        stat = _once_asleep(child.pid)  # a naive parse would read the state as "Z"
        assert stat is not None and stat.state == "S" and stat.group == os.getpgrp()
    finally:
        child.kill()
        child.wait()


def test_an_ended_unreaped_child_is_a_zombie_and_a_reaped_one_is_gone():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while (stat := read_stat(child.pid)) is not None and stat.live and time.monotonic() < deadline:
        time.sleep(0.02)
    assert stat is not None and stat.state == "Z" and not stat.live
    child.wait()
    assert read_stat(child.pid) is None


def test_every_process_includes_this_one_with_its_group():
    mine = [stat for stat in every_process() if stat.pid == os.getpid()]
    assert len(mine) == 1 and mine[0].group == os.getpgrp() and mine[0].state == "R"


def test_this_processs_threads_are_found_by_name_as_ps_lists_them_and_each_reads_back():
    release = threading.Event()
    waiters = [threading.Thread(target=release.wait) for _ in range(2)]
    for waiter in waiters:
        waiter.start()
    try:
        for waiter in waiters:  # the name the kernel shows, as torch's C++ threads set theirs
            Path(f"/proc/self/task/{waiter.native_id}/comm").write_text("lab-test-wait")
        listed = subprocess.run(["ps", "-L", "-o", "tid=,comm=", "-p", str(os.getpid())],
                                capture_output=True, text=True).stdout.split("\n")
        named = sorted(int(line.split()[0]) for line in listed if line.split()[1:] == ["lab-test-wait"])
        assert sorted(own_threads("lab-test-wait")) == named == sorted(w.native_id for w in waiters)
        assert own_threads("no-such-thread") == []
        asleep = wait_for(lambda: all((s := read_stat(w.native_id)) and s.state == "S" for w in waiters), 30, "asleep")
        assert asleep
    finally:
        release.set()
        for waiter in waiters:
            waiter.join()


def test_without_proc_there_is_no_process_to_read(monkeypatch, tmp_path):
    # As on macOS: no /proc, so nothing can be read, and nothing raises.
    monkeypatch.setattr("sharding_lab.proc_stat.PROC", tmp_path / "no-proc")
    assert every_process() == [] and read_stat(os.getpid()) is None and own_threads("python") == []
