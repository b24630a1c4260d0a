"""What a user can do when the database refuses a read or write, from the driver's own error code:
one definition, for the web app's 503, a lab result waiting to be stored and the command line's
one-line error.

"Try again in a moment" fits a database that was busy; a full disk, a read-only file or a server that
went away need something done first, and the advice says what."""

from __future__ import annotations

import sqlite3
from enum import Enum


class Refusal(Enum):
    """Why the database refused, as far as its driver says; each with what to do about it."""

    BUSY = "another writer held the database past its busy timeout: try again in a moment"
    DISK_FULL = "the disk that holds the database is full: free space on it, then try again"
    READ_ONLY = "the database is read-only (its file, its folder or its disk): make it writable, then try again"
    DISK_FAILED = "the disk failed a read or write (a full or failing disk): check the disk, then try again"
    CANNOT_OPEN = ("the database file cannot be opened: check that its folder exists and that the user running "
                   "the app may write there")
    UNREACHABLE = "the database server could not be reached or went away: check that it is running, then try again"
    OTHER = "try again in a moment"


# SQLite's primary result codes (the name before an extended code's first "_" after SQLITE_).
_SQLITE = {
    "SQLITE_BUSY": Refusal.BUSY,
    "SQLITE_LOCKED": Refusal.BUSY,
    "SQLITE_FULL": Refusal.DISK_FULL,
    "SQLITE_READONLY": Refusal.READ_ONLY,
    "SQLITE_IOERR": Refusal.DISK_FAILED,
    "SQLITE_CANTOPEN": Refusal.CANNOT_OPEN,
}

# PostgreSQL's SQLSTATE codes (psycopg's `sqlstate`), by code or by class (the first two characters).
_POSTGRES = {
    "53100": Refusal.DISK_FULL,  # disk_full
    "25006": Refusal.READ_ONLY,  # read_only_sql_transaction: a standby, or default_transaction_read_only
    "55P03": Refusal.BUSY,  # lock_not_available
    "40P01": Refusal.BUSY,  # deadlock_detected
    "57014": Refusal.BUSY,  # query_canceled: a statement or lock timeout
    "08": Refusal.UNREACHABLE,  # connection exceptions
    "57P": Refusal.UNREACHABLE,  # admin, crash or immediate shutdown; cannot connect now
}


def refusal_of(driver_error: BaseException | None) -> Refusal:
    """The refusal a driver's error (SQLAlchemy's `error.orig`) stands for; OTHER when it names none."""
    sqlite_name = getattr(driver_error, "sqlite_errorname", None)
    if isinstance(sqlite_name, str):
        for name in (sqlite_name, "_".join(sqlite_name.split("_")[:2])):  # SQLITE_IOERR_WRITE -> SQLITE_IOERR
            if name in _SQLITE:
                return _SQLITE[name]
        return Refusal.OTHER
    if hasattr(driver_error, "sqlstate"):  # psycopg
        sqlstate = driver_error.sqlstate
        if sqlstate is None:
            # Every error the server sends has a SQLSTATE: an OperationalError without one is the driver's
            # own, a connection refused, failed or lost (DB-API's name, so psycopg need not be imported).
            is_operational = any(cls.__name__ == "OperationalError" for cls in type(driver_error).__mro__)
            return Refusal.UNREACHABLE if is_operational else Refusal.OTHER
        for key in (sqlstate, sqlstate[:3], sqlstate[:2]):
            if key in _POSTGRES:
                return _POSTGRES[key]
    return Refusal.OTHER


def shown_cause(driver_error: BaseException | None) -> str | None:
    """The driver's message where anyone may read it: SQLite's names the cause and no path; another
    driver's may name its host, so only the server's log has it."""
    return str(driver_error) if isinstance(driver_error, sqlite3.Error) else None


def explained_refusal(driver_error: BaseException | None) -> str:
    """What the database said (where it may be shown) and what to do about it, in one line."""
    advice = refusal_of(driver_error).value
    cause = shown_cause(driver_error)
    return f"{cause}: {advice}" if cause else advice
