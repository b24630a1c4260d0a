"""`studyapp labs run-all`: queue every lab and run the queue here, as the server's worker would.

Ctrl-C (SIGINT) or SIGTERM stops it cleanly: the lab under way is stopped (its processes ended) and failed,
the labs it queued and had not started are cancelled, one line says how many of each, and it exits with
128 + the signal's number (130, 143). Without that a Ctrl-C left the lab `running` and the rest `queued`,
which the next `studyapp serve` called cut off by a restart and then ran anyway.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import click
from flask import current_app
from flask.cli import AppGroup
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from sharding_lab.labs.registry import LABS
from studyapp.db import get_engine
from studyapp.lab_runs import LabWorker, RunStatus, enqueue, lock_path, runner_lock, world_sizes
from studyapp.lab_runs.queue import ACTIVE, aware, cancel_queued
from studyapp.models import LabRun

labs_group = AppGroup("labs", help="Run the labs and store their results (what the lab pages and export-anki show).")

INTERRUPTIONS = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}  # what each signal is called in a run's error


def stopped_error(how: str) -> str:
    return f"interrupted ({how}): `studyapp labs run-all` was stopped while this lab ran"


def cancelled_error(how: str) -> str:
    return f"cancelled: `studyapp labs run-all` was interrupted ({how}) before this lab started"


@contextmanager
def interruptible(worker: LabWorker) -> Iterator[list[int]]:
    """While in it, SIGINT and SIGTERM stop the worker (its lab failed with `stopped_error`) instead of ending
    the process wherever it stands; yields the signals received (the first one is the one that counts)."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():  # only the main thread may handle signals
        yield received
        return

    def on_signal(signum: int, _frame) -> None:
        if not received:  # a second Ctrl-C while it stops changes nothing
            received.append(signum)
            worker.stop_soon(stopped_error(INTERRUPTIONS[signum]))

    previous = {signum: signal.signal(signum, on_signal) for signum in INTERRUPTIONS}
    try:
        yield received
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@labs_group.command("run-all")
@click.option("--world-size", type=int, default=None, help="Ranks N per lab (default: the first allowed, 2); a lab comparing world sizes "
              "also runs 2N (and 1).")
def run_all_command(world_size: int | None) -> None:
    """Queue every lab and run the queue, one lab at a time, on warm ranks the labs share (one pool
    per world size, ended when the command ends); each result is stored with its run. Ctrl-C stops the lab
    under way and cancels the rest."""
    app = current_app._get_current_object()
    engine = get_engine(app)
    allowed = world_sizes(app)
    world_size = allowed[0] if world_size is None else world_size
    if world_size not in allowed:
        raise click.UsageError(f"--world-size must be one of {', '.join(map(str, allowed))}")
    worker = LabWorker(app)
    with interruptible(worker) as received:
        with Session(engine) as session:  # runs queued already (from the app) are not this command's to cancel
            queued_before = set(session.exec(select(LabRun.id).where(LabRun.status.in_(ACTIVE))).all())
        queued = [enqueue(engine, lab_id, world_size) for lab_id in LABS]
        with runner_lock(lock_path(app), wait=False) as free:
            if not free:
                click.echo("a lab is running (in the server?); waiting for it to finish ...", err=True)
        finished: list[LabRun] = []
        label = f"labs at {world_size} ranks"
        try:
            with click.progressbar(queued, label=label, item_show_func=lambda run: run and run.lab_id) as bar:
                for run in bar:
                    if received:
                        break
                    finished.append(worker.run_until_over(run.id))
        finally:
            worker.stop()  # the lab server and its ranks with it
        if received:
            how = INTERRUPTIONS[received[0]]
            cancel_queued(engine, [run.id for run in queued if run.id not in queued_before], cancelled_error(how))
            click.echo(interrupted_line(engine, [run.id for run in queued], how), err=True)
            raise SystemExit(128 + received[0])
    for run in finished:
        seconds = (aware(run.finished_at) - aware(run.started_at)).total_seconds() if run.started_at else 0.0
        if run.status == RunStatus.failed:
            verdict = "FAILED: " + (run.error or "").splitlines()[0]
        else:
            verdict = "holds" if run.result.get("holds") else "does NOT hold"
        click.echo(f"{run.lab_id:32} {seconds:6.1f} s  {verdict}")
    held = sum(1 for run in finished if run.status == RunStatus.done and run.result.get("holds"))
    click.echo(f"{held} of {len(finished)} claims held; results stored (the lab pages and export-anki use them).")
    if held < len(finished):
        raise SystemExit(1)


def interrupted_line(engine: Engine, run_ids: list[int], how: str) -> str:
    """What became of the command's runs once it was interrupted, in one line."""
    with Session(engine) as session:
        runs = [session.get(LabRun, run_id) for run_id in run_ids]
    stopped = sum(run.error == stopped_error(how) for run in runs)
    cancelled = sum(run.error == cancelled_error(how) for run in runs)
    failed = sum(run.status == RunStatus.failed for run in runs) - stopped - cancelled
    waiting = sum(run.status in ACTIVE for run in runs)  # queued in the app before this command: its server runs them
    counts = [f"{sum(run.status == RunStatus.done for run in runs)} done", *([f"{failed} failed"] if failed else []),
              f"{stopped} stopped", f"{cancelled} cancelled",
              *([f"{waiting} left queued (queued from the app before)"] if waiting else [])]
    return f"interrupted ({how}): of {len(runs)} labs, {', '.join(counts)}; the done results are stored"
