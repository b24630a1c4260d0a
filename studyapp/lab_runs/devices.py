"""Which devices a lab can run on here, asked of torch in a lab process, never in the web process.

On first need (a lab page, a run asking for cuda) a background thread runs

    LAB_DEVICES_COMMAND (default: this interpreter's `-m sharding_lab.engine.devices`)

and reads its one JSON line, a `sharding_lab.lab_devices.LabDevices`. Until it answers, `detection()`
says so (pending) and the page says it is looking; a reload shows the answer. A failure (no torch, a
stuck driver, no JSON) is kept as an error the page shows plainly, and asked again after
RETRY_FAILED_S.

The answer is a property of the interpreter and the machine, not of an app: it is kept once per
process for each command, so several apps in one process (the tests make one per test) ask torch once.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from flask import Flask, current_app

from sharding_lab.lab_devices import LabDevices  # the contract: no torch

DETECT_TIMEOUT_S = 60.0  # importing torch and counting GPUs takes 1-5 s; a minute is a stuck driver
RETRY_FAILED_S = 300.0  # a failed detection is asked again on the first need after this long
FAILED = "could not ask torch for GPUs"


def default_command() -> list[str]:
    """The detection run by this very interpreter, so it sees the torch the labs will use."""
    return [sys.executable, "-m", "sharding_lab.engine.devices"]


def devices_command(app: Flask | None = None) -> list[str]:
    return list((app or current_app).config["LAB_DEVICES_COMMAND"] or default_command())


@dataclass(frozen=True)
class Detection:
    """What is known so far: the devices, or why they could not be asked for, or neither yet."""

    devices: LabDevices | None = None
    error: str | None = None  # "could not ask torch for GPUs: ..."

    @property
    def pending(self) -> bool:
        return self.devices is None and self.error is None


class DeviceProbe:
    """Runs one command, in a thread, on first need; keeps its answer."""

    def __init__(self, argv: Sequence[str]):
        self.argv = list(argv)
        self._lock = threading.Lock()
        self._answer = Detection()
        self._thread: threading.Thread | None = None
        self._failed_at: float | None = None

    def current(self) -> Detection:
        """The answer so far, starting the detection if it never ran (or failed a while ago)."""
        with self._lock:
            idle = self._thread is None or not self._thread.is_alive()
            retry = self._failed_at is not None and time.monotonic() - self._failed_at >= RETRY_FAILED_S
            if idle and (self._thread is None or retry):
                self._failed_at = None
                self._thread = threading.Thread(target=self._detect, name="lab-devices", daemon=True)
                self._thread.start()
            return self._answer

    def wait(self, timeout_s: float = DETECT_TIMEOUT_S + 5) -> Detection:
        """The answer once the detection under way (started if needed) is over, or as it is at the timeout."""
        self.current()
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join(timeout_s)
        return self._answer

    def _detect(self) -> None:
        try:
            answer = Detection(devices=ask(self.argv))
        except DetectionFailed as error:
            answer = Detection(error=f"{FAILED}: {error}")
        with self._lock:
            self._answer = answer
            self._failed_at = time.monotonic() if answer.error else None


class DetectionFailed(Exception):
    """The command did not answer with a LabDevices line; the message says what it did instead."""


def ask(argv: Sequence[str], timeout_s: float = DETECT_TIMEOUT_S) -> LabDevices:
    """Run the detection command and read its answer (its last stdout line)."""
    try:
        done = subprocess.run(list(argv), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise DetectionFailed(f"the lab process did not answer within {timeout_s:g} s") from None
    except OSError as error:
        raise DetectionFailed(f"could not start the lab process: {error}") from None
    if done.returncode != 0:
        how = f"stopped by signal {-done.returncode}" if done.returncode < 0 else f"exited with status {done.returncode}"
        last = [line for line in (done.stderr or "").strip().splitlines() if line.strip()][-1:]
        raise DetectionFailed(f"the lab process {how}" + (f": {last[0].strip()[:300]}" if last else ""))
    lines = (done.stdout or "").strip().splitlines()
    try:
        return LabDevices.from_json(lines[-1])
    except (IndexError, ValueError, TypeError) as error:
        raise DetectionFailed(f"the lab process answered {(lines or [''])[-1][:200]!r}, not its devices ({error})") from None


_probes: dict[tuple[str, ...], DeviceProbe] = {}
_probes_lock = threading.Lock()


def probe(app: Flask | None = None) -> DeviceProbe:
    """The probe for the app's detection command (one per command in this process)."""
    key = tuple(devices_command(app))
    with _probes_lock:
        if key not in _probes:
            _probes[key] = DeviceProbe(key)
        return _probes[key]


def detection(app: Flask | None = None) -> Detection:
    """What the lab process sees, as far as known now; None of it computed in this process."""
    return probe(app).current()
