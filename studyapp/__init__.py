"""The study app: `create_app()` builds it; each module's `init_app` wires its own part.

Settings (defaults in DEFAULTS; override in instance/config.py or the test config):
DATABASE_URL (or the STUDYAPP_DATABASE_URL environment variable), NEW_CARDS_PER_DAY,
REVIEWS_PER_DAY, DAY_START_HOUR, TIMEZONE, BANK_PATH, EXPORTS_DIR, HOST, PORT, CLOCK; the lab
runner's LAB_TIMEOUT_S, LAB_WORLD_SIZES, LAB_COMMAND, LAB_WORKER_AUTOSTART (see studyapp.lab_runs.worker);
the login's REQUIRE_LOGIN, TRUST_PROXY and rate limits (see studyapp.auth).
"""

from __future__ import annotations

import os
import secrets
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from flask import Flask

from sharding_lab import atomic_write

REPO_ROOT = Path(__file__).resolve().parent.parent
DATABASE_URL_ENV = "STUDYAPP_DATABASE_URL"
SECRET_KEY_FILE = "secret_key"
CONFIG_FILE = "config.py"  # in the instance folder

DEFAULTS: dict[str, Any] = {
    "NEW_CARDS_PER_DAY": 20,
    "REVIEWS_PER_DAY": 200,
    "DAY_START_HOUR": 4,  # a late-night session still counts for the evening's day (Anki's default)
    "TIMEZONE": None,  # IANA name; None: the machine's local zone
    "BANK_PATH": str(REPO_ROOT / "bank"),
    "EXPORTS_DIR": str(REPO_ROOT / "exports"),
    "HOST": "127.0.0.1",  # never listen on other interfaces unless asked
    "MAX_CONTENT_LENGTH": 1024 * 1024,  # every form here is tiny; refuse huge bodies with a 413
    "SESSION_COOKIE_SAMESITE": "Lax",  # a second line against cross-site POSTs, after the CSRF token
    "PORT": 5000,
    # The clock the views use: tests pass a fixed one to step through study days.
    "CLOCK": lambda: datetime.now(timezone.utc),
}


def _install_secret_key(instance_path: str) -> str:
    """A random key made once per install and kept in the instance folder (never in the repo)."""
    path = os.path.join(instance_path, SECRET_KEY_FILE)
    key = secrets.token_hex(32)
    # Whole or not at all: a first start killed midway once left an empty key file that stopped
    # every later command, and a second process starting meanwhile read it empty.
    if atomic_write.create_text(Path(path), key, mode=0o600, durable=True):
        return key
    return _read_secret_key(path)


def _read_secret_key(path: str) -> str:
    """The kept key; one that is empty or not ASCII (edited by hand) is refused by name, not met as a
    traceback here or as a session error on the first request."""
    from studyapp.auth import NotAscii, read_ascii
    from studyapp.study import SettingError

    fix = "delete the file and a new key is made (logged-in browsers then log in again)"
    try:
        key = read_ascii(path)
    except NotAscii as error:
        raise SettingError("SECRET_KEY", f"is not ASCII ({error.where}): {fix}", source=path) from None
    if not key:
        raise SettingError("SECRET_KEY", f"is empty: {fix}", source=path)
    return key


def _refuse_bad_study_settings(app: Flask, passed: dict[str, Any], from_file: bool) -> None:
    """Refuse bad limits, hour or zone now, not mid-review: a SettingError naming the instance's
    config.py when the bad setting came from there, not from what create_app was passed."""
    from studyapp.study import SettingError, StudySettings

    try:
        StudySettings.from_config(app.config)
    except SettingError as error:
        if from_file and error.setting not in passed:
            raise error.set_in(os.path.join(app.instance_path, CONFIG_FILE)) from None
        raise


def create_app(
    config: dict[str, Any] | None = None, *, instance_path: str | None = None, upgrade_schema: bool = True
) -> Flask:
    """Build the app. Config layers: defaults, then instance/config.py, then the
    STUDYAPP_DATABASE_URL environment variable, then `config` (what tests pass). The database schema
    is upgraded to the newest revision now, or with `upgrade_schema=False` (the command line) when
    something first uses the database: `studyapp --help` and `studyapp db current` leave it alone."""
    app = Flask(__name__, instance_relative_config=True, instance_path=instance_path)
    os.makedirs(app.instance_path, exist_ok=True)
    app.config.from_mapping(DEFAULTS)
    app.config["DATABASE_URL"] = "sqlite:///" + os.path.join(app.instance_path, "studyapp.sqlite3")
    from_file = app.config.from_pyfile(CONFIG_FILE, silent=True)
    if os.environ.get(DATABASE_URL_ENV):
        app.config["DATABASE_URL"] = os.environ[DATABASE_URL_ENV]
    if config:
        app.config.update(config)
    if not app.config.get("SECRET_KEY"):
        app.config["SECRET_KEY"] = _install_secret_key(app.instance_path)

    from studyapp import auth, cli, csrf, db, headers, lab_runs, views

    _refuse_bad_study_settings(app, passed=config or {}, from_file=from_file)
    db.init_app(app, upgrade=upgrade_schema)
    auth.init_app(app)  # before csrf: a request without a login is sent to log in, not told about tokens
    csrf.init_app(app)
    headers.init_app(app)
    lab_runs.init_app(app)
    views.init_app(app)
    cli.init_app(app)
    return app
