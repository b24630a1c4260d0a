"""Schema migrations: Alembic, configured in code, with the scripts in studyapp/migrations/.

`upgrade(engine)` brings any database to the newest revision: an empty one is built by the
migrations from scratch, one made before migrations existed (tables but no alembic_version)
is stamped at revision 0001 (the schema it has) and then upgraded. The app calls it on start (the
command line: before a command first uses the database); `studyapp db upgrade` runs it by hand.
Adding a revision: `studyapp db revision -m ...`
writes a new script into studyapp/migrations/versions/ from the difference to the models.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

import click
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from flask import current_app
from flask.cli import AppGroup
from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection, Engine

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
FIRST_REVISION = "0001"  # the schema SQLModel's create_all made before migrations
APP_TABLES = frozenset({"deck", "card", "reviewlog", "labrun"})
log = logging.getLogger(__name__)
_PG_LOCK_KEY = 7_210_531  # any constant: serialises migrations of app processes starting together


class SchemaError(CommandError):
    """The database's tables are in a state no revision describes: a migration refused, as alembic's
    own CommandError is (so the command line says it in one line)."""


def alembic_config(connection: Connection | None = None) -> Config:
    """Alembic's Config without an ini file; env.py migrates `connection`."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["connection"] = connection
    return config


@lru_cache(maxsize=1)
def _scripts() -> ScriptDirectory:
    return ScriptDirectory.from_config(alembic_config())


def head_revision() -> str:
    return _scripts().get_current_head()


def _known(revision: str) -> bool:
    try:
        _scripts().get_revision(revision)
    except CommandError:
        return False
    return True


def _check_revision(revision: str) -> None:
    """Refuse an empty revision, or `branch@` with no id after the @: alembic would fail an assertion
    on it (a traceback), where any other revision it cannot find is a CommandError."""
    if not revision.rpartition("@")[2].strip():  # what follows the @, or the whole revision without one
        raise CommandError(f"{revision!r} is not a revision: name one such as head, base or {head_revision()}")


def _behind(revision: str, current: str) -> bool:
    """Whether `revision` is `current`'s ancestor (or base): alembic's upgrade to it does nothing at all."""
    target = _scripts().get_revision(revision)  # None: base
    if target is None:
        return True
    return target.revision != current and target.revision in {s.revision for s in _scripts().walk_revisions("base", current)}


def current_revision(engine: Engine) -> str | None:
    """The revision the database is stamped at (None: not under migrations yet)."""
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def _adopt_unversioned(connection: Connection) -> bool:
    """Stamp a pre-migrations database at FIRST_REVISION (returns True); refuse a partial one."""
    tables = set(inspect(connection).get_table_names())
    if "alembic_version" in tables:
        return False
    present = APP_TABLES & tables
    if present == APP_TABLES:
        command.stamp(alembic_config(connection), FIRST_REVISION)
        return True
    if present:
        raise SchemaError(
            f"the database has some of the app's tables ({', '.join(sorted(present))}) but not "
            f"{', '.join(sorted(APP_TABLES - present))}, and no migration history: restore it from a backup"
        )
    return False


@contextmanager
def _one_migrator(connection: Connection) -> Iterator[None]:
    """Let one process migrate at a time: app processes starting together must not both build
    the schema. SQLite: take the write lock now, held to the commit (its DDL is transactional);
    PostgreSQL: an advisory lock for the session."""
    dialect = connection.dialect.name
    if dialect == "sqlite":
        connection.exec_driver_sql("BEGIN IMMEDIATE")
    elif dialect == "postgresql":
        connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": _PG_LOCK_KEY})
    try:
        yield
    finally:
        if dialect == "postgresql":
            connection.rollback()  # after a failure; a no-op after the commit
            connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": _PG_LOCK_KEY})
            connection.commit()


def upgrade(engine: Engine, revision: str = "head") -> str | None:
    """Migrate the database to `revision` (default: the newest), all in one transaction.
    Returns the revision it is at. An unknown revision is refused before the database is opened
    (alembic's CommandError), so it creates no file; one behind the database's is refused too (CommandError,
    nothing changed): only `downgrade` goes back, which drops data."""
    _check_revision(revision)
    _scripts().get_revision(revision)
    with engine.connect() as connection, _one_migrator(connection):
        adopted = _adopt_unversioned(connection)
        before = MigrationContext.configure(connection).get_current_revision()
        if before is not None and not _known(before):
            raise SchemaError(f"the database is at revision {before}, which this version of the app does not have "
                              f"(its newest is {head_revision()}): it was made by a newer version; use that one")
        if before is not None and _behind(revision, before):
            raise CommandError(f"the database is at revision {before}, past {revision}: an upgrade only moves forward; "
                               "nothing was changed")
        command.upgrade(alembic_config(connection), revision)
        connection.commit()
        after = MigrationContext.configure(connection).get_current_revision()
    if adopted or (before is not None and after != before):
        # Worth a line on the console: existing data went through a migration.
        log.warning("database schema upgraded from %s to %s", "before migrations" if adopted else before, after)
    elif after != before:
        log.info("database schema created at revision %s", after)
    return after


def downgrade(engine: Engine, revision: str) -> str | None:
    """Migrate back to `revision` (for testing upgrades; data in dropped columns is lost)."""
    _check_revision(revision)
    with engine.connect() as connection, _one_migrator(connection):
        command.downgrade(alembic_config(connection), revision)
        connection.commit()
        return MigrationContext.configure(connection).get_current_revision()


# --- `studyapp db ...` ------------------------------------------------------------------

db_group = AppGroup("db", help="The database schema (Alembic migrations).")


def _engine() -> Engine:
    from studyapp.db import get_engine

    return get_engine(current_app._get_current_object(), at_head=False)


@db_group.command("upgrade")
@click.argument("revision", default="head")
def db_upgrade_command(revision: str) -> None:
    """Migrate the database to REVISION (default: head, the newest)."""
    click.echo(f"database at revision {upgrade(_engine(), revision)} (head is {head_revision()})")


@db_group.command("current")
def db_current_command() -> None:
    """Print the database's revision and the newest one; a database that does not exist is left so."""
    engine = _engine()
    path = engine.url.database
    if engine.dialect.name == "sqlite" and path and path != ":memory:" and not Path(path).exists():
        folder = Path(path).parent
        if not folder.is_dir():  # `db upgrade` could not make it: SQLite makes the file, never its folder
            raise click.ClickException(f"no database at {path}, and its folder {folder} does not exist: make the "
                                       "folder, or set STUDYAPP_DATABASE_URL to a file in one that does")
        click.echo(f"no database at {path} yet (head is {head_revision()}): `studyapp db upgrade` makes it")
        return
    click.echo(f"database at revision {current_revision(engine) or 'unversioned'} (head is {head_revision()})")


@db_group.command("revision")
@click.option("-m", "--message", required=True, help="What the revision changes, in a few words.")
def db_revision_command(message: str) -> None:
    """Write a new migration script from the difference between the models and the database."""
    with _engine().connect() as connection:
        command.revision(alembic_config(connection), message=message, autogenerate=True)
