"""create_app: configuration layers, the per-install secret key, and no torch at start-up."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import require_git_checkout

from studyapp import CONFIG_FILE, DATABASE_URL_ENV, SECRET_KEY_FILE, create_app
from studyapp.db import get_engine
from studyapp.study import SettingError, StudySettings


@pytest.fixture(autouse=True)
def no_database_url_env(monkeypatch):
    monkeypatch.delenv(DATABASE_URL_ENV, raising=False)


def test_defaults_put_an_sqlite_file_in_the_instance_folder(tmp_path):
    app = create_app(instance_path=str(tmp_path / "instance"))
    assert app.config["DATABASE_URL"] == f"sqlite:///{tmp_path / 'instance' / 'studyapp.sqlite3'}"
    assert (tmp_path / "instance" / "studyapp.sqlite3").exists()  # schema created on start
    assert app.config["NEW_CARDS_PER_DAY"] == 20 and app.config["REVIEWS_PER_DAY"] == 200
    assert app.config["HOST"] == "127.0.0.1"
    get_engine(app).dispose()


def test_config_layers_instance_file_then_environment_then_test_config(tmp_path, monkeypatch):
    instance = tmp_path / "instance"
    instance.mkdir()
    (instance / "config.py").write_text(
        f"NEW_CARDS_PER_DAY = 7\nDAY_START_HOUR = 6\nDATABASE_URL = 'sqlite:///{tmp_path / 'from-file.db'}'\n"
    )
    app = create_app(instance_path=str(instance))
    assert app.config["NEW_CARDS_PER_DAY"] == 7 and app.config["DAY_START_HOUR"] == 6
    assert app.config["DATABASE_URL"].endswith("from-file.db")

    monkeypatch.setenv(DATABASE_URL_ENV, f"sqlite:///{tmp_path / 'from-env.db'}")
    app = create_app(instance_path=str(instance))
    assert app.config["DATABASE_URL"].endswith("from-env.db")

    app = create_app({"DATABASE_URL": f"sqlite:///{tmp_path / 'from-test.db'}", "NEW_CARDS_PER_DAY": 3},
                     instance_path=str(instance))
    assert app.config["DATABASE_URL"].endswith("from-test.db") and app.config["NEW_CARDS_PER_DAY"] == 3
    assert app.config["DAY_START_HOUR"] == 6  # untouched layers stay


def test_the_secret_key_is_made_once_per_install_and_kept_private(tmp_path):
    instance = tmp_path / "instance"
    first = create_app(instance_path=str(instance)).config["SECRET_KEY"]
    second = create_app(instance_path=str(instance)).config["SECRET_KEY"]
    assert first == second and len(first) >= 64
    key_file = instance / SECRET_KEY_FILE
    assert key_file.read_text() == first
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    other = create_app(instance_path=str(tmp_path / "other")).config["SECRET_KEY"]
    assert other != first


def _start_in_a_child(instance: Path, before: str = "") -> subprocess.Popen:
    """`create_app` on `instance` in a fresh interpreter, after running `before` there; prints the key."""
    script = f"{before}\nfrom studyapp import create_app\nprint(create_app(instance_path={str(instance)!r}).config['SECRET_KEY'], flush=True)\n"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env)


def test_a_first_start_killed_while_making_the_key_leaves_no_key_file_and_the_next_start_makes_one(tmp_path):
    # It once left an empty secret_key (created, then written), and every later command refused it.
    instance = tmp_path / "instance"
    held = "import os, time\ndef held(*args):\n    print('linking', flush=True)\n    time.sleep(60)\nos.link = held"
    child = _start_in_a_child(instance, before=held)
    assert child.stdout.readline() == "linking\n"  # the whole key is written beside, about to be linked
    child.kill()
    child.wait()
    assert not (instance / SECRET_KEY_FILE).exists()  # no key file at all, never an empty one
    assert list(instance.glob(f".{SECRET_KEY_FILE}.{child.pid}.*.part"))  # the scratch SIGKILL left behind
    key = create_app(instance_path=str(instance)).config["SECRET_KEY"]
    assert (instance / SECRET_KEY_FILE).read_text() == key and len(key) == 64
    assert sorted(p.name for p in instance.iterdir() if p.name.startswith(".")) == []  # the scratch is gone


def test_first_starts_at_the_same_time_agree_on_one_key(tmp_path):
    instance = tmp_path / "instance"
    children = [_start_in_a_child(instance) for _ in range(4)]
    keys = {child.communicate(timeout=120)[0].strip() for child in children}
    assert all(child.returncode == 0 for child in children)
    assert keys == {(instance / SECRET_KEY_FILE).read_text()}


def test_the_repository_holds_no_secret_key():
    require_git_checkout()
    repo = Path(__file__).resolve().parent.parent
    tracked = subprocess.run(["git", "ls-files"], cwd=repo, capture_output=True, text=True, check=True).stdout.split()
    assert tracked
    assert not [path for path in tracked if path.endswith(SECRET_KEY_FILE) or path.startswith("instance/")]


@pytest.mark.parametrize("bad, message", [
    ({"DAY_START_HOUR": 25}, "DAY_START_HOUR must be 0..23, got 25"),
    ({"TIMEZONE": "Nowhere/Special"}, "TIMEZONE 'Nowhere/Special' is not a time zone name (IANA, such as 'Europe/Berlin')"),
    ({"NEW_CARDS_PER_DAY": -2}, "NEW_CARDS_PER_DAY is a daily limit and cannot be negative, got -2"),
])
def test_bad_study_settings_are_refused_at_start_up(tmp_path, bad, message):
    with pytest.raises(SettingError) as refused:
        create_app({"DATABASE_URL": f"sqlite:///{tmp_path / 'db'}", **bad}, instance_path=str(tmp_path / "i"))
    assert str(refused.value) == message  # passed in, not read from a file: no file to name


@pytest.mark.parametrize("line, message", [
    ('TIMEZONE = "Europe/Berln"', "TIMEZONE 'Europe/Berln' is not a time zone name (IANA, such as 'Europe/Berlin')"),
    ("TIMEZONE = 1", "TIMEZONE must be a time zone name such as 'Europe/Berlin', got 1"),
    ("DAY_START_HOUR = 25", "DAY_START_HOUR must be 0..23, got 25"),
    ("DAY_START_HOUR = 4.5", "DAY_START_HOUR must be a whole number, got 4.5"),
    ('NEW_CARDS_PER_DAY = "lots"', "NEW_CARDS_PER_DAY must be a whole number, got 'lots'"),
    ("REVIEWS_PER_DAY = True", "REVIEWS_PER_DAY must be a whole number, got True"),
    ("REVIEWS_PER_DAY = -1", "REVIEWS_PER_DAY is a daily limit and cannot be negative, got -1"),
])
def test_a_bad_setting_in_the_instance_config_names_the_file_and_the_setting(tmp_path, line, message):
    # Each raised a bare ValueError, ZoneInfoNotFoundError or TypeError, naming neither file nor setting.
    instance = tmp_path / "instance"
    instance.mkdir()
    (instance / CONFIG_FILE).write_text(line + "\n")
    with pytest.raises(SettingError) as refused:
        create_app({"DATABASE_URL": f"sqlite:///{tmp_path / 'db'}"}, instance_path=str(instance))
    assert str(refused.value) == f"{instance / 'config.py'}: {message}"
    assert not (tmp_path / "db").exists()


def test_text_of_a_whole_number_is_still_a_whole_number(tmp_path):
    instance = tmp_path / "instance"
    instance.mkdir()
    (instance / CONFIG_FILE).write_text('NEW_CARDS_PER_DAY = "7"\n')
    app = create_app({"DATABASE_URL": f"sqlite:///{tmp_path / 'db'}"}, instance_path=str(instance))
    assert StudySettings.from_config(app.config).new_per_day == 7
    get_engine(app).dispose()


def test_the_app_never_imports_torch(tmp_path):
    """Building the app and serving pages must not import torch (the labs run in their own process)."""
    script = f"""
import sys
from studyapp import create_app
app = create_app({{"DATABASE_URL": "sqlite:///{tmp_path / 'db.sqlite3'}", "SECRET_KEY": "x"}},
                 instance_path={str(tmp_path / 'instance')!r})
client = app.test_client()
for url in ("/", "/study", "/stats", "/labs", "/labs/what-fsdp-shards"):
    assert client.get(url).status_code == 200, url
assert "torch" not in sys.modules, sorted(m for m in sys.modules if m.startswith("torch"))
print("ok")
"""
    env = {k: v for k, v in os.environ.items() if k != DATABASE_URL_ENV}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                            cwd=Path(__file__).resolve().parent.parent, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
