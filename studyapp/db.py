"""The database: one engine per app, one session per request, the schema in one place.

Any SQLAlchemy URL works (`DATABASE_URL` in the config, or `STUDYAPP_DATABASE_URL`);
the default is an SQLite file in the Flask instance folder.
"""

from __future__ import annotations

from flask import Flask, current_app, g
from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlmodel import Session, create_engine

from studyapp import migrate

_ENGINE_KEY = "studyapp.engine"


def make_engine(url: str) -> Engine:
    """An engine for `url`; SQLite gets the settings a threaded web server needs."""
    if not url.startswith("sqlite"):
        return create_engine(url, pool_pre_ping=True)
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

    @event.listens_for(engine, "connect")
    def _sqlite_pragmas(dbapi_connection, _record) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA foreign_keys = ON")
        if ":memory:" not in url and url != "sqlite://":
            # WAL: readers never block the writer; NORMAL: a committed review survives a
            # killed process (only a power cut can lose the last commits).
            cursor.execute("PRAGMA journal_mode = WAL")
            cursor.execute("PRAGMA synchronous = NORMAL")
            # Checkpoints fsync; every 10,000 pages (~40 MB of WAL) instead of 1,000 spreads
            # that cost over ten times more reviews.
            cursor.execute("PRAGMA wal_autocheckpoint = 10000")
        cursor.close()

    return engine


def upgrade_schema(engine: Engine) -> None:
    """Bring the database's schema up to date: the Alembic migrations (studyapp.migrate),
    the one place the schema is created or changed."""
    migrate.upgrade(engine)


def get_engine(app: Flask | None = None) -> Engine:
    return (app or current_app).extensions[_ENGINE_KEY]


def get_session() -> Session:
    """The request's session, opened on first use and closed at teardown."""
    if "db_session" not in g:
        g.db_session = Session(get_engine(), expire_on_commit=False)
    return g.db_session


def close_session(_error: BaseException | None = None) -> None:
    session = g.pop("db_session", None)
    if session is not None:
        session.close()


def init_app(app: Flask) -> None:
    engine = make_engine(app.config["DATABASE_URL"])
    app.extensions[_ENGINE_KEY] = engine
    upgrade_schema(engine)
    app.teardown_appcontext(close_session)
