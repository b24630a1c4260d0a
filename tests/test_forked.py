"""One call in a forked child: its result, its error, its death and its output, as the parent sees them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sharding_lab.engine import forked


def test_the_result_comes_back_from_another_process():
    child = forked.start(lambda: (os.getpid(), list(range(5))))
    pid, numbers = child.result("the call")
    assert pid == child.pid != os.getpid()
    assert numbers == [0, 1, 2, 3, 4]


def test_a_result_larger_than_the_pipe_holds_comes_back_whole():
    payload = os.urandom(8 * 2**20)  # a pipe holds 64 KiB: the child blocks until the parent reads
    child = forked.start(lambda: payload)
    assert child.result("the call") == payload


class _Unpicklable(Exception):
    def __reduce__(self):
        raise TypeError("not this one")


def test_the_childs_error_is_raised_again_in_the_parent():
    def fail():
        raise ValueError("a bad shape")

    with pytest.raises(ValueError, match="a bad shape"):
        forked.start(fail).result("the call")


def test_an_error_that_does_not_pickle_comes_back_as_its_text():
    def fail():
        raise _Unpicklable("odd")

    with pytest.raises(forked.ForkedCallFailed, match=r"the 4-block run failed: _Unpicklable: odd"):
        forked.start(fail).result("the 4-block run")


def test_a_child_killed_before_answering_is_named_with_its_signal():
    def die():
        os.kill(os.getpid(), signal.SIGKILL)

    with pytest.raises(forked.ForkedCallFailed, match="the call ended without an answer .killed by SIGKILL."):
        forked.start(die).result("the call")


def test_output_buffered_before_the_fork_is_written_once():
    # A pipe makes Python's stdout block-buffered: without a flush before the fork, "before" sits in both
    # processes' buffers and is written twice; without one before the child's os._exit, "child" is lost.
    script = (
        "import sys; from sharding_lab.engine import forked; print('before', end=''); "
        "forked.start(lambda: print('child', end='')).result('the call')"
    )
    completed = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True,
        env={**{k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"},
             "PYTHONPATH": str(Path(__file__).resolve().parents[1])}, cwd="/",
    )
    assert completed.stdout == "beforechild"


def test_an_abandoned_child_is_killed_and_reaped():
    child = forked.start(lambda: time.sleep(60))
    started = time.monotonic()
    child.abandon()
    assert time.monotonic() - started < 10
    with pytest.raises(ChildProcessError):  # reaped: there is nothing left to wait for
        os.waitpid(child.pid, 0)


def test_a_caller_interrupted_while_waiting_takes_the_child_with_it():
    def interrupt(*_):
        raise KeyboardInterrupt

    child = forked.start(lambda: time.sleep(60))
    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.3)  # arrives while result() reads the pipe
    try:
        with pytest.raises(KeyboardInterrupt):
            child.result("the call")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    with pytest.raises(ChildProcessError):  # killed and reaped, not left sleeping
        os.waitpid(child.pid, 0)
