"""One call in a forked copy of this process, its result sent back through a pipe.

The copy starts with every module this process has imported (torch's import is most of a short
simulation's time), so work split across two cores costs no second start-up. The child never returns
into the caller's code: it sends its result, or the error it raised, and leaves with `os._exit`, so the
parent's exit handlers, buffered output and test runner stay the parent's alone.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
from collections.abc import Callable
from typing import Any


class ForkedCallFailed(RuntimeError):
    """The forked call raised, or its process ended without an answer."""


def available() -> bool:
    return hasattr(os, "fork")


class ForkedCall:
    """A call running in a forked child; `result()` waits for it."""

    def __init__(self, pid: int, pipe: int):
        self.pid = pid
        self._pipe = pipe

    def result(self, what: str) -> Any:
        """The call's return value; its exception raised again (or ForkedCallFailed naming `what`)."""
        try:
            with os.fdopen(self._pipe, "rb") as pipe:
                data = pipe.read()  # before waiting: a result larger than the pipe holds blocks the child until read
        except BaseException:  # interrupted (Ctrl-C, the app's SIGTERM): the child goes with the caller
            self._end()
            raise
        _, status = os.waitpid(self.pid, 0)
        if not data:
            raise ForkedCallFailed(f"{what} ended without an answer ({_ending(status)})")
        ok, value = pickle.loads(data)
        if ok:
            return value
        if isinstance(value, BaseException):
            raise value
        raise ForkedCallFailed(f"{what} failed: {value}")

    def abandon(self) -> None:
        """End the child now (the caller is failing anyway) and reap it."""
        os.close(self._pipe)
        self._end()

    def _end(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(self.pid, 0)


def start(call: Callable[[], Any]) -> ForkedCall:
    """Run `call()` in a forked child. Only from a process with no other thread running: fork copies
    the calling thread alone, and a lock another thread held stays held in the copy."""
    sys.stdout.flush()  # what is buffered now would otherwise be written twice, once by each process
    sys.stderr.flush()
    read, write = os.pipe()
    pid = os.fork()
    if pid:
        os.close(write)
        return ForkedCall(pid, read)
    try:  # the child
        os.close(read)
        try:
            payload = pickle.dumps((True, call()))
        except BaseException as error:  # noqa: BLE001 - whatever it was goes back to the parent
            try:
                payload = pickle.dumps((False, error))
            except Exception:  # noqa: BLE001 - an exception that does not pickle goes back as its text
                payload = pickle.dumps((False, f"{type(error).__name__}: {error}"))
        with os.fdopen(write, "wb") as pipe:
            pipe.write(payload)
    finally:
        try:  # what the child printed is its own to write; os._exit would drop it
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(0)


def _ending(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit status {os.waitstatus_to_exitcode(status)}"
