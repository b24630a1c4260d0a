"""The lab worker: one thread that runs queued lab runs, oldest first, one at a time on this machine.

One lab at a time: whoever runs a lab (the server's worker thread, or `studyapp labs run-all`
running the queue itself) holds an exclusive lock file in the instance folder while its row is
`running`. So a `running` row with the lock free was cut off (a restart, a kill): the worker marks
it failed when it starts. Runs still `queued` at a restart are resumed: they are requests nobody
has withdrawn.

Where a lab runs: by default on warm ranks in the worker's lab server (studyapp.lab_runs.server: one
long-lived `sharding-lab serve-labs` child keeping a pool of ranks per world size); with LAB_COMMAND
set, each run is a process of its own (studyapp.lab_runs.process). Either way a run past its timeout
or a stop kills every process of it.

Settings: LAB_TIMEOUT_S (seconds a run may take), LAB_WORLD_SIZES (the world sizes a run may ask
for), LAB_COMMAND (argv prefix of a lab CLI run once per lab; tests point it at a fake), LAB_DEVICES_COMMAND
(argv of the command that asks torch, in a lab process, for the GPUs: see studyapp.lab_runs.devices), LAB_POOL_IDLE_S
(seconds the lab server keeps idle ranks up), PLAN_SIMULATION_COMMAND (argv prefix of the `sharding-lab`
CLI a plan simulation runs, see studyapp.lab_runs.plan_runs; tests point it at a fake), LAB_WORKER_AUTOSTART
(start the worker on the first queued run; default on, off under TESTING, where tests start it).
"""

from __future__ import annotations

import atexit
import fcntl
import os
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from flask import Flask, current_app
from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError
from sqlmodel import Session

from studyapp.db import get_engine
from studyapp.lab_runs import plan_runs
from studyapp.lab_runs.process import Outcome, default_command, lab_outcome, run_params, stop_group
from studyapp.lab_runs.queue import ACTIVE, claim_next, fail_interrupted, finish, next_queued
from studyapp.lab_runs.server import LabServer, server_argv
from studyapp.models import LabRun, RunStatus
from studyapp.refusals import explained_refusal, refusal_of

DEFAULTS: dict[str, Any] = {
    "LAB_TIMEOUT_S": 300.0,  # a lab takes 10-30 s at 2 ranks on a small CPU; 10x that is a hang
    "LAB_WORLD_SIZES": (2, 4),  # ranks are processes on this machine: more only slows a small one
    "LAB_COMMAND": None,  # None: the lab server's warm ranks; an argv prefix: one process per run
    "LAB_DEVICES_COMMAND": None,  # None: this interpreter's `-m sharding_lab.engine.devices`
    "LAB_POOL_IDLE_S": 300.0,  # idle ranks hold a torch each in memory; a lab after that starts them again
    "LAB_WORKER_AUTOSTART": None,  # None: on, except under TESTING
    "PLAN_SIMULATION_COMMAND": None,  # None: this interpreter's `-m sharding_lab.cli`
}
LOCK_FILE = "lab-runner.lock"
POLL_S = 2.0  # how often an idle worker looks for runs queued by another process
INTERRUPTED = "interrupted by a server restart: the process running it stopped before it finished"
SHUTDOWN = "stopped: the server shut down while it ran"
_WORKER_KEY = "studyapp.lab_worker"


# --- settings ---------------------------------------------------------------------------------


def world_sizes(app: Flask | None = None) -> tuple[int, ...]:
    return tuple((app or current_app).config["LAB_WORLD_SIZES"])


def lab_command(app: Flask | None = None) -> list[str]:
    return list((app or current_app).config["LAB_COMMAND"] or default_command())


def lock_path(app: Flask | None = None) -> str:
    return os.path.join((app or current_app).instance_path, LOCK_FILE)


# --- running ----------------------------------------------------------------------------------


