"""What the app says to do when the database refuses: on a real full disk (a tmpfs filled to its last
block), a real read-only SQLite database, and for the driver codes PostgreSQL documents."""

from __future__ import annotations

import sqlite3

import psycopg.errors
import pytest
from conftest import DatabaseOnSmallDisk, csrf_token_of, fill
from test_app_study import card, logs, shown_card, submit, text

from studyapp import create_app
from studyapp.db import get_engine
from studyapp.refusals import Refusal, refusal_of
from studyapp.sync import sync_bank


@pytest.fixture
def database_url(tmp_path) -> str:
    """SQLite only: each test here names the database it needs (a full disk, a read-only file, no server)."""
    return f"sqlite:///{tmp_path / 'test.sqlite3'}"


class TestAFullDisk(DatabaseOnSmallDisk):
    def test_a_grade_says_to_free_space_and_counts_once_space_is_back(self, app, client, csrf_token, small_disk):
        shown = shown_card(client)
        before = card(app, shown["card_id"])
        filler = fill(small_disk)

        refused = submit(client, csrf_token, shown, before.answer, 4)
        assert refused.status_code == 503
        assert ("could not be read or written (database or disk is full), so nothing was changed: "
                "the disk that holds the database is full: free space on it, then try again") in text(refused)
        assert "try again in a moment" not in text(refused)
        assert logs(app) == [] and card(app, before.id).version == before.version

        filler.unlink()  # the owner frees space; the same showing, sent again, is recorded once
        assert submit(client, csrf_token, shown, before.answer, 4).status_code == 302
        assert [log.card_id for log in logs(app)] == [before.id]


def test_a_grade_on_a_read_only_database_says_to_make_it_writable(app_config, bank_dir, tmp_path):
    # Root writes through file modes, so the database is opened read-only by SQLite itself (mode=ro).
    path = tmp_path / "study.sqlite3"
    writable = create_app({**app_config, "DATABASE_URL": f"sqlite:///{path}"}, instance_path=str(tmp_path / "instance"))
    sync_bank(get_engine(writable), bank_dir)
    get_engine(writable).dispose()
    app = create_app({**app_config, "DATABASE_URL": f"sqlite:///file:{path}?mode=ro&uri=true"},
                     instance_path=str(tmp_path / "instance"))
    try:
        client = app.test_client()
        shown = shown_card(client)
        before = card(app, shown["card_id"])
        refused = client.post("/study/grade", headers={"Accept": "application/json"}, data={
            "csrf_token": csrf_token_of(client), "card_id": shown["card_id"], "version": shown["version"],
            "choice": before.answer, "quality": 4})
        assert refused.status_code == 503
        assert refused.get_json()["error"] == (
            "The database could not be read or written (attempt to write a readonly database), so nothing was "
            "changed: the database is read-only (its file, its folder or its disk): make it writable, then try "
            "again (the server's log says more).")
        assert logs(app) == []
    finally:
        get_engine(app).dispose()


def test_a_postgresql_server_that_refuses_the_connection_is_named_unreachable_without_its_address(app_config, tmp_path):
    # A real connection refused (nothing listens on port 1); the schema is left for the first use.
    app = create_app({**app_config, "DATABASE_URL": "postgresql+psycopg://learner:hunter2@127.0.0.1:1/study"},
                     instance_path=str(tmp_path / "instance"), upgrade_schema=False)
    refused = app.test_client().get("/", headers={"Accept": "application/json"})
    assert refused.status_code == 503
    assert refused.get_json()["error"] == (
        "The database could not be read or written, so nothing was changed: the database server could not be "
        "reached or went away: check that it is running, then try again (the server's log says more).")
    assert "hunter2" not in refused.get_data(as_text=True)  # nothing opened: nothing to dispose


def test_a_locked_sqlite_database_is_busy_and_its_extended_codes_count_as_their_primary_one():
    holder = sqlite3.connect(":memory:")
    try:
        holder.execute("SELECT * FROM no_such_table")
    except sqlite3.OperationalError as error:
        assert refusal_of(error) is Refusal.OTHER  # SQLITE_ERROR: nothing a user can do differently
    io_error = sqlite3.OperationalError("disk I/O error")
    io_error.sqlite_errorname = "SQLITE_IOERR_WRITE"  # as the driver sets it for a failed write
    assert refusal_of(io_error) is Refusal.DISK_FAILED
    assert refusal_of(None) is Refusal.OTHER


@pytest.mark.parametrize("error, refusal", [
    (psycopg.errors.DiskFull, Refusal.DISK_FULL),  # 53100
    (psycopg.errors.ReadOnlySqlTransaction, Refusal.READ_ONLY),  # 25006: a standby
    (psycopg.errors.LockNotAvailable, Refusal.BUSY),  # 55P03: lock_timeout
    (psycopg.errors.QueryCanceled, Refusal.BUSY),  # 57014: statement_timeout
    (psycopg.errors.AdminShutdown, Refusal.UNREACHABLE),  # 57P01: the server is shutting down
    (psycopg.errors.CannotConnectNow, Refusal.UNREACHABLE),  # 57P03: still starting
    (psycopg.errors.ConnectionFailure, Refusal.UNREACHABLE),  # 08006
    (psycopg.errors.OutOfMemory, Refusal.OTHER),  # 53200: not the disk
    (psycopg.OperationalError, Refusal.UNREACHABLE),  # no SQLSTATE: the driver's own, a connection lost
    (psycopg.errors.UndefinedTable, Refusal.OTHER),  # 42P01
])
def test_postgresql_refusals_are_read_from_their_sqlstate_or_its_absence(error, refusal):
    assert refusal_of(error()) is refusal
