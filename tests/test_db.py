"""studyapp.db's SQLite settings: a new database switches to WAL even while another process holds it."""

from __future__ import annotations

import importlib.util
import sqlite3
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy.exc import ArgumentError, IntegrityError, OperationalError

from studyapp.cli import main
from studyapp.db import DriverConnection, _switch_to_wal, driver_transaction, make_engine, upgrade_schema


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


def test_the_pool_hands_out_the_connection_returned_last(tmp_path):
    """After a burst opened several connections, the next request gets the one used last, whose page
    cache is current (FIFO would cycle through connections another one's writes have made cold)."""
    engine = make_engine(f"sqlite:///{tmp_path / 'app.sqlite3'}")
    burst = [engine.raw_connection() for _ in range(3)]
    drivers = [connection.dbapi_connection for connection in burst]
    for connection in burst:
        connection.close()  # returned in order: drivers[2] last
    for _ in range(3):
        connection = engine.raw_connection()
        assert connection.dbapi_connection is drivers[2]
        connection.close()
    engine.dispose()


def _parent_child_engine(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path / 'app.sqlite3'}")
    with engine.begin() as connection:
        connection.exec_driver_sql("CREATE TABLE parent (id INTEGER PRIMARY KEY)")
        connection.exec_driver_sql("CREATE TABLE child (id INTEGER PRIMARY KEY, parent_id INTEGER REFERENCES parent (id))")
    return engine


def _rows(engine, table: str) -> list[tuple]:
    with engine.connect() as connection:
        return [tuple(row) for row in connection.exec_driver_sql(f"SELECT * FROM {table} ORDER BY id")]


def test_a_driver_transaction_commits_when_its_block_ends(tmp_path):
    engine = _parent_child_engine(tmp_path)
    with driver_transaction(engine) as connection:
        assert isinstance(connection, DriverConnection) and connection.dialect is engine.dialect
        connection.connection.cursor().execute("INSERT INTO parent (id) VALUES (1)")
    assert _rows(engine, "parent") == [(1,)]  # read on another connection: committed
    assert engine.pool.checkedout() == 0
    engine.dispose()


def test_a_driver_transaction_that_raises_stores_nothing_and_frees_its_connection(tmp_path):
    engine = _parent_child_engine(tmp_path)
    with pytest.raises(LookupError, match="after the write"), driver_transaction(engine) as connection:
        connection.connection.cursor().execute("INSERT INTO parent (id) VALUES (1)")
        raise LookupError("after the write")
    assert _rows(engine, "parent") == []
    assert engine.pool.checkedout() == 0
    engine.dispose()


def test_a_failed_commit_is_sqlalchemys_error_and_stores_nothing(tmp_path):
    """A deferred foreign key is checked at COMMIT: the commit fails, as SQLAlchemy's IntegrityError
    (what grade's race handling catches), and the transaction's other writes are rolled back."""
    engine = _parent_child_engine(tmp_path)
    with pytest.raises(IntegrityError, match="FOREIGN KEY"), driver_transaction(engine) as connection:
        cursor = connection.connection.cursor()
        cursor.execute("PRAGMA defer_foreign_keys = ON")
        cursor.execute("INSERT INTO parent (id) VALUES (1)")
        cursor.execute("INSERT INTO child (id, parent_id) VALUES (1, 99)")  # no parent 99: fails only at commit
    assert _rows(engine, "parent") == [] and _rows(engine, "child") == []
    with driver_transaction(engine) as connection:  # the connection went back to the pool usable
        connection.connection.cursor().execute("INSERT INTO parent (id) VALUES (2)")
    assert _rows(engine, "parent") == [(2,)]
    engine.dispose()


@pytest.mark.parametrize("url", ["sqlite+pysqlite://", "sqlite+pysqlite:///:memory:"])
def test_an_in_memory_url_in_any_spelling_makes_an_engine(url):
    """SQLAlchemy keeps these in memory too, one connection per thread: no queue options for them."""
    engine = make_engine(url)
    with engine.begin() as connection:
        connection.exec_driver_sql("CREATE TABLE kept (id INTEGER PRIMARY KEY)")
    with engine.connect() as connection:  # the same thread's one connection: the table is there
        assert connection.exec_driver_sql("SELECT count(*) FROM kept").scalar_one() == 0
    engine.dispose()


@pytest.mark.skipif(importlib.util.find_spec("MySQLdb") is not None, reason="MySQLdb is installed here")
def test_a_url_whose_driver_is_not_installed_is_refused_as_the_urls_problem():
    with pytest.raises(ArgumentError, match=r"driver is not installed \(No module named 'MySQLdb'\)"):
        make_engine("mysql+mysqldb://user@localhost/study")


@pytest.mark.skipif(importlib.util.find_spec("pg8000") is not None, reason="pg8000 is installed here")
def test_a_postgresql_url_without_its_driver_says_how_to_install_it():
    # `make run` installs what SQLite needs; the README's PostgreSQL URL then failed naming no remedy.
    with pytest.raises(ArgumentError, match=r"No module named 'pg8000'\); install it with "
                       r"`\.venv/bin/pip install -e '\.\[postgres\]'` and use a postgresql\+psycopg:// URL"):
        make_engine("postgresql+pg8000://user@localhost/study")


def test_a_url_naming_a_file_that_is_not_a_database_is_an_operational_error(tmp_path):
    """What a wrong path is (cli.errors says it in one line), and the file is left as it was."""
    notes = tmp_path / "notes.txt"
    notes.write_text("not a database\n" * 100, encoding="utf-8")
    engine = make_engine(f"sqlite:///{notes}")
    with pytest.raises(OperationalError, match="file is not a database"), engine.connect():
        pass
    assert notes.read_text(encoding="utf-8") == "not a database\n" * 100
    engine.dispose()


def _partial_schema(path) -> None:
    """A database with the app's deck table and nothing else, as an interrupted copy might leave one."""
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE deck (id VARCHAR NOT NULL PRIMARY KEY)")
    connection.close()


def _newer_schema(path) -> None:
    """A database a newer version of the app migrated, to a revision this one does not have."""
    engine = make_engine(f"sqlite:///{path}")
    upgrade_schema(engine)
    with engine.begin() as connection:
        connection.exec_driver_sql("UPDATE alembic_version SET version_num = '9001'")
    engine.dispose()


@pytest.mark.parametrize("make, says", [
    (lambda path: path.write_text("notes\n", encoding="utf-8"),
     "Error: cannot use the database at sqlite:///{path}: file is not a database"),
    (_partial_schema, "Error: db: the database has some of the app's tables (deck) but not card, labrun, reviewlog, "
                      "and no migration history: restore it from a backup"),
    (_newer_schema, "Error: db: the database is at revision 9001, which this version of the app does not have "
                    "(its newest is 0003): it was made by a newer version; use that one"),
])
def test_bank_sync_on_a_database_it_cannot_use_is_one_line(tmp_path, make, says):
    path = tmp_path / "study.sqlite3"
    make(path)
    bank = Path(__file__).resolve().parent.parent / "bank"
    result = CliRunner().invoke(main, ["bank", "sync", "--path", str(bank)],
                                env={"STUDYAPP_DATABASE_URL": f"sqlite:///{path}"})
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.exception
    assert result.output.strip() == says.format(path=path)
