"""How the app stops a lab process (studyapp.lab_runs.process.stop_group): SIGTERM first, so the lab
can tear down its ranks and files, then SIGKILL for whatever is left of its process group. Runs small
stand-in processes; tests/test_lab_server.py holds the real `sharding-lab serve-labs` to the same."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_lab_runs import process_gone, wait_for

from studyapp.lab_runs.process import exited, stop_group

pytestmark = pytest.mark.slow  # starts processes

# A lab stand-in: it starts a grandchild (like its ranks), says it is ready, and on SIGTERM writes
# `cleaned` before it exits, as the lab CLI removes its files; with "ignore" it shrugs SIGTERM off.
STAND_IN = """
import signal, subprocess, sys, time
mode, marker = sys.argv[1], sys.argv[2]
grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
def on_term(signum, frame):
    if mode == "ignore":
        return
    open(marker, "w").write(f"cleaned {grandchild.pid}")
    grandchild.kill()
    sys.exit(143)
signal.signal(signal.SIGTERM, on_term)
print(grandchild.pid, flush=True)
while True:
    time.sleep(0.05)
"""


def stand_in(mode: str, marker: Path) -> tuple[subprocess.Popen, int]:
    process = subprocess.Popen([sys.executable, "-c", STAND_IN, mode, str(marker)], stdout=subprocess.PIPE,
                               text=True, start_new_session=True)
    return process, int(process.stdout.readline())


def test_a_process_that_answers_sigterm_cleans_up_before_anything_is_killed(tmp_path):
    marker = tmp_path / "marker"
    process, grandchild = stand_in("clean", marker)
    stop_group(process, grace_s=10)
    assert process.wait(5) == 143, "it exited through its own handler"
    assert marker.read_text() == f"cleaned {grandchild}", "its own cleanup ran"
    wait_for(lambda: process_gone(grandchild), 10, "the grandchild gone")


def test_one_that_ignores_sigterm_is_killed_with_its_group_after_the_grace(tmp_path):
    marker = tmp_path / "marker"
    process, grandchild = stand_in("ignore", marker)
    started = time.monotonic()
    stop_group(process, grace_s=1.0)
    waited = time.monotonic() - started
    assert process.wait(5) == -9, "SIGKILLed"
    assert waited >= 1.0, f"it had its grace first (stopped after {waited:.2f} s)"
    assert not marker.exists()
    wait_for(lambda: process_gone(grandchild), 10, "the grandchild killed with the group")


# multiprocessing's resource tracker, as a lab's group holds it: it reads a pipe from the lab and, at its
# end (the lab has exited, however), cleans up what the lab left (unlinks its semaphores), then exits.
TRACKER = """
import subprocess, sys, time
marker = sys.argv[1]
tracker = subprocess.Popen([sys.executable, "-c",
    "import sys, time; sys.stdin.read(); time.sleep(0.5); open(sys.argv[1], 'w').write('unlinked')", marker],
    stdin=subprocess.PIPE)
print(tracker.pid, flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_what_is_left_of_a_group_may_finish_its_clean_up_after_the_leader_exits(tmp_path, how):
    # The SIGKILLed lab server's test once found semaphores left in /dev/shm after 30 s. One way: a stop that
    # finds the killed server still ending SIGTERMs it, and the group's SIGKILL came the moment it exited,
    # taking its resource tracker with it before the tracker had unlinked them. This holds that window.
    marker = tmp_path / "unlinked"
    process = subprocess.Popen([sys.executable, "-c", TRACKER, str(marker)], stdout=subprocess.PIPE, text=True,
                               start_new_session=True)
    tracker = int(process.stdout.readline())
    if how == "sigkill":  # killed outright before the stop (the OOM killer): it has exited when stopped
        os.kill(process.pid, signal.SIGKILL)
        assert exited(process, 10)
    stop_group(process, grace_s=10)
    assert process.wait(5) == (-signal.SIGTERM if how == "sigterm" else -signal.SIGKILL)
    assert marker.read_text() == "unlinked", "the tracker's clean-up ran"
    assert process_gone(tracker), "and it left by itself"


def test_a_process_that_has_exited_is_not_signalled_and_stays_unreaped_until_waited():
    process = subprocess.Popen([sys.executable, "-c", "raise SystemExit(7)"], start_new_session=True)
    assert exited(process, 30.0)
    assert process.returncode is None  # a zombie still: its group id cannot be reused yet
    assert os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    stop_group(process, grace_s=10)
    assert process.wait(5) == 7, "no SIGTERM reached a process that had already exited"


def test_exited_gives_up_after_its_timeout_on_a_running_process():
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        started = time.monotonic()
        assert not exited(process, 0.3)
        assert 0.3 <= time.monotonic() - started < 5
    finally:
        stop_group(process, grace_s=0)
        process.wait(5)


# The app's side: run_json_process in a stand-in server, which the test then kills outright.
SERVER = """
import sys
from studyapp.lab_runs.process import run_json_process
stand_in, marker = sys.argv[1], sys.argv[2]
run_json_process([sys.executable, "-c", stand_in, "clean", marker], 120,
                 on_start=lambda process: print(process.pid, flush=True), stopped="stopped", no_json="no JSON")
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_lab_process_ends_with_a_server_killed_outright(tmp_path):
    # It ran on, orphaned, beside the next server's runs, and that server called it stopped.
    marker = tmp_path / "cleaned"
    server = subprocess.Popen([sys.executable, "-c", SERVER, STAND_IN, str(marker)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
    lab = int(server.stdout.readline())

    def the_lab_answers_sigterm() -> bool:  # exec'd from the guard into the stand-in, its handler set
        status = Path(f"/proc/{lab}/status").read_text()
        caught = int(next(line for line in status.splitlines() if line.startswith("SigCgt:")).split()[1], 16)
        return bool(caught & (1 << (signal.SIGTERM - 1)))

    try:
        wait_for(the_lab_answers_sigterm, 30, "the lab process to start")
        server.kill()
        server.wait()
        wait_for(lambda: marker.is_file() and marker.read_text().startswith("cleaned"), 10, "the lab's SIGTERM clean-up")
        wait_for(lambda: process_gone(lab), 10, "the lab process to end")
    finally:  # failing, leave nothing running: the lab leads its own process group
        with contextlib.suppress(ProcessLookupError):
            os.killpg(lab, signal.SIGKILL)
