"""The lab-run queue: LabRun rows and the moves between their states (RunStatus).

    queued --(claimed)--> running --> done   (the lab's JSON, whether or not its claim held)
       |                          \\-> failed (timeout, crash, no JSON: the error says which)
       \\--(cancelled)--> failed   (its error says so: the schema has no cancelled status)

Every run goes through here, from the web page and from `studyapp labs run-all` alike; the
worker (studyapp.lab_runs.worker) claims and finishes them. Times are the real wall clock (runs
are real processes), not the app's study CLOCK.
"""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import func, update
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from sharding_lab.labs.registry import LABS
from sharding_lab.run_config import DEVICES
from studyapp.lab_runs.process import Outcome, run_params
from studyapp.models import LabRun, RunStatus

ACTIVE = (RunStatus.queued, RunStatus.running)
PLAN_SIMULATION = "plan:simulate"  # the job kind of a plan simulation (studyapp.lab_runs.plan_runs)
_table = LabRun.__table__


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def aware(moment: datetime | None) -> datetime | None:
    """SQLite hands back UTC datetimes without their offset; put it back."""
    if moment is not None and moment.tzinfo is None:
        return moment.replace(tzinfo=timezone.utc)
    return moment


# --- moves ------------------------------------------------------------------------------------


def enqueue(engine: Engine, lab_id: str, world_size: int, device: str = "cpu") -> LabRun:
    """Queue a run of a registered lab on `world_size` ranks on `device` (run_config.DEVICES); the same
    lab and parameters already waiting or running is that run (a double click queues nothing twice)."""
    if lab_id not in LABS:
        raise ValueError(f"unknown lab {lab_id!r}")
    if device not in DEVICES:
        raise ValueError(f"unknown device {device!r}; choose one of {', '.join(DEVICES)}")
    params = {"world_size": world_size, "device": device}
    with Session(engine, expire_on_commit=False) as session:
        for run in active_runs(session, lab_id):
            if run_params(run.params) == params:
                return run
        run = LabRun(lab_id=lab_id, params=params, status=RunStatus.queued, created_at=utcnow())
        session.add(run)
        session.commit()
        return run


def claim_next(engine: Engine) -> LabRun | None:
    """Atomically turn the oldest queued run into a running one; None when nothing is queued.
    The conditional UPDATE is the claim: of two claimants only one changes the row."""
    with Session(engine, expire_on_commit=False) as session:
        while True:
            run_id = next_queued(session)
            if run_id is None:
                return None
            claimed = session.exec(
                update(_table)
                .where(_table.c.id == run_id, _table.c.status == RunStatus.queued)
                .values(status=RunStatus.running, started_at=utcnow())
            ).rowcount
            session.commit()
            if claimed == 1:
                return session.get(LabRun, run_id, populate_existing=True)


def finish(engine: Engine, run_id: int, outcome: Outcome) -> None:
    with Session(engine) as session:
        session.exec(
            update(_table)
            .where(_table.c.id == run_id, _table.c.status == RunStatus.running)
            .values(status=outcome.status, result=outcome.result, error=outcome.error, finished_at=utcnow())
        )
        session.commit()


def fail_interrupted(engine: Engine, reason: str) -> int:
    """Mark every `running` run failed. Only safe while holding the runner lock (see
    studyapp.lab_runs.worker): then none of them can still be running. Returns how many."""
    with Session(engine) as session:
        count = session.exec(
            update(_table)
            .where(_table.c.status == RunStatus.running)
            .values(status=RunStatus.failed, error=reason, finished_at=utcnow())
        ).rowcount
        session.commit()
        return count


def cancel_queued(engine: Engine, run_ids: list[int], reason: str) -> int:
    """Mark those of `run_ids` still queued failed with `reason` (one claimed meanwhile runs on). Returns how many."""
    with Session(engine) as session:
        count = session.exec(
            update(_table)
            .where(_table.c.id.in_(run_ids), _table.c.status == RunStatus.queued)
            .values(status=RunStatus.failed, error=reason, finished_at=utcnow())
        ).rowcount
        session.commit()
        return count


# --- queries ----------------------------------------------------------------------------------


def next_queued(session: Session) -> int | None:
    """The id of the oldest queued run, if any."""
    return session.exec(select(LabRun.id).where(LabRun.status == RunStatus.queued).order_by(LabRun.id).limit(1)).first()


def active_runs(session: Session, lab_id: str) -> list[LabRun]:
    """The lab's runs still waiting or running, oldest first."""
    query = select(LabRun).where(LabRun.lab_id == lab_id, LabRun.status.in_(ACTIVE)).order_by(LabRun.id)
    return list(session.exec(query).all())


def queue_position(session: Session, run: LabRun) -> int:
    """How many runs go before this queued one (the running one included)."""
    ahead = select(func.count()).select_from(LabRun).where(
        (LabRun.status == RunStatus.running) | ((LabRun.status == RunStatus.queued) & (LabRun.id < run.id))
    )
    return session.exec(ahead).one()


def latest_done(session: Session, lab_id: str | None = None) -> dict[str, LabRun]:
    """Each lab's latest finished (done) run, by finish time then id: what the lab pages, the cards
    and export-anki show. Only `lab_id`'s when given; a lab never done is absent."""
    done = LabRun.status == RunStatus.done
    if lab_id is not None:
        done &= LabRun.lab_id == lab_id
    else:  # labs only: a plan simulation (studyapp.lab_runs.plan_runs) is not a lab's finding
        done &= LabRun.lab_id != PLAN_SIMULATION
    last = select(LabRun.lab_id, func.max(LabRun.finished_at).label("at")).where(done).group_by(LabRun.lab_id).subquery()
    query = select(LabRun).join(last, (LabRun.lab_id == last.c.lab_id) & (LabRun.finished_at == last.c.at)).where(done)
    return {run.lab_id: run for run in session.exec(query.order_by(LabRun.id)).all()}


def expected_seconds(session: Session, run: LabRun) -> float | None:
    """How long the lab's latest done run with the same parameters took: the page's "of about N s"."""
    query = (
        select(LabRun.params, LabRun.started_at, LabRun.finished_at)
        .where(LabRun.lab_id == run.lab_id, LabRun.status == RunStatus.done, LabRun.id != run.id)
        .order_by(LabRun.id.desc())
        .limit(10)  # only the small columns: this runs on every poll
    )
    for params, started, finished in session.exec(query).all():
        if run_params(params) == run_params(run.params) and started and finished:
            return round((finished - started).total_seconds(), 1)
    return None
