"""The lab server: one long-lived child, `sharding-lab serve-labs`, that keeps ranks warm between runs.

The web process never imports torch, so the warm ranks live in a child it owns (started on the first
run, in its own process group): one JSON request per line on its stdin, one answer per line on its
stdout (sharding_lab.engine.lab_server). A stop, a run that overruns its timeout or a child that stopped
answering sends it SIGTERM: it ends its pools, removes their files and exits, as at the end of its input.
Whatever is left of its process group after a few seconds, ranks included, is SIGKILLed. The next run
starts a fresh one. A failed rank is the child's business: it answers with the error and
rebuilds its pool.
"""

from __future__ import annotations

import collections
import json
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Sequence

from sharding_lab.labs.registry import LABS  # metadata only: no torch
from sharding_lab.proc_stat import alive  # no torch
from sharding_lab.run_config import DEVICES  # no torch
from studyapp.lab_runs.process import Outcome, signal_said, stderr_tail, stop_group
from studyapp.models import RunStatus

# How much sooner than the run's timeout the server ends a hung lab itself: time to name the hung rank,
# dump its stack and tear its pool down (about 4 s) before the app's own timeout stops the whole server.
HANG_REPORT_S = 10.0


def server_argv(idle_timeout_s: float, timeout_s: float) -> list[str]:
    """`sharding-lab serve-labs` run by this very interpreter, so the child sees the same packages.
    Its own timeout comes first: at the same `timeout_s` a hang was always "timed out", naming no rank."""
    inner_s = timeout_s - min(HANG_REPORT_S, timeout_s / 4)
    return [sys.executable, "-m", "sharding_lab.cli", "serve-labs",
            "--idle-timeout", f"{idle_timeout_s:g}", "--timeout", f"{inner_s:g}"]


class LabServer:
    """The child that runs labs on warm ranks; `run` one lab at a time (the worker's lock sees to that).

    The child dies with the thread whose `run` started it (`stop` before that thread ends: the worker
    thread does, in its `finally`). Once `halted` is set no child is started: set before `stop`, it
    stops a run whose child was about to start as well as one already running."""

    def __init__(self, argv: Sequence[str], halted: threading.Event | None = None):
        self.argv = list(argv)
        self.halted = halted
        self.process: subprocess.Popen | None = None
        self._answers: queue.Queue[str | None] = queue.Queue()
        self._stderr: collections.deque[str] = collections.deque(maxlen=200)
        self._lock = threading.Lock()
        # Held through a stop, so a second caller returns only once the child is gone: the thread that
        # started the child must outlive it, since the child is signalled when that thread ends
        # (PR_SET_PDEATHSIG follows the creating thread): SIGTERM again, in the middle of its cleanup.
        self._stopping = threading.Lock()

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None and self.process.poll() is None else None

    def run(self, lab_id: str, world_size: int, timeout_s: float, device: str = "cpu") -> Outcome:
        """Run one lab on `world_size` ranks on `device` on the server (started if none is up); the
        lab's JSON, or why it failed."""
        if lab_id not in LABS:
            return Outcome(RunStatus.failed, error=f"could not start the lab: unknown lab {lab_id!r}")
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            return Outcome(RunStatus.failed, error=f"could not start the lab: bad world size {world_size!r}")
        if device not in DEVICES:
            return Outcome(RunStatus.failed, error=f"could not start the lab: unknown device {device!r}; "
                           f"choose one of {', '.join(DEVICES)}")
        try:
            process = self._started()
            if process is None:
                return Outcome(RunStatus.failed, error="stopped before the lab started")
            self._stderr.clear()
            process.stdin.write(json.dumps({"lab": lab_id, "world_size": world_size, "device": device}) + "\n")
            process.stdin.flush()
        except OSError as error:
            self.stop()
            return Outcome(RunStatus.failed, error=f"could not start the lab server: {error}" + self._tail())
        try:
            line = self._answers.get(timeout=timeout_s)
        except queue.Empty:
            self.stop()
            return Outcome(RunStatus.failed, error=f"timed out after {timeout_s:g} s; the lab's processes were "
                           "stopped." + self._tail())
        if line is None:  # the child closed its stdout: it died, or stop() killed it
            code = process.wait()
            self.stop()
            how = f"stopped by {signal_said(-code)}" if code < 0 else f"exited with status {code}"
            return Outcome(RunStatus.failed, error=f"the lab server {how} before answering; the run did not finish; "
                           "run it again." + self._tail())
        try:
            answer = json.loads(line)
        except ValueError:
            self.stop()
            return Outcome(RunStatus.failed, error=f"the lab server answered {line[:200]!r}, not JSON." + self._tail())
        if "error" in answer:
            return Outcome(RunStatus.failed, error=str(answer["error"]) + self._tail())
        result = answer.get("result")
        if not isinstance(result, dict) or result.get("lab") != lab_id:
            return Outcome(RunStatus.failed, error=f"the result names lab {result and result.get('lab')!r}, "
                           f"not {lab_id!r}.")
        return Outcome(RunStatus.done, result=result)

    def stop(self) -> None:
        """End the child and its ranks (`stop_group`: SIGTERM, which it answers by ending its pools and
        their files, then SIGKILL for its whole group), and remove the pool folders of a child that was
        killed outright; the next run starts a fresh one."""
        with self._stopping:
            with self._lock:
                process, self.process = self.process, None
            if process is None:
                return
            stop_group(process)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                return
            # A child killed with SIGKILL (the OOM killer, a `kill -9`) could not remove its pools' folders.
            from sharding_lab.pool_folders import remove_stale_folders  # no torch

            remove_stale_folders()

    def _started(self) -> subprocess.Popen | None:
        """The running child, or a fresh one; None once halted (checked under the lock a stop takes, so a
        stop either finds the child started or keeps it from starting)."""
        with self._lock:
            if self.halted is not None and self.halted.is_set():
                return None
            if self.process is not None and _serving(self.process):
                return self.process
            if self.process is not None:
                try:  # on its way out: let it finish, so the new child's start is not a race with its end
                    self.process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    stop_group(self.process)
            self._answers = queue.Queue()
            self.process = subprocess.Popen(
                self.argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                bufsize=1,
                # Its own process group: a timeout or a stop kills the ranks too, and a Ctrl-C meant
                # for the server does not reach it.
                start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
            answers = self._answers
            threading.Thread(target=_read_lines, args=(self.process.stdout, answers.put), daemon=True,
                             name="lab-server-stdout").start()
            threading.Thread(target=_read_lines, args=(self.process.stderr, self._keep_stderr), daemon=True,
                             name="lab-server-stderr").start()
            return self.process

    def _keep_stderr(self, line: str | None) -> None:
        if line is not None:
            self._stderr.append(line)

    def _tail(self) -> str:
        return stderr_tail("".join(self._stderr))


def _serving(process: subprocess.Popen) -> bool:
    """Whether the child can still answer. One killed outright (the OOM killer, `kill -9`) cannot be reaped
    until its last thread has ended, yet its main thread may be gone already (a zombie in /proc): it reads
    no more requests. Its ranks see it die then (their parent-death signal), so a run sent in that window
    would wait for an answer from a server already dead."""
    return process.poll() is None and alive(process.pid)


def _read_lines(stream, deliver) -> None:
    try:
        for line in stream:
            deliver(line)
    except (OSError, ValueError):
        pass
    deliver(None)
