"""The database: one engine per app, one session per request, the schema in one place, and
DirectStatement and driver_transaction for a hot path that SQLAlchemy's per-call machinery would slow.

Any SQLAlchemy URL works (`DATABASE_URL` in the config, or `STUDYAPP_DATABASE_URL`);
the default is an SQLite file in the Flask instance folder.
"""

from __future__ import annotations

import sqlite3
import time
import weakref
from collections import namedtuple
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from flask import Flask, current_app, g
from sqlalchemy import event
from sqlalchemy.engine import Connection, Dialect, Engine, make_url
from sqlalchemy.exc import DBAPIError, NoSuchModuleError
from sqlalchemy.sql import Executable
from sqlmodel import Session, create_engine

from studyapp import migrate

_ENGINE_KEY = "studyapp.engine"
_AT_HEAD_KEY = "studyapp.schema_at_head"  # whether this app has brought its database to the newest revision


SQLITE_BUSY_TIMEOUT_S = 30  # how long a statement waits for another connection's lock


def _switch_to_wal(cursor, deadline: float) -> None:
    """`PRAGMA journal_mode = WAL`, retried until `deadline`: a new database's first switch needs the file
    to itself, and SQLite answers "database is locked" at once, without its busy timeout, while another
    process is opening it (seen with six app processes starting together on a new database)."""
    while True:
        try:
            cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _create_engine(url: str, **options: Any) -> Engine:
    """create_engine, with a driver that is not installed said as the URL's problem (cli.errors
    prints an ArgumentError in one line; an ImportError would be a traceback)."""
    try:
        return create_engine(url, **options)
    except ImportError as error:
        advice = ""
        if make_url(url).get_backend_name() == "postgresql":  # the one server database the README offers
            advice = "; install it with `.venv/bin/pip install -e '.[postgres]'` and use a postgresql+psycopg:// URL"
        raise NoSuchModuleError(f"its driver is not installed ({error}){advice}") from error


def make_engine(url: str) -> Engine:
    """An engine for `url`; SQLite gets the settings a threaded web server needs."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return _create_engine(url, pool_pre_ping=True)
    # As SQLAlchemy tells memory from a file (sqlite+pysqlite:// is in memory too): one connection
    # per thread, no queue to order.
    in_memory = parsed.database in (None, "", ":memory:")
    # LIFO: a request gets the connection returned last. SQLite drops a connection's page cache when
    # another connection has written since its last read, so after a burst of concurrent requests a
    # FIFO pool hands each request a cold one (a grade's statements measured ~25% slower).
    engine = _create_engine(url, **({} if in_memory else {"pool_use_lifo": True}),
                            connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_S})

    @event.listens_for(engine, "connect")
    def _sqlite_pragmas(dbapi_connection, _record) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA foreign_keys = ON")
        if not in_memory:
            # WAL: readers never block the writer; NORMAL: a committed review survives a
            # killed process (only a power cut can lose the last commits).
            try:
                _switch_to_wal(cursor, deadline=time.monotonic() + SQLITE_BUSY_TIMEOUT_S)
            except sqlite3.DatabaseError as error:
                if getattr(error, "sqlite_errorname", None) != "SQLITE_NOTADB":
                    raise
                # The URL names a file that is no SQLite database: a wrong path, as one SQLite cannot
                # open is, so the same OperationalError (one line on the command line, not a traceback).
                raise sqlite3.OperationalError(str(error)) from error
            cursor.execute("PRAGMA synchronous = NORMAL")
            # Checkpoints fsync; every 10,000 pages (~40 MB of WAL) instead of 1,000 spreads
            # that cost over ten times more reviews.
            cursor.execute("PRAGMA wal_autocheckpoint = 10000")
        cursor.close()

    return engine


@dataclass
class _Compiled:
    """A statement as one dialect runs it: its SQL, the bound values in the order the driver takes
    them, each with SQLAlchemy's conversion for that dialect (None: passed as it is)."""

    sql: str
    binds: list[tuple[str, Callable[[Any], Any] | None]]  # each bound value's name and conversion
    driver_names: list[str] | None  # a dialect with named parameters: the names as the SQL spells them
    row_processors: list[Callable[[Any], Any] | None] | None = None  # set on the first result


def _as_sqlalchemy_error(dialect: Dialect, sql: str, parameters: Any, error: Exception) -> DBAPIError:
    """A driver's error as SQLAlchemy raises it (IntegrityError, OperationalError, ...), so code on the
    hot path catches the same exceptions as code on SQLAlchemy's own."""
    return DBAPIError.instance(sql, parameters, error, dialect.loaded_dbapi.Error)


@dataclass(frozen=True)
class DriverConnection:
    """A pooled driver connection in a transaction, with its dialect: what a DirectStatement runs on
    (as it runs on SQLAlchemy's Connection, which has both)."""

    dialect: Dialect
    connection: Any  # the pool's proxy of the driver's connection (cursor, commit, rollback, close)


