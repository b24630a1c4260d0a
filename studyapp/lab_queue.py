"""The lab-run queue: LabRun rows run one at a time, by a worker thread or `studyapp labs run-all`.

    queued --(claimed by the worker)--> running --> done   (the lab's JSON, whether or not its claim held)
                                                \\-> failed (timeout, crash, no JSON: the error says which)

One lab at a time on this machine: whoever runs a lab (the server's worker thread or the CLI) holds
an exclusive lock file in the instance folder while its row is `running`. So a `running` row with
the lock free was cut off (a restart, a kill): the worker marks it failed when it starts. Runs still
`queued` at a restart are resumed: they are requests nobody has withdrawn.

Settings: LAB_TIMEOUT_S (seconds a run may take), LAB_WORLD_SIZES (the world sizes a run may ask
for), LAB_COMMAND (argv prefix of the lab CLI; tests point it at a fake), LAB_WORKER_AUTOSTART
(start the worker on the first queued run; default on, off under TESTING, where tests start it).
Times here are the real wall clock (runs are real processes), not the app's study CLOCK.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any

import click
from flask import Flask, current_app
from flask.cli import AppGroup
from sqlalchemy import func, update
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from sharding_lab.labs.registry import LABS
from studyapp.db import get_engine
from studyapp.lab_runner import Outcome, default_command, kill_group, lab_argv, run_lab_process
from studyapp.models import LabRun

DEFAULTS: dict[str, Any] = {
    "LAB_TIMEOUT_S": 300.0,  # a lab takes 10-30 s at 2 ranks on a small CPU; 10x that is a hang
    "LAB_WORLD_SIZES": (2, 4),  # ranks are processes on this machine: more only slows a small one
    "LAB_COMMAND": None,  # None: `python -m sharding_lab.cli` with this interpreter
    "LAB_WORKER_AUTOSTART": None,  # None: on, except under TESTING
}
LOCK_FILE = "lab-runner.lock"
POLL_S = 2.0  # how often an idle worker looks for runs queued by another process
INTERRUPTED = "interrupted by a server restart: the process running it stopped before it finished"
SHUTDOWN = "stopped: the server shut down while it ran"
_WORKER_KEY = "studyapp.lab_worker"
_table = LabRun.__table__


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def aware(moment: datetime | None) -> datetime | None:
    """SQLite hands back UTC datetimes without their offset; put it back."""
    if moment is not None and moment.tzinfo is None:
        return moment.replace(tzinfo=timezone.utc)
    return moment


# --- settings ---------------------------------------------------------------------------------


def world_sizes(app: Flask | None = None) -> tuple[int, ...]:
    return tuple((app or current_app).config["LAB_WORLD_SIZES"])


def lab_command(app: Flask | None = None) -> list[str]:
    return list((app or current_app).config["LAB_COMMAND"] or default_command())


def lock_path(app: Flask | None = None) -> str:
    return os.path.join((app or current_app).instance_path, LOCK_FILE)


# --- rows -------------------------------------------------------------------------------------


def enqueue(engine: Engine, lab_id: str, world_size: int) -> LabRun:
    """Queue a run of a registered lab; the same lab and parameters already waiting or running is
    that run (a double click queues nothing twice)."""
    if lab_id not in LABS:
        raise ValueError(f"unknown lab {lab_id!r}")
    params = {"world_size": world_size}
    with Session(engine, expire_on_commit=False) as session:
        active = session.exec(
            select(LabRun).where(LabRun.lab_id == lab_id, LabRun.status.in_(("queued", "running"))).order_by(LabRun.id)
        ).all()
        for run in active:
            if run.params == params:
                return run
        run = LabRun(lab_id=lab_id, params=params, status="queued", created_at=utcnow())
        session.add(run)
        session.commit()
        return run


def claim_next(engine: Engine) -> LabRun | None:
    """Atomically turn the oldest queued run into a running one; None when nothing is queued.
    The conditional UPDATE is the claim: of two claimants only one changes the row."""
    with Session(engine, expire_on_commit=False) as session:
        while True:
            run_id = session.exec(select(LabRun.id).where(LabRun.status == "queued").order_by(LabRun.id).limit(1)).first()
            if run_id is None:
                return None
            claimed = session.exec(
                update(_table)
                .where(_table.c.id == run_id, _table.c.status == "queued")
                .values(status="running", started_at=utcnow())
            ).rowcount
            session.commit()
            if claimed == 1:
                return session.get(LabRun, run_id, populate_existing=True)


def finish(engine: Engine, run_id: int, outcome: Outcome) -> None:
    with Session(engine) as session:
        session.exec(
            update(_table)
            .where(_table.c.id == run_id, _table.c.status == "running")
            .values(status=outcome.status, result=outcome.result, error=outcome.error, finished_at=utcnow())
        )
        session.commit()


def fail_interrupted(engine: Engine, reason: str = INTERRUPTED) -> int:
    """Mark every `running` run failed. Only safe while holding the runner lock (see the module
    docstring): then none of them can still be running. Returns how many."""
    with Session(engine) as session:
        count = session.exec(
            update(_table).where(_table.c.status == "running").values(status="failed", error=reason, finished_at=utcnow())
        ).rowcount
        session.commit()
        return count


def queue_position(session: Session, run: LabRun) -> int:
    """How many runs go before this queued one (the running one included)."""
    ahead = select(func.count()).select_from(LabRun).where(
        (LabRun.status == "running") | ((LabRun.status == "queued") & (LabRun.id < run.id))
    )
    return session.exec(ahead).one()


def latest_done(session: Session, lab_id: str) -> LabRun | None:
    """The lab's latest finished run (by finish time, as export-anki picks it); None if never done."""
    query = select(LabRun).where(LabRun.lab_id == lab_id, LabRun.status == "done")
    return session.exec(query.order_by(LabRun.finished_at.desc(), LabRun.id.desc()).limit(1)).first()


