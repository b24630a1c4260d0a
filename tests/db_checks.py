"""Checks on a database that tests share: every row of every table (to prove nothing changed
or nothing was lost), and the integrity check that every card's whole schedule (SM-2 state,
due day, repeat day, last review time) equals the replay of its review log."""

from __future__ import annotations

from sqlalchemy import MetaData, select, text
from sqlalchemy.engine import Engine
from sqlmodel import Session

from studyapp import sm2
from studyapp.migrate import APP_TABLES
from studyapp.models import Card, ReviewLog
from studyapp.study import Schedule, replayed_schedule, schedule_after


def table_rows(engine: Engine, skip_columns: frozenset[str] = frozenset()) -> dict[str, list[tuple]]:
    """Every row of every app table, in primary-key order."""
    metadata = MetaData()
    metadata.reflect(engine)
    rows = {}
    with engine.connect() as connection:
        for name in sorted(APP_TABLES):
            table = metadata.tables[name]
            columns = [c for c in table.columns if c.name not in skip_columns]
            rows[name] = [tuple(row) for row in connection.execute(select(*columns).order_by(*table.primary_key))]
    return rows


def assert_cards_replay(engine: Engine) -> int:
    """Every card's scheduling fields equal the replay of its live log, grade by grade from a new
    card, and each live log row's before/after columns are the replay's steps; returns how many
    cards were checked."""
    with Session(engine) as session:
        cards = session.exec(select(Card)).scalars().all()
        logs = session.exec(select(ReviewLog).where(ReviewLog.undone_at.is_(None)).order_by(ReviewLog.id)).scalars().all()
        by_card: dict[int, list[ReviewLog]] = {}
        for log in logs:
            by_card.setdefault(log.card_id, []).append(log)
        for card in cards:
            schedule, last_reviewed_at = Schedule(0, sm2.INITIAL_EASINESS, 0, None, None), None
            for log in by_card.get(card.id, []):
                before = (log.before_repetitions, log.before_easiness, log.before_interval, log.before_due_day,
                          log.before_repeat_day, log.before_last_reviewed_at)
                assert before == (*_fields(schedule), last_reviewed_at), (card.question_id, log.id, "before")
                schedule = schedule_after(schedule, log.quality, log.is_repeat, log.study_day)
                last_reviewed_at = log.reviewed_at
                after = (log.after_repetitions, log.after_easiness, log.after_interval, log.after_due_day,
                         log.after_repeat_day)
                assert after == _fields(schedule), (card.question_id, log.id, "after")
            stored = (*_fields(Schedule.of(card)), card.last_reviewed_at)
            assert stored == (*_fields(schedule), last_reviewed_at), card.question_id
            assert card.state == replayed_schedule(session, card.id), card.question_id  # the app's own replay agrees
    return len(cards)


def _fields(schedule: Schedule) -> tuple:
    return (schedule.repetitions, schedule.easiness, schedule.interval, schedule.due_day, schedule.repeat_day)


def assert_sqlite_intact(engine: Engine) -> None:
    """SQLite's own check of the file's structure (pages, indexes, constraints)."""
    if engine.dialect.name != "sqlite":
        return
    with engine.connect() as connection:
        assert connection.execute(text("PRAGMA integrity_check")).scalars().all() == ["ok"]
        assert connection.execute(text("PRAGMA foreign_key_check")).all() == []
