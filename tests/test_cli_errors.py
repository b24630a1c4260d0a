"""The `studyapp` entry point itself (not app.cli): a database, migration, address or file a user got
wrong is one line naming it, exit status 1, no traceback, and nothing created on the way."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from flask.cli import ScriptInfo

from studyapp import CONFIG_FILE, SECRET_KEY_FILE, create_app
from studyapp.auth import TOKEN_FILE
from studyapp.cli import main
from studyapp.cli.errors import explained
from studyapp.migrate import head_revision

QUIZ = Path(__file__).parent / "data" / "fsdp-quiz.txt"


def studyapp(*args: str, database_url: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "STUDYAPP_DATABASE_URL": database_url}
    return subprocess.run([sys.executable, "-c", "from studyapp.cli import main; main()", *args],
                          capture_output=True, text=True, env=env, cwd=cwd, timeout=120)


@pytest.mark.slow
@pytest.mark.parametrize("args, url, says", [
    (["db", "current"], "bogus://x", "Error: the database URL bogus://x is not one SQLAlchemy can open: "
                                     "Can't load plugin: sqlalchemy.dialects:bogus"),
    (["bank", "sync"], "sqlite:////nonexistent/folder/x.db",
     "Error: cannot use the database at sqlite:////nonexistent/folder/x.db: unable to open database file (the database file "
     "cannot be opened: check that its folder exists and that the user running the app may write there)"),
    (["bank", "sync"], "postgresql://learner:hunter2@127.0.0.1:1/study",
     "Error: cannot use the database at postgresql://learner:***@127.0.0.1:1/study: connection failed: connection "
     "to server at \"127.0.0.1\", port 1 failed: Connection refused (the database server could not be reached or "
     "went away: check that it is running, then try again)"),
    (["db", "upgrade", "nosuchrev"], "sqlite:///{tmp}/x.db", "Error: db: Can't locate revision identified by 'nosuchrev'"),
    (["bank", "import-quiz", str(QUIZ), "--deck", "ok", "--out", "/nonexistent/x.yaml"], "sqlite:///{tmp}/x.db",
     "Error: /nonexistent/x.yaml: there is no folder /nonexistent"),
    (["serve", "--host", "999.1.1.1", "--port", "0"], "sqlite:///{tmp}/x.db",
     "Error: cannot serve on 999.1.1.1:0: Invalid host/port specified."),
    (["db", "current"], "sqlite:///{tmp}/x.db", "no database at {tmp}/x.db yet (head is "),
    # An empty revision, or one with nothing after its @, failed an assertion inside alembic (a traceback).
    (["db", "upgrade", ""], "sqlite:///{tmp}/x.db", f"Error: db: '' is not a revision: name one such as head, base or {head_revision()}"),
    (["db", "upgrade", "@"], "sqlite:///{tmp}/x.db", f"Error: db: '@' is not a revision: name one such as head, base or {head_revision()}"),
])
def test_a_users_mistake_is_one_line_and_creates_nothing(tmp_path, args, url, says):
    result = studyapp(*args, database_url=url.format(tmp=tmp_path), cwd=tmp_path)
    output = result.stdout + result.stderr
    assert says.format(tmp=tmp_path) in output, output
    assert "Traceback" not in output and "hunter2" not in output
    assert result.returncode == (0 if args == ["db", "current"] and "sqlite" in url else 1)
    assert list(tmp_path.iterdir()) == []  # no database file made, no bank synced, nothing written


def test_only_errors_a_user_can_fix_are_explained():
    url = lambda: "sqlite:///x.db"  # noqa: E731
    assert explained(FileNotFoundError(2, "No such file or directory", "/a/b"), url) == "/a/b: No such file or directory"
    assert explained(KeyError("card"), url) is None  # a bug keeps its traceback
    assert explained(ValueError("bad"), url) is None


def test_flasks_app_and_env_file_options_are_not_offered(tmp_path):
    # They were listed in --help yet ignored: the app is always create_app's.
    shown = studyapp("--help", database_url=f"sqlite:///{tmp_path}/x.db", cwd=tmp_path)
    assert shown.returncode == 0 and "--app" not in shown.stdout and "--env-file" not in shown.stdout
    refused = studyapp("--app", "other:app", "db", "current", database_url=f"sqlite:///{tmp_path}/x.db", cwd=tmp_path)
    assert refused.returncode == 2 and "No such option '--app'" in refused.stderr


@pytest.mark.slow
@pytest.mark.parametrize("name, content, says", [
    ("lab-results.json", "{", "is not a lab results file: Expecting property name enclosed in double quotes"),
    ("manifest.json", "[]", 'is not a manifest this app wrote: not an object with "notes" by question id: []'),
])
def test_export_anki_names_a_file_beside_the_packages_it_cannot_read(tmp_path, name, content, says):
    out = tmp_path / "out"
    out.mkdir()
    (out / name).write_text(content, encoding="utf-8")
    result = studyapp("export-anki", "--out", str(out), database_url=f"sqlite:///{tmp_path}/x.db", cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 1 and f"Error: {out / name} {says}" in output and "Traceback" not in output, output
    assert [p.name for p in out.iterdir()] == [name]  # nothing written beside it


def studyapp_on(instance: Path, *args: str) -> Result:
    """`studyapp ARGS` with the app built on `instance` (the real command's is the repository's instance/)."""
    database_url = f"sqlite:///{instance.parent / 'x.db'}"
    info = ScriptInfo(create_app=lambda: create_app({"DATABASE_URL": database_url}, instance_path=str(instance),
                                                    upgrade_schema=False))
    return CliRunner().invoke(main, list(args), obj=info)


@pytest.mark.parametrize("name, content, args, says", [
    (CONFIG_FILE, 'TIMEZONE = "Europe/Berln"', ["db", "current"],
     "{file}: TIMEZONE 'Europe/Berln' is not a time zone name (IANA, such as 'Europe/Berlin')"),
    (CONFIG_FILE, "DAY_START_HOUR = 25", ["bank", "check"], "{file}: DAY_START_HOUR must be 0..23, got 25"),
    (CONFIG_FILE, 'NEW_CARDS_PER_DAY = "lots"', ["token"], "{file}: NEW_CARDS_PER_DAY must be a whole number, got 'lots'"),
    (TOKEN_FILE, "caf\u00e9", ["token"], "{file}: the login token file is not ASCII (byte 0xc3 at offset 3), and a "
     "token is hex digits: delete the file, and `studyapp token` makes a new one"),
    (SECRET_KEY_FILE, "cl\u00e9", ["db", "current"], "{file}: SECRET_KEY is not ASCII (byte 0xc3 at offset 2): delete "
     "the file and a new key is made (logged-in browsers then log in again)"),
    (SECRET_KEY_FILE, "  ", ["db", "current"], "{file}: SECRET_KEY is empty: delete the file and a new key is made "
     "(logged-in browsers then log in again)"),
])
def test_a_bad_instance_file_is_one_line_naming_it(tmp_path, name, content, args, says):
    # Each was a traceback from building the app (or, for the token, from reading it).
    instance = tmp_path / "instance"
    instance.mkdir()
    (instance / name).write_text(content + "\n", encoding="utf-8")
    result = studyapp_on(instance, *args)
    assert (result.exit_code, result.output) == (1, f"Error: {says.format(file=instance / name)}\n")
    assert not (tmp_path / "x.db").exists()


def test_help_says_a_bad_setting_in_one_line_and_still_helps(tmp_path):
    instance = tmp_path / "instance"
    instance.mkdir()
    (instance / CONFIG_FILE).write_text("DAY_START_HOUR = 25\n", encoding="utf-8")
    result = studyapp_on(instance, "--help")
    assert result.exit_code == 0 and "Traceback" not in result.output
    assert result.output.startswith(f"Error: {instance / CONFIG_FILE}: DAY_START_HOUR must be 0..23, got 25\n\nUsage: ")


def studyapp_at(tmp_path: Path, database: Path, *args: str) -> Result:
    """`studyapp ARGS` on the SQLite file `database`, with an instance folder of its own in tmp_path."""
    info = ScriptInfo(create_app=lambda: create_app({"DATABASE_URL": f"sqlite:///{database}"}, upgrade_schema=False,
                                                    instance_path=str(tmp_path / "instance")))
    return CliRunner().invoke(main, list(args), obj=info)


@pytest.mark.parametrize("folder, content, says", [
    ("", bytes(range(256)) * 16, "file is not a database"),
    ("nonexistent/", None, "unable to open database file (the database file cannot be opened: check that its folder "
                           "exists and that the user running the app may write there)"),
])
def test_export_anki_refuses_a_database_it_cannot_use_and_writes_nothing(tmp_path, folder, content, says):
    # It printed SQLAlchemy's error with its "Background on this error" link, then exported the committed
    # results instead of the runs stored there, exit status 0.
    (tmp_path / "data").mkdir()
    database = tmp_path / "data" / f"{folder}x.db"
    if content is not None:
        database.write_bytes(content)
    out = tmp_path / "data" / "out"
    result = studyapp_at(tmp_path, database, "export-anki", "--out", str(out))
    assert (result.exit_code, result.output) == (1, f"Error: cannot use the database at sqlite:///{database}: {says}; "
                                                    "nothing was written (the packages carry each lab's latest run "
                                                    "stored there)\n")
    assert not out.exists() and [p.name for p in (tmp_path / "data").iterdir()] == ([database.name] if content else [])


def test_db_current_says_the_databases_folder_does_not_exist(tmp_path):
    # It said `studyapp db upgrade` would make the database, which then failed: the folder was missing.
    database = tmp_path / "nonexistent" / "x.db"
    result = studyapp_at(tmp_path, database, "db", "current")
    assert (result.exit_code, result.output) == (1, f"Error: no database at {database}, and its folder "
                                                    f"{tmp_path / 'nonexistent'} does not exist: make the folder, or "
                                                    "set STUDYAPP_DATABASE_URL to a file in one that does\n")
    assert not (tmp_path / "nonexistent").exists()


def test_version_is_the_apps_own(tmp_path):
    # It was Flask's: "Python 3.11.7 / Flask 3.1.3 / Werkzeug 3.1.9", offered as "Show the Flask version."
    project = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text(encoding="utf-8")
    version = re.search(r'^version = "(.+)"$', project, re.MULTILINE).group(1)
    result = studyapp_at(tmp_path, tmp_path / "x.db", "--version")
    assert (result.exit_code, result.output) == (0, f"studyapp {version}\n")
    helped = studyapp_at(tmp_path, tmp_path / "x.db", "--help")
    assert "--version  Show the app's version and exit." in helped.output and "Flask" not in helped.output
    assert not (tmp_path / "x.db").exists()