def latest_done_by_lab(session: Session) -> dict[str, LabRun]:
    """latest_done for every lab, in one query."""
    done = LabRun.status == "done"
    last = select(LabRun.lab_id, func.max(LabRun.finished_at).label("at")).where(done).group_by(LabRun.lab_id).subquery()
    query = select(LabRun).join(last, (LabRun.lab_id == last.c.lab_id) & (LabRun.finished_at == last.c.at)).where(done)
    return {run.lab_id: run for run in session.exec(query.order_by(LabRun.id)).all()}


def expected_seconds(session: Session, run: LabRun) -> float | None:
    """How long the lab's latest done run with the same parameters took: the page's "of about N s"."""
    query = (
        select(LabRun.params, LabRun.started_at, LabRun.finished_at)
        .where(LabRun.lab_id == run.lab_id, LabRun.status == "done", LabRun.id != run.id)
        .order_by(LabRun.id.desc())
        .limit(10)  # only the small columns: this runs on every poll
    )
    for params, started, finished in session.exec(query).all():
        if params == run.params and started and finished:
            return round((finished - started).total_seconds(), 1)
    return None


def run_json(session: Session, run: LabRun, now: datetime | None = None) -> dict[str, Any]:
    """The JSON API's view of a run: status and, once over, the lab's JSON or {"error": ...}."""
    now = now or utcnow()
    started, finished = aware(run.started_at), aware(run.finished_at)
    body: dict[str, Any] = {
        "run_id": run.id,
        "lab_id": run.lab_id,
        "status": run.status,
        "params": run.params,
        "created_at": aware(run.created_at).isoformat(),
        "started_at": started.isoformat() if started else None,
        "finished_at": finished.isoformat() if finished else None,
        "elapsed_s": round(((finished or now) - started).total_seconds(), 1) if started else None,
        "result": None,
    }
    if run.status in ("queued", "running"):
        body["expected_s"] = expected_seconds(session, run)
    if run.status == "queued":
        body["queue_position"] = queue_position(session, run)
    elif run.status == "done":
        body["result"] = run.result
    elif run.status == "failed":
        body["result"] = {"error": run.error or "failed"}
        body["error"] = run.error or "failed"
    return body


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


def execute(
    engine: Engine,
    run: LabRun,
    command: Sequence[str],
    timeout_s: float,
    on_start: Callable[[subprocess.Popen], None] | None = None,
) -> Outcome:
    """Run a claimed (`running`) run to its end and store the outcome; never leaves it running."""
    try:
        argv = lab_argv(command, run.lab_id, int(run.params.get("world_size", 0)))
        outcome = run_lab_process(argv, run.lab_id, timeout_s, on_start=on_start)
    except (OSError, ValueError) as error:
        outcome = Outcome("failed", error=f"could not start the lab: {error}")
    except Exception as error:  # noqa: BLE001 - whatever went wrong, the row must not stay running
        outcome = Outcome("failed", error=f"the runner failed: {type(error).__name__}: {error}")
    finish(engine, run.id, outcome)
    return outcome


