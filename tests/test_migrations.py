"""Alembic migrations: the newest revision is the models' schema, revision 0001 is the schema
the app made before migrations, and upgrading a database full of reviews loses none of them.
Every test runs on SQLite and, with STUDYAPP_TEST_POSTGRES_URL, on PostgreSQL."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from datetime import timedelta
from io import BytesIO
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.util.exc import CommandError
from conftest import T0, Clock, require_git_checkout
from db_checks import assert_cards_replay, table_rows
from review_driver import drive_reviews
from sqlalchemy import create_engine, inspect, text
from sqlmodel import SQLModel

from studyapp import create_app, migrate
from studyapp.db import get_engine, make_engine
from studyapp.sync import sync_bank

pytestmark = pytest.mark.slow  # old code in a subprocess, whole review histories migrated down and up

HEAD = "0003"
REPO = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent


def schema_diff(engine) -> list:
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        return compare_metadata(context, SQLModel.metadata)


def test_the_app_builds_a_new_database_by_migrating_to_head(app):
    engine = get_engine(app)
    assert migrate.current_revision(engine) == migrate.head_revision() == HEAD
    assert schema_diff(engine) == [], "the models changed without a migration: run `studyapp db revision -m ...`"


def _repeat_index_definition(engine) -> str:
    query = {
        "sqlite": "SELECT sql FROM sqlite_master WHERE name = 'ix_card_repeat'",
        "postgresql": "SELECT indexdef FROM pg_indexes WHERE indexname = 'ix_card_repeat'",
    }[engine.dialect.name]
    with engine.connect() as connection:
        return connection.execute(text(query)).scalar_one()


def test_the_repeat_index_holds_only_cards_with_a_repeat_and_serves_the_repeat_lookup(app):
    engine = get_engine(app)
    assert "repeat_day IS NOT NULL" in _repeat_index_definition(engine)
    if engine.dialect.name == "sqlite":
        # Today's repeats, oldest first, as the study queue asks: `repeat_day = ?` implies the index's
        # condition, so SQLite searches it (PostgreSQL's planner would scan a table this small anyway).
        with engine.connect() as connection:
            plan = connection.execute(text(
                "EXPLAIN QUERY PLAN SELECT id FROM card WHERE repeat_day = :today AND retired IS 0 "
                "ORDER BY last_reviewed_at LIMIT 1"
            ), {"today": "2026-03-02"}).all()
        assert any("USING INDEX ix_card_repeat" in row[-1] for row in plan), plan
    assert migrate.downgrade(engine, "0002") == "0002"
    assert "WHERE" not in _repeat_index_definition(engine).upper()  # the full index back
    assert migrate.upgrade(engine) == HEAD
    assert "repeat_day IS NOT NULL" in _repeat_index_definition(engine)


def test_upgrading_keeps_every_review_and_downgrading_back_works(app, client, clock):
    """Reviews (with durations) through the real pages; down to 0001 and up again: every row stays."""
    graded = drive_reviews(client, clock, days=3)
    engine = get_engine(app)
    before = table_rows(engine, skip_columns=frozenset({"duration_ms"}))
    assert len(before["reviewlog"]) == graded > 10
    with engine.connect() as connection:
        durations = connection.execute(text("SELECT duration_ms FROM reviewlog")).scalars().all()
    assert all(d == 3000 for d in durations)  # the driver thinks 3 s per question

    assert migrate.downgrade(engine, "0001") == "0001"
    assert "duration_ms" not in {c["name"] for c in inspect(engine).get_columns("reviewlog")}
    assert table_rows(engine) == before
    assert migrate.upgrade(engine) == HEAD
    assert table_rows(engine, skip_columns=frozenset({"duration_ms"})) == before
    assert_cards_replay(engine)
    assert schema_diff(engine) == []


def test_db_commands_report_and_upgrade(app, runner, caplog):
    engine = get_engine(app)
    migrate.downgrade(engine, "0001")
    result = runner.invoke(args=["db", "current"])
    assert result.exit_code == 0 and f"database at revision 0001 (head is {HEAD})" in result.output
    result = runner.invoke(args=["db", "upgrade"])
    assert result.exit_code == 0, result.output
    assert f"database at revision {HEAD} (head is {HEAD})" in result.output
    assert migrate.current_revision(engine) == HEAD
    assert f"database schema upgraded from 0001 to {HEAD}" in caplog.text


def test_db_upgrade_to_a_revision_behind_the_database_is_refused(app, runner):
    # `db upgrade 0001` on a database at 0003 did nothing and said "database at revision 0003", exit status 0.
    engine = get_engine(app)
    for revision in ("0001", "0002", "base"):
        with pytest.raises(CommandError) as refused:
            migrate.upgrade(engine, revision)
        assert str(refused.value) == (f"the database is at revision {HEAD}, past {revision}: an upgrade only moves "
                                      "forward; nothing was changed")
    result = runner.invoke(args=["db", "upgrade", "0002"])  # `studyapp` says it as "Error: db: ..." (cli.errors)
    assert result.exit_code == 1 and str(result.exception).startswith("the database is at revision 0003, past 0002")
    assert migrate.current_revision(engine) == HEAD
    assert migrate.upgrade(engine, HEAD) == HEAD  # at it already: nothing to do, and nothing to refuse
    migrate.downgrade(engine, "0001")
    assert migrate.upgrade(engine, "0002") == "0002"


@pytest.mark.parametrize("revision", ["", "@", "0001@", " "])
def test_an_empty_revision_is_refused_before_the_database_is_opened(tmp_path, revision):
    # "" and "@" failed an assertion inside alembic: a traceback, where "nosuchrev" was one line.
    engine = make_engine(f"sqlite:///{tmp_path / 'x.db'}")
    for move in (migrate.upgrade, migrate.downgrade):
        with pytest.raises(CommandError) as refused:
            move(engine, revision)
        assert str(refused.value) == f"{revision!r} is not a revision: name one such as head, base or {HEAD}"
    assert not (tmp_path / "x.db").exists()
    engine.dispose()


def test_the_command_line_upgrades_only_when_a_command_uses_the_database(database_url):
    """`studyapp --help` and `db current` leave an old database as it is (so `db current` can say it is
    old); any command that uses the database upgrades it first."""
    engine = make_engine(database_url)
    migrate.upgrade(engine)
    migrate.downgrade(engine, "0002")
    env = {**os.environ, "STUDYAPP_DATABASE_URL": database_url}

    def studyapp(*args: str) -> subprocess.CompletedProcess:
        command = [str(Path(sys.executable).parent / "studyapp"), *args]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)

    assert studyapp("--help").returncode == 0
    current = studyapp("db", "current")
    assert current.stdout.strip() == f"database at revision 0002 (head is {HEAD})", current.stderr
    assert migrate.current_revision(engine) == "0002"
    exported = studyapp("export-history", "--format", "json")
    assert exported.returncode == 0 and json.loads(exported.stdout)["reviews"] == [], exported.stderr
    assert f"database schema upgraded from 0002 to {HEAD}" in exported.stderr
    assert migrate.current_revision(engine) == HEAD
    engine.dispose()


def test_a_partial_schema_without_history_is_refused(database_url, tmp_path):
    engine = make_engine(database_url)
    with engine.begin() as connection:
        SQLModel.metadata.tables["deck"].create(connection)
    with pytest.raises(migrate.SchemaError, match="not card, labrun, reviewlog"):
        migrate.upgrade(engine)
    engine.dispose()


# --- A database made by the app before migrations ---------------------------------------

OLD_APP = """
import json, sys
from datetime import datetime, timedelta, timezone
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, text
from sqlmodel import SQLModel
import studyapp
from studyapp import create_app
from studyapp.db import get_engine
from studyapp.sync import sync_bank
from review_driver import drive_reviews  # reads only HTML: it drives any version of the app


