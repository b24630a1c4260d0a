"""Checks on a database that tests share: every row of every table (to prove nothing changed
or nothing was lost), and the integrity check that every card's schedule equals the replay of
its review log."""

from __future__ import annotations

from sqlalchemy import MetaData, select, text
from sqlalchemy.engine import Engine
from sqlmodel import Session

from studyapp.migrate import APP_TABLES
from studyapp.models import Card
from studyapp.study import replayed_schedule


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
    """Every card's SM-2 state equals the replay of its live log; returns how many cards were checked."""
    with Session(engine) as session:
        cards = session.exec(select(Card)).scalars().all()
        for card in cards:
            assert card.state == replayed_schedule(session, card.id), card.question_id
    return len(cards)


def assert_sqlite_intact(engine: Engine) -> None:
    """SQLite's own check of the file's structure (pages, indexes, constraints)."""
    if engine.dialect.name != "sqlite":
        return
    with engine.connect() as connection:
        assert connection.execute(text("PRAGMA integrity_check")).scalars().all() == ["ok"]
        assert connection.execute(text("PRAGMA foreign_key_check")).all() == []