class LabWorker:
    """One thread that runs queued lab runs, oldest first, one at a time."""

    def __init__(self, app: Flask):
        self.app = app
        self.engine = get_engine(app)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._process: subprocess.Popen | None = None
        self._thread: threading.Thread | None = None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="lab-worker", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self, timeout_s: float = 15.0) -> None:
        """Stop the thread, killing the lab it runs (its row becomes failed, never stays running)."""
        self._stop.set()
        self._wake.set()
        process = self._process
        if process is not None and process.poll() is None:
            kill_group(process)
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _loop(self) -> None:
        with runner_lock(lock_path(self.app), stop=self._stop) as held:
            if held:
                cut_off = fail_interrupted(self.engine)
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

    def run_next(self) -> bool:
        """Run the oldest queued run, if any; whether one ran."""
        with Session(self.engine) as session:
            if session.exec(select(LabRun.id).where(LabRun.status == "queued").limit(1)).first() is None:
                return False
        with runner_lock(lock_path(self.app), stop=self._stop) as held:
            if not held:
                return False
            run = claim_next(self.engine)
            if run is None:
                return False
            config = self.app.config
            outcome = execute(self.engine, run, lab_command(self.app), float(config["LAB_TIMEOUT_S"]), self._started)
            self._process = None
            if self._stop.is_set() and outcome.status == "failed":
                finish_shutdown(self.engine, run.id)
        return True

    def _started(self, process: subprocess.Popen) -> None:
        self._process = process
        if self._stop.is_set():  # stop() came between the claim and the start
            kill_group(process)


def finish_shutdown(engine: Engine, run_id: int) -> None:
    with Session(engine) as session:
        session.exec(update(_table).where(_table.c.id == run_id, _table.c.status == "failed").values(error=SHUTDOWN))
        session.commit()


def worker(app: Flask) -> LabWorker | None:
    return app.extensions.get(_WORKER_KEY)


def start_worker(app: Flask) -> LabWorker:
    """Start the app's worker (once): it first marks runs cut off by a restart failed, then runs
    the queue, including runs queued before the restart."""
    running = worker(app)
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
    running = worker(app)
    if running is not None and running.alive:
        running.wake()
    elif autostart:
        start_worker(app)


# --- the CLI ----------------------------------------------------------------------------------

labs_group = AppGroup("labs", help="Run the labs and store their results (what the lab pages and export-anki show).")


@labs_group.command("run-all")
@click.option("--world-size", type=int, default=None, help="Ranks per lab (default: the first allowed, 2).")
def run_all_command(world_size: int | None) -> None:
    """Run every lab, one after another, each in its own process; store each result as a lab run."""
    app = current_app._get_current_object()
    allowed = world_sizes(app)
    world_size = allowed[0] if world_size is None else world_size
    if world_size not in allowed:
        raise click.UsageError(f"--world-size must be one of {', '.join(map(str, allowed))}")
    engine, command = get_engine(app), lab_command(app)
    timeout_s = float(app.config["LAB_TIMEOUT_S"])
    outcomes: list[tuple[str, Outcome, float]] = []
    with runner_lock(lock_path(app), wait=False) as free:
        if not free:
            click.echo("a lab is running (in the server?); waiting for it to finish ...", err=True)
    with click.progressbar(list(LABS), label=f"labs at {world_size} ranks", item_show_func=lambda lab: lab) as bar:
        for lab_id in bar:
            with runner_lock(lock_path(app)):
                with Session(engine, expire_on_commit=False) as session:
                    run = LabRun(lab_id=lab_id, params={"world_size": world_size}, status="running",
                                 created_at=utcnow(), started_at=utcnow())
                    session.add(run)
                    session.commit()
                started = time.monotonic()
                outcomes.append((lab_id, execute(engine, run, command, timeout_s), time.monotonic() - started))
    for lab_id, outcome, seconds in outcomes:
        if outcome.status == "failed":
            verdict = "FAILED: " + (outcome.error or "").splitlines()[0]
        else:
            verdict = "holds" if outcome.result.get("holds") else "does NOT hold"
        click.echo(f"{lab_id:32} {seconds:6.1f} s  {verdict}")
    held = sum(1 for _, outcome, _ in outcomes if outcome.status == "done" and outcome.result.get("holds"))
    click.echo(f"{held} of {len(outcomes)} claims held; results stored (the lab pages and export-anki use them).")
    if held < len(outcomes):
        raise SystemExit(1)


def init_app(app: Flask) -> None:
    for key, value in DEFAULTS.items():
        app.config.setdefault(key, value)