@contextmanager
def driver_transaction(engine: Engine) -> Iterator[DriverConnection]:
    """One transaction straight on a pooled driver connection, for a hot path: committed when the block
    ends, rolled back when it raises; the connection goes back to the pool either way. It skips the ORM
    session's and Core's transaction bookkeeping, which costs more than a grade's statements (the
    profile in the README's benchmark section). Errors are SQLAlchemy's, as DirectStatement's are."""
    dbapi = engine.raw_connection()
    try:
        yield DriverConnection(engine.dialect, dbapi)
        try:
            dbapi.commit()
        except engine.dialect.loaded_dbapi.Error as error:
            raise _as_sqlalchemy_error(engine.dialect, "COMMIT", None, error) from error
    except BaseException:
        dbapi.rollback()
        raise
    finally:
        dbapi.close()


class DirectStatement:
    """A Core statement run straight on the driver's cursor of a connection already in a transaction,
    for a hot path: the same SQL and the same stored and loaded values as `connection.execute`
    (compiled by SQLAlchemy once per dialect, each value through that dialect's type processors),
    without the per-call machinery (execution context, events, result objects) that costs more than
    the statement itself. Driver errors come out as SQLAlchemy's (IntegrityError, OperationalError).
    Only for statements whose values are all named bind parameters."""

    def __init__(self, statement: Executable, column_keys: list[str] | None = None):
        self.statement = statement
        self.column_keys = column_keys  # an INSERT without .values(): the columns it sets
        self.columns = list(statement.exported_columns)  # what a SELECT or RETURNING gives back
        self.row = namedtuple("Row", [column.key for column in self.columns]) if self.columns else None
        self._compiled: weakref.WeakKeyDictionary[Dialect, _Compiled] = weakref.WeakKeyDictionary()

    def rows(self, connection: Connection | DriverConnection, params: Mapping[str, Any]) -> list:
        """The rows it returns (a SELECT, or RETURNING), as named tuples."""
        compiled, cursor = self._run(connection, params)
        try:
            fetched = cursor.fetchall()
            if compiled.row_processors is None:  # they may depend on the type the driver reports
                dialect = connection.dialect
                compiled.row_processors = [
                    column.type.dialect_impl(dialect).result_processor(dialect, described[1])
                    for column, described in zip(self.columns, cursor.description, strict=True)
                ]
        finally:
            cursor.close()
        processors = compiled.row_processors
        return [self.row(*[value if p is None else p(value) for p, value in zip(processors, row, strict=True)])
                for row in fetched]

    def rowcount(self, connection: Connection | DriverConnection, params: Mapping[str, Any]) -> int:
        """How many rows it changed (an UPDATE or DELETE)."""
        _, cursor = self._run(connection, params)
        try:
            return cursor.rowcount
        finally:
            cursor.close()

    def _run(self, connection: Connection | DriverConnection, params: Mapping[str, Any]):
        dialect = connection.dialect
        compiled = self._compiled.get(dialect) or self._compile(dialect)
        values = [params[name] if p is None else p(params[name]) for name, p in compiled.binds]
        parameters = tuple(values) if compiled.driver_names is None else dict(zip(compiled.driver_names, values, strict=True))
        cursor = connection.connection.cursor()
        try:
            cursor.execute(compiled.sql, parameters)
        except dialect.loaded_dbapi.Error as error:
            cursor.close()
            raise _as_sqlalchemy_error(dialect, compiled.sql, parameters, error) from error
        return compiled, cursor

    def _compile(self, dialect: Dialect) -> _Compiled:
        compiled = self.statement.compile(dialect=dialect, column_keys=self.column_keys)
        names = list(compiled.positiontup) if dialect.positional else list(compiled.binds)
        binds = [(name, compiled.binds[name].type.dialect_impl(dialect).bind_processor(dialect)) for name in names]
        driver_names = None if dialect.positional else [compiled.escaped_bind_names.get(name, name) for name in names]
        self._compiled[dialect] = entry = _Compiled(compiled.string, binds, driver_names)
        return entry


def upgrade_schema(engine: Engine) -> None:
    """Bring the database's schema up to date: the Alembic migrations (studyapp.migrate),
    the one place the schema is created or changed."""
    migrate.upgrade(engine)


def get_engine(app: Flask | None = None, *, at_head: bool = True) -> Engine:
    """The app's engine, its schema upgraded to the newest revision first (once per app) unless
    `at_head` is False: the `db` commands read or choose the revision themselves."""
    app = app or current_app
    if at_head and not app.extensions[_AT_HEAD_KEY]:
        upgrade_schema(app.extensions[_ENGINE_KEY])
        app.extensions[_AT_HEAD_KEY] = True
    return app.extensions[_ENGINE_KEY]


def get_session() -> Session:
    """The request's session, opened on first use and closed at teardown."""
    if "db_session" not in g:
        g.db_session = Session(get_engine(), expire_on_commit=False)
    return g.db_session


def close_session(_error: BaseException | None = None) -> None:
    session = g.pop("db_session", None)
    if session is not None:
        session.close()


def init_app(app: Flask, *, upgrade: bool = True) -> None:
    """The app's engine; with `upgrade`, the schema brought to head now, else on the first `get_engine`."""
    app.extensions[_ENGINE_KEY] = make_engine(app.config["DATABASE_URL"])
    app.extensions[_AT_HEAD_KEY] = False
    if upgrade:
        get_engine(app)
    app.teardown_appcontext(close_session)
