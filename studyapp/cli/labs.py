"""`studyapp labs run-all`: queue every lab and run the queue here, as the server's worker would."""

from __future__ import annotations

import click
from flask import current_app
from flask.cli import AppGroup

from sharding_lab.labs.registry import LABS
from studyapp.db import get_engine
from studyapp.lab_runs import LabWorker, RunStatus, enqueue, lock_path, runner_lock, world_sizes
from studyapp.lab_runs.queue import aware
from studyapp.models import LabRun

labs_group = AppGroup("labs", help="Run the labs and store their results (what the lab pages and export-anki show).")


@labs_group.command("run-all")
@click.option("--world-size", type=int, default=None, help="Ranks N per lab (default: the first allowed, 2); a lab comparing world sizes "
              "also runs 2N (and 1).")
def run_all_command(world_size: int | None) -> None:
    """Queue every lab and run the queue, one lab at a time, on warm ranks the labs share (one pool
    per world size, ended when the command ends); each result is stored with its run."""
    app = current_app._get_current_object()
    allowed = world_sizes(app)
    world_size = allowed[0] if world_size is None else world_size
    if world_size not in allowed:
        raise click.UsageError(f"--world-size must be one of {', '.join(map(str, allowed))}")
    queued = [enqueue(get_engine(app), lab_id, world_size) for lab_id in LABS]
    with runner_lock(lock_path(app), wait=False) as free:
        if not free:
            click.echo("a lab is running (in the server?); waiting for it to finish ...", err=True)
    worker = LabWorker(app)
    finished: list[LabRun] = []
    label = f"labs at {world_size} ranks"
    try:
        with click.progressbar(queued, label=label, item_show_func=lambda run: run and run.lab_id) as bar:
            for run in bar:
                finished.append(worker.run_until_over(run.id))
    finally:
        worker.stop()  # the lab server and its ranks with it
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
