"""Run one lab in its own process group: `sharding-lab run LAB --world-size N --device D --json`.

The web process never imports torch: a lab is always a child process, started from a fixed argv
list (no shell) built only from a registered lab id, a whole-number world size and a device of
run_config.DEVICES. One that overruns its timeout is stopped (SIGTERM, so it tears down its ranks and
temporary files), then killed with its whole process group, the ranks it spawned included.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sharding_lab.labs.registry import LABS  # metadata only: no torch
from sharding_lab.parent_death import guarded
from sharding_lab.proc_stat import every_process
from sharding_lab.run_config import DEVICES  # no torch
from studyapp.models import LabRun, RunStatus

STDERR_TAIL_CHARS = 2000  # enough for a traceback's end, small enough to store with every failure
# A Python warning as the warnings module prints it: "FILE:LINE: SomeWarning: message", then its source line,
# indented. Torch prints its own once per rank; multiprocessing's resource tracker prints "leaked semaphore
# objects" when a lab server is killed outright. None of them says why a run failed.
PYTHON_WARNING = re.compile(r"\S.*:\d+: \w*Warning: ")
TERM_GRACE_S = 5.0  # for a lab process to stop its ranks after SIGTERM (a pool closes in at most 3 s)


def default_command() -> list[str]:
    """The lab CLI run by this very interpreter, so the child sees the same installed packages."""
    return [sys.executable, "-m", "sharding_lab.cli"]


def run_params(params: dict[str, Any] | None) -> dict[str, Any]:
    """A lab run's parameters with their defaults filled in: rows stored before runs had a device
    ran on cpu."""
    return {"device": "cpu", **(params or {})}


def lab_argv(command: Sequence[str], lab_id: str, world_size: int, device: str = "cpu") -> list[str]:
    """The child's argv; refuses anything but a registered lab, a positive whole world size and a
    device of run_config.DEVICES."""
    if lab_id not in LABS:
        raise ValueError(f"unknown lab {lab_id!r}")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world size must be a positive whole number, got {world_size!r}")
    if device not in DEVICES:
        raise ValueError(f"unknown device {device!r}; choose one of {', '.join(DEVICES)}")
    return [*command, "run", lab_id, "--world-size", str(world_size), "--device", device, "--json"]


@dataclass(frozen=True)
class Outcome:
    """How a lab process ended: `result` (the lab's JSON) when done, `error` when failed."""

    status: RunStatus  # done | failed
    result: dict[str, Any] | None = None
    error: str | None = None


def lab_outcome(
    command: Sequence[str],
    run: LabRun,
    timeout_s: float,
    on_start: Callable[[subprocess.Popen], None] | None = None,
) -> Outcome:
    """Run a run's lab to its end; whatever goes wrong (even before it starts) is a failed outcome."""
    try:
        params = run_params(run.params)
        argv = lab_argv(command, run.lab_id, int(params.get("world_size", 0)), params["device"])
        return run_lab_process(argv, run.lab_id, timeout_s, on_start=on_start)
    except (OSError, ValueError) as error:
        return Outcome(RunStatus.failed, error=f"could not start the lab: {error}")
    except Exception as error:  # noqa: BLE001 - whatever went wrong, the caller's row must not stay running
        return Outcome(RunStatus.failed, error=f"the runner failed: {type(error).__name__}: {error}")


def run_lab_process(
    argv: Sequence[str],
    lab_id: str,
    timeout_s: float,
    *,
    on_start: Callable[[subprocess.Popen], None] | None = None,
) -> Outcome:
    """Run `argv` and read its one JSON object from stdout.

    A run whose claim does not hold still exits 1 with its JSON: that is a finished measurement
    (done, holds false), not a failure. `on_start` receives the process (so a caller can stop it).
    """
    outcome = run_json_process(argv, timeout_s, on_start=on_start, stopped="the lab's processes were stopped",
                               no_json="no JSON result")
    result = outcome.result
    if result is not None and result.get("lab") != lab_id:
        return Outcome(RunStatus.failed, error=f"the result names lab {result.get('lab')!r}, not {lab_id!r}.")
    return outcome


def run_json_process(
    argv: Sequence[str],
    timeout_s: float,
    *,
    on_start: Callable[[subprocess.Popen], None] | None = None,
    stopped: str,
    no_json: str,
) -> Outcome:
    """Run `argv` in a process group of its own and read the one JSON object it prints on stdout:
    done with that object, or failed saying why (timed out: `stopped`; killed by a signal; no JSON:
    `no_json`), with the tail of its stderr."""
    process = subprocess.Popen(
        # Guarded: a server killed outright (SIGKILL, the OOM killer) takes it along; orphaned, it ran on
        # beside the next server's runs, and that server called it stopped.
        guarded(list(argv)),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # Its own process group: a timeout kills the ranks it spawned too, and a Ctrl-C meant for
        # the server does not reach it.
        start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    if on_start:
        on_start(process)
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        stop_group(process)
        stdout, stderr = _drain(process)
        return Outcome(RunStatus.failed, error=f"timed out after {timeout_s:g} s; {stopped}." + stderr_tail(stderr))
    if process.returncode < 0:  # killed by a signal: a shutdown stopped it, or the OS did
        return Outcome(RunStatus.failed, error=f"stopped by {signal_said(-process.returncode)}." + stderr_tail(stderr))
    result = _parse(stdout)
    if result is None:
        return Outcome(RunStatus.failed, error=f"exit status {process.returncode}, {no_json}." + stderr_tail(stderr))
    return Outcome(RunStatus.done, result=result)


def stop_group(process: subprocess.Popen, grace_s: float = TERM_GRACE_S) -> None:
    """Stop the process and everything in its group: SIGTERM first, which the lab CLI answers by
    stopping its ranks and removing its temporary files (a SIGKILL would leave them, and the
    semaphores its ranks share in /dev/shm); SIGKILL for the whole group after `grace_s`. Once the leader
    has exited, what is left of its group has up to `grace_s` more to leave by itself before that SIGKILL."""
    if not exited(process, 0.0):
        try:
            process.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass
    if exited(process, grace_s):
        # Killed outright (SIGKILL, the OOM killer), it could not clean up: multiprocessing's resource tracker,
        # in its group, unlinks the semaphores it left once the leader's pipe closes, just after its exit. A
        # SIGKILL at once would leave them in /dev/shm. (A leader still ending when stopped, its main thread
        # gone but not its last, exits only after the SIGTERM is sent: the tracker starts then, too.)
        _wait_for_group_to_leave(process.pid, grace_s)
    _kill_group(process)


def _wait_for_group_to_leave(leader: int, timeout_s: float) -> None:
    """Wait up to `timeout_s` for every live process but the (exited) leader to leave its group (what
    is left is killed next). Without /proc (not Linux) it cannot tell, and returns at once."""
    deadline = time.monotonic() + timeout_s
    while any(stat.group == leader and stat.pid != leader and stat.live for stat in every_process()):
        if time.monotonic() >= deadline:
            return
        time.sleep(0.05)


def exited(process: subprocess.Popen, timeout_s: float) -> bool:
    """Wait up to `timeout_s` for the process to exit, leaving it unreaped (its zombie keeps the group
    id from being reused before `_kill_group`); whether it has exited."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
        except ChildProcessError:  # reaped already (by a thread in communicate(), say)
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def _kill_group(process: subprocess.Popen) -> None:
    """SIGKILL the process and everything in its group, while its leader is unreaped (so the group id
    cannot have been reused)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _drain(process: subprocess.Popen) -> tuple[str, str]:
    try:
        return process.communicate(timeout=10)
    except subprocess.TimeoutExpired:  # something outside the group holds the pipes open
        process.kill()
        process.wait()
        return "", ""


def _parse(stdout: str) -> dict[str, Any] | None:
    # The CLI prints exactly one JSON object: the whole of stdout (`plan` indents it), or its last line
    # (`run`, after anything else that reached stdout); anything else is no result.
    lines = stdout.strip().splitlines()
    for text in (stdout, lines[-1] if lines else ""):
        try:
            result = json.loads(text)
        except ValueError:
            continue
        return result if isinstance(result, dict) else None
    return None


def signal_said(number: int) -> str:
    """"signal 9 (killed)": the number, and what the OS calls it."""
    try:
        name = signal.strsignal(number)
    except ValueError:
        name = None
    return f"signal {number} ({name.lower()})" if name else f"signal {number}"


def stderr_tail(stderr: str | None) -> str:
    """The end of a lab process's stderr, to store with its failure ("" when nothing is left to show):
    Python's warnings (and each one's source line) left out, they say nothing of why it failed; the
    last lines do."""
    lines, after_warning = [], False
    for line in (stderr or "").splitlines():
        if PYTHON_WARNING.match(line):
            after_warning = True
            continue
        if after_warning and line[:1].isspace():  # the warning's source line, `  warnings.warn(...`
            after_warning = False
            continue
        after_warning = False
        lines.append(line)
    text = "\n".join(lines).strip()
    if not text:
        return ""
    if len(text) > STDERR_TAIL_CHARS:
        text = "…" + text[-STDERR_TAIL_CHARS:]
    return "\nstderr:\n" + text
