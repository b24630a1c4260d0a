"""studyapp.db's SQLite settings: a new database switches to WAL even while another process holds it."""

from __future__ import annotations

import sqlite3
import threading
import time

import pytest

from studyapp.db import _switch_to_wal, make_engine


def test_the_switch_to_wal_waits_out_a_lock_held_by_another_connection(tmp_path):
    path = tmp_path / "new.sqlite3"
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN EXCLUSIVE")  # what another process opening the new database may hold for a moment
    opener = sqlite3.connect(path, timeout=0.05)  # its own busy timeout runs out long before the lock ends
    releaser = threading.Timer(0.5, lambda: holder.execute("COMMIT"))
    releaser.start()
    started = time.monotonic()
    _switch_to_wal(opener.cursor(), deadline=time.monotonic() + 10)
    assert time.monotonic() - started >= 0.4  # it waited for the holder, then switched
    assert opener.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    releaser.join()
    holder.close()
    opener.close()


def test_the_switch_to_wal_gives_up_at_its_deadline(tmp_path):
    path = tmp_path / "new.sqlite3"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    opener = sqlite3.connect(path, timeout=0.05)
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        _switch_to_wal(opener.cursor(), deadline=time.monotonic() + 0.3)
    holder.execute("COMMIT")
    holder.close()
    opener.close()


def test_every_connection_of_an_engine_is_in_wal_with_normal_sync(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path / 'app.sqlite3'}")
    with engine.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA journal_mode").scalar_one() == "wal"
        assert connection.exec_driver_sql("PRAGMA synchronous").scalar_one() == 1  # NORMAL
        assert connection.exec_driver_sql("PRAGMA foreign_keys").scalar_one() == 1
    engine.dispose()