class Clock:  # a settable clock, as in conftest (which imports today's app, so not from here)
    def __init__(self):
        self.now = datetime(2026, 3, 2, 12, 0, tzinfo=timezone.utc)

    def __call__(self):
        return self.now

    def advance(self, **delta):
        self.now += timedelta(**delta)


url, bank, instance = sys.argv[1:4]
# 1. The schema migration 0001 built (now in the database) is what this old code's models describe.
engine = create_engine(url)
with engine.connect() as connection:
    diff = compare_metadata(MigrationContext.configure(connection, opts={"compare_type": True}), SQLModel.metadata)
    SQLModel.metadata.drop_all(connection)
    connection.execute(text("DROP TABLE alembic_version"))
    connection.commit()
engine.dispose()
# 2. The old app makes its own database from scratch and a learner fills it.
app = create_app({"DATABASE_URL": url, "SECRET_KEY": "x", "BANK_PATH": bank, "TIMEZONE": "UTC", "CLOCK": Clock()},
                 instance_path=instance)
sync_bank(get_engine(app), bank)
graded = drive_reviews(app.test_client(), app.config["CLOCK"], days=4, seed=11)
print(json.dumps({"module": studyapp.__file__, "diff": [str(d) for d in diff], "graded": graded}))
"""


def pre_migrations_checkout(destination: Path) -> Path:
    """The app's code as of the commit before migrations were added (git archive of its parent)."""
    require_git_checkout(full_history=True)
    added = subprocess.run(
        ["git", "log", "--format=%H", "--diff-filter=A", "--", "studyapp/migrations/versions/0001_initial_schema.py"],
        cwd=REPO, capture_output=True, text=True,
    ).stdout.split()
    if not added:
        pytest.skip("needs the git history (the commit before migrations)")
    archive = subprocess.run(
        ["git", "archive", f"{added[-1]}^", "studyapp", "sharding_lab"], cwd=REPO, capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(destination, filter="data")
    assert not (destination / "studyapp" / "migrations").exists()
    return destination


def test_a_database_made_before_migrations_is_adopted_and_upgraded(database_url, bank_dir, tmp_path, caplog):
    old_code = pre_migrations_checkout(tmp_path / "old")
    engine = make_engine(database_url)
    assert migrate.upgrade(engine, "0001") == "0001"
    engine.dispose()

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(old_code), str(TESTS)])}
    env.pop("STUDYAPP_DATABASE_URL", None)
    done = subprocess.run(
        [sys.executable, "-c", OLD_APP, database_url, str(bank_dir), str(tmp_path / "old-instance")],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["module"].startswith(str(old_code))  # really the old code
    assert report["diff"] == [], "migration 0001 differs from the schema the app made before migrations"

    engine = create_engine(database_url)
    assert "alembic_version" not in inspect(engine).get_table_names()
    before = table_rows(engine)
    assert len(before["reviewlog"]) == report["graded"] > 10
    engine.dispose()

    app = create_app(  # the app of today, on start: stamps 0001, then upgrades
        {"DATABASE_URL": database_url, "SECRET_KEY": "x", "BANK_PATH": str(bank_dir), "TIMEZONE": "UTC",
         "CLOCK": Clock(T0 + timedelta(days=30))},  # a month on: cards are due again
        instance_path=str(tmp_path / "instance"),
    )
    engine = get_engine(app)
    assert migrate.current_revision(engine) == HEAD
    assert f"database schema upgraded from before migrations to {HEAD}" in caplog.text
    assert table_rows(engine, skip_columns=frozenset({"duration_ms"})) == before
    with engine.connect() as connection:
        assert connection.execute(text("SELECT count(*) FROM reviewlog WHERE duration_ms IS NOT NULL")).scalar() == 0
    assert_cards_replay(engine)
    assert schema_diff(engine) == []
    sync_bank(engine, bank_dir)  # and the upgraded database keeps working
    assert drive_reviews(app.test_client(), app.config["CLOCK"], days=1, seed=3) > 0
    assert_cards_replay(engine)
    engine.dispose()


# --- Several processes, and failures ----------------------------------------------------

MIGRATE = """
import sys
from studyapp import migrate
from studyapp.db import make_engine
print(migrate.upgrade(make_engine(sys.argv[1])))
"""


def test_app_processes_starting_together_migrate_once(database_url, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "STUDYAPP_DATABASE_URL"}
    processes = [subprocess.Popen([sys.executable, "-c", MIGRATE, database_url], env=env, cwd=tmp_path,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outputs = [process.communicate(timeout=120) for process in processes]
    assert [p.returncode for p in processes] == [0, 0, 0], [err[-2000:] for _, err in outputs]
    assert [out.strip() for out, _ in outputs] == [HEAD] * 3
    engine = make_engine(database_url)
    assert schema_diff(engine) == []
    engine.dispose()


def test_a_migration_that_fails_leaves_the_database_as_it_was(database_url, monkeypatch):
    engine = make_engine(database_url)
    real_upgrade = migrate.command.upgrade

    def fails_after_the_first_revision(config, revision):
        real_upgrade(config, "0001")
        raise RuntimeError("the power went out")

    monkeypatch.setattr(migrate.command, "upgrade", fails_after_the_first_revision)
    with pytest.raises(RuntimeError, match="power"):
        migrate.upgrade(engine)
    assert inspect(engine).get_table_names() == []  # all or nothing, on SQLite too
    monkeypatch.undo()
    assert migrate.upgrade(engine) == HEAD
    engine.dispose()


def test_db_revision_writes_the_next_migration_from_the_models(app, runner, tmp_path, monkeypatch):
    """What a developer runs after changing a model: here the models are ahead of a copy of the
    migrations that lacks 0002 (and 0003 after it), so the new script must add reviewlog.duration_ms."""
    scripts = tmp_path / "migrations"
    shutil.copytree(migrate.MIGRATIONS_DIR, scripts, ignore=shutil.ignore_patterns("__pycache__", "0002_*", "0003_*"))
    migrate.downgrade(get_engine(app), "0001")
    monkeypatch.setattr(migrate, "MIGRATIONS_DIR", scripts)
    result = runner.invoke(args=["db", "revision", "-m", "answer time"])
    assert result.exit_code == 0, result.output
    (written,) = [p for p in (scripts / "versions").glob("*.py") if not p.name.startswith("0001")]
    source = written.read_text()
    assert "down_revision = '0001'" in source and "add_column(sa.Column('duration_ms'" in source, source