@contextmanager
def runner_lock(path: str, *, wait: bool = True, stop: threading.Event | None = None) -> Iterator[bool]:
    """Hold the machine-wide lab lock; yields False if not taken (no wait, or `stop` was set).
    flock is released by the kernel when its holder dies, so a crash never leaves it held."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not wait or (stop is not None and stop.is_set()):
                    yield False
                    return
                time.sleep(0.2)
        yield True
    finally:
        os.close(fd)  # closing releases the lock


def execute(engine: Engine, run: LabRun, command: Sequence[str], timeout_s: float) -> Outcome:
    """Run a claimed (`running`) run to its end and store the outcome; never leaves it running."""
    outcome = lab_outcome(command, run, timeout_s)
    finish(engine, run.id, outcome)
    return outcome


@dataclass(frozen=True)
class Unstored:
    """A finished run whose result the database has refused so far (the worker asks again)."""

    run_id: int
    reason: str  # what the database said (where it may be shown) and what to do about it


class LabWorker:
    """Runs queued lab runs, oldest first, one at a time: in its own thread (`start`), or in the
    caller's (`run_until_over`, as `studyapp labs run-all` does)."""

    def __init__(self, app: Flask):
        self.app = app
        self.engine = get_engine(app)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._stop_reason = SHUTDOWN  # the error of a run a stop cuts short (the first stop's says why)
        self._process: subprocess.Popen | None = None
        self._thread: threading.Thread | None = None
        self.lab_server: LabServer | None = None  # started by the first run without LAB_COMMAND
        self.unstored: Unstored | None = None  # while a finished run's result waits for the database

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="lab-worker", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self, timeout_s: float = 15.0, reason: str = SHUTDOWN) -> None:
        """Stop the thread, killing the lab it runs (its row becomes failed with `reason`, never stays running)."""
        if not self._stop.is_set():
            self._stop_reason = reason
        self._stop.set()
        self._wake.set()
        process = self._process
        if process is not None and process.returncode is None:  # not reaped yet: stop_group sees whether it runs
            stop_group(process)
        if self.lab_server is not None:
            self.lab_server.stop()
        if self._thread is not None:
            self._thread.join(timeout_s)
        # The thread ends a server it started again before it ends itself; this is for a thread still
        # running a lab when the join gave up.
        if self.lab_server is not None:
            self.lab_server.stop()

    def stop_soon(self, reason: str) -> threading.Thread:
        """`stop(reason)` in a thread of its own, returning at once: what a signal handler may call. The
        handler runs in the thread that runs the queue (`run_until_over`'s), which may hold the lab server's
        lock, and which goes on only once the lab it waits for is stopped."""
        stopping = threading.Thread(target=self.stop, kwargs={"reason": reason}, name="lab-worker-stop")
        stopping.start()
        return stopping

    def _loop(self) -> None:
        try:
            with runner_lock(lock_path(self.app), stop=self._stop) as held:
                if held:
                    cut_off = fail_interrupted(self.engine, INTERRUPTED)
                    if cut_off:
                        self.app.logger.warning("lab runs: %d cut off by a restart marked failed", cut_off)
            while not self._stop.is_set():
                self._wake.clear()
                try:
                    ran = self.run_next()
                except Exception:  # a database hiccup must not end the worker
                    self.app.logger.exception("lab worker: run failed")
                    ran = False
                if not ran:
                    self._wake.wait(POLL_S)
        finally:
            # This thread started the lab server, which the kernel kills when this thread ends: it ends
            # the server first (or waits for stop() to), so the server's pools are cleaned up.
            if self.lab_server is not None:
                self.lab_server.stop()

    def run_next(self) -> bool:
        """Run the oldest queued run, if any; whether one ran."""
        with Session(self.engine) as session:
            if next_queued(session) is None:
                return False
        with runner_lock(lock_path(self.app), stop=self._stop) as held:
            if not held or self._stop.is_set():  # stopped: claim nothing more
                return False
            run = claim_next(self.engine)
            if run is None:
                return False
            outcome = self._run(run)
            self._process = None
            if self._stop.is_set() and outcome.status == RunStatus.failed:
                outcome = Outcome(RunStatus.failed, error=self._stop_reason)
            self._store(run.id, outcome)
        return True

    def _store(self, run_id: int, outcome: Outcome) -> None:
        """Store a finished run's outcome. A database that refuses the write (a full disk, a lock held
        past its timeout) is asked again every POLL_S until it takes it, so a lab that ran is not lost
        to a moment without space; meanwhile the run reads `running` and the lock stays held, so no
        other runner marks it cut off. A stop gives up: the next start marks the run interrupted."""
        refused_at = None
        try:
            while True:
                try:
                    finish(self.engine, run_id, outcome)
                except OperationalError as error:
                    if self._stop.is_set():
                        self.app.logger.warning("lab run %d: stopped before the database took its result (%s); the "
                                                "next start marks it interrupted", run_id, error.orig)
                        return
                    if refused_at is None:  # said once, not every POLL_S
                        refused_at = time.monotonic()
                        self.unstored = Unstored(run_id, explained_refusal(error.orig))
                        self.app.logger.error("lab run %d finished, but its result could not be stored (%s): %s; "
                                              "trying again every %g s", run_id, error.orig,
                                              refusal_of(error.orig).value, POLL_S)
                    self._stop.wait(POLL_S)
                    continue
                if refused_at is not None:
                    self.app.logger.warning("lab run %d: its result is stored, %.0f s late", run_id,
                                            time.monotonic() - refused_at)
                return
        finally:
            self.unstored = None

    def _run(self, run: LabRun) -> Outcome:
        timeout_s = float(self.app.config["LAB_TIMEOUT_S"])
        if run.lab_id == plan_runs.PLAN_SIMULATION:  # a job kind of its own: one process per simulation
            command = self.app.config["PLAN_SIMULATION_COMMAND"] or default_command()
            return plan_runs.simulation_outcome(command, run, timeout_s, self._started)
        if self.app.config["LAB_COMMAND"] is not None:
            return lab_outcome(lab_command(self.app), run, timeout_s, self._started)
        if self.lab_server is None:
            # Halted by the stop event: a stop that comes as it starts its child keeps the child from starting.
            self.lab_server = LabServer(server_argv(float(self.app.config["LAB_POOL_IDLE_S"]), timeout_s),
                                        halted=self._stop)
        if self._stop.is_set():  # stop() came between the claim and the start
            return Outcome(RunStatus.failed, error=self._stop_reason)
        try:
            params = run_params(run.params)
            return self.lab_server.run(run.lab_id, int(params.get("world_size", 0)), timeout_s, device=params["device"])
        except Exception as error:  # noqa: BLE001 - whatever went wrong, the row must not stay running
            self.lab_server.stop()
            return Outcome(RunStatus.failed, error=f"the runner failed: {type(error).__name__}: {error}")

    def run_until_over(self, run_id: int) -> LabRun:
        """Run the queue in this thread until run `run_id` is over (another worker may run it, or
        runs queued before it), or until a stop; its row then."""
        while True:
            with Session(self.engine, expire_on_commit=False) as session:
                run = session.get(LabRun, run_id)
                if run.status not in ACTIVE or self._stop.is_set():
                    return run
            if not self.run_next():
                self._wake.wait(POLL_S)  # another worker runs it

    def _started(self, process: subprocess.Popen) -> None:
        self._process = process
        if self._stop.is_set():  # stop() came between the claim and the start
            stop_group(process)


def app_worker(app: Flask) -> LabWorker | None:
    """The app's worker thread, if one was started."""
    return app.extensions.get(_WORKER_KEY)


def start_worker(app: Flask) -> LabWorker:
    """Start the app's worker (once): it first marks runs cut off by a restart failed, then runs
    the queue, including runs queued before the restart."""
    running = app_worker(app)
    if running is not None and running.alive:
        return running
    lab_worker = LabWorker(app)
    app.extensions[_WORKER_KEY] = lab_worker
    lab_worker.start()
    atexit.register(lab_worker.stop)  # a normal exit kills the lab it runs instead of orphaning it
    return lab_worker


def notify_queued(app: Flask) -> None:
    """A run was queued: wake the worker, starting it if this app starts it on demand."""
    autostart = app.config["LAB_WORKER_AUTOSTART"]
    if autostart is None:
        autostart = not app.testing
    running = app_worker(app)
    if running is not None and running.alive:
        running.wake()
    elif autostart:
        start_worker(app)


def init_app(app: Flask) -> None:
    for key, value in DEFAULTS.items():
        app.config.setdefault(key, value)
