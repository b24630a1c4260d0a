"""What a `studyapp` command says when its database, a migration, a setting or a file fails it: one line naming
what is wrong, never a traceback. Errors of the code itself still raise as they are."""

from __future__ import annotations

from collections.abc import Callable

import click
from alembic.util.exc import CommandError
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, OperationalError

from studyapp.auth import TokenFileError
from studyapp.refusals import Refusal, refusal_of
from studyapp.study import SettingError


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def explained(error: BaseException, database_url: Callable[[], str]) -> str | None:
    """The line for an error a user can fix, or None for any other (a bug: its traceback is the report).
    `database_url` is called only when the line names the database."""
    if isinstance(error, ArgumentError):  # NoSuchModuleError included: an unknown dialect
        return f"the database URL {database_url()} is not one SQLAlchemy can open: {_first_line(error)}"
    if isinstance(error, OperationalError):  # could not connect, could not open the file, locked, ...
        refusal = refusal_of(error.orig)
        advice = "" if refusal is Refusal.OTHER else f" ({refusal.value})"
        return f"cannot use the database at {database_url()}: {_first_line(error.orig or error)}{advice}"
    if isinstance(error, CommandError):
        return f"db: {_first_line(error)}"
    if isinstance(error, (SettingError, TokenFileError)):  # each names its file and what to change
        return str(error)
    if isinstance(error, OSError) and error.strerror:
        where = f"{error.filename}: " if error.filename else ""
        return f"{where}{error.strerror}"
    return None


def shown_url(url: str) -> str:
    """A database URL as it may be printed: any password masked."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return repr(url)


def run_explained(invoke: Callable[[], object], database_url: Callable[[], str]) -> object:
    """`invoke()`, with a user's error turned into click's one-line `Error: ...` and exit status 1."""
    try:
        return invoke()
    except Exception as error:
        line = explained(error, database_url)
        if line is None:
            raise
        raise click.ClickException(line) from error
