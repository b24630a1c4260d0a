"""The `studyapp` command line: a Flask command group that builds the app with create_app.

To add a command, define it (a click command or an AppGroup) and list it in COMMANDS;
`init_app` registers each one on `app.cli`, so `app.test_cli_runner()` sees it too.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import click
from flask import Flask, current_app
from flask.cli import AppGroup, FlaskGroup, with_appcontext
from werkzeug.serving import run_simple

from sharding_lab.catalog import lab_info
from studyapp.anki_export import export_anki_command
from studyapp.bank import BankError, load_bank, quiz_to_yaml
from studyapp.db import get_engine
from studyapp.history import export_history_command, import_history_command
from studyapp.lab_queue import labs_group, start_worker
from studyapp.migrate import db_group
from studyapp.sync import SyncReport, sync_bank


def sync_configured_bank(app: Flask) -> SyncReport:
    """Sync the app's bank (config BANK_PATH); a refused bank becomes a clean CLI error."""
    try:
        return sync_bank(get_engine(app), app.config["BANK_PATH"])
    except BankError as error:
        raise click.ClickException(f"{error}\nNothing was changed.") from None


@click.command("serve")
@click.option("--host", default=None, help="Interface to listen on (default 127.0.0.1: this machine only).")
@click.option("--port", type=int, default=None, help="Port (default 5000).")
@with_appcontext
def serve_command(host: str | None, port: int | None) -> None:
    """Sync the bank into the database, then serve the app."""
    app = current_app._get_current_object()
    click.echo(f"bank synced: {sync_configured_bank(app).summary()}")
    start_worker(app)  # fails runs a restart cut off, resumes queued ones
    # A service stop (SIGTERM) exits like Ctrl-C, so atexit kills a running lab's processes too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    # Flask's app.run() refuses to run inside a `flask`-style CLI command: serve with werkzeug directly.
    run_simple(host or app.config["HOST"], port or app.config["PORT"], app, threaded=True)


bank_group = AppGroup("bank", help="The question bank in bank/.")


@bank_group.command("sync")
@click.option("--path", type=click.Path(exists=True), default=None, help="Bank folder or file (default: BANK_PATH).")
def bank_sync_command(path: str | None) -> None:
    """Load the bank into the database: new cards added, edits applied, removed ones retired."""
    app = current_app._get_current_object()
    if path:
        app.config["BANK_PATH"] = path
    click.echo(sync_configured_bank(app).summary())


@bank_group.command("check")
@click.option("--path", type=click.Path(exists=True), default=None, help="Bank folder or file (default: BANK_PATH).")
def bank_check_command(path: str | None) -> None:
    """Validate the bank without touching the database."""
    try:
        decks = load_bank(path or current_app.config["BANK_PATH"])
    except BankError as error:
        raise click.ClickException(str(error)) from None
    for deck in decks:
        for question in deck.questions:
            if lab_info(question.lab) is None:
                click.echo(f"warning: {deck.path}:{question.line}: question {question.id}: lab '{question.lab}' is not in the catalogue")
    count = sum(len(deck.questions) for deck in decks)
    click.echo(f"ok: {len(decks)} decks, {count} questions")


@bank_group.command("import-quiz")
@click.argument("quiz_file", type=click.Path(exists=True, dir_okay=False))
@click.option("--deck", "deck_id", required=True, help="Id of the new deck (a slug such as 'zero').")
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="Write the YAML here (default: print it).")
def bank_import_quiz_command(quiz_file: str, deck_id: str, out: str | None) -> None:
    """Turn a plain-text quiz into a YAML deck skeleton for an author to complete."""
    try:
        text = quiz_to_yaml(Path(quiz_file).read_text(encoding="utf-8"), deck_id)
    except (ValueError, UnicodeDecodeError) as error:
        raise click.ClickException(f"{quiz_file}: {error}") from None
    if out is None:
        click.echo(text, nl=False)
        return
    if Path(out).exists():
        raise click.ClickException(f"{out} exists; not overwriting it")
    Path(out).write_text(text, encoding="utf-8")
    click.echo(f"wrote {out}: mark the correct choices and fill in the blanks, then run `studyapp bank check`")


COMMANDS = (
    serve_command,
    bank_group,
    export_anki_command,
    labs_group,
    db_group,
    export_history_command,
    import_history_command,
)


def init_app(app: Flask) -> None:
    for command in COMMANDS:
        app.cli.add_command(command)


def _create_app() -> Flask:
    from studyapp import create_app

    return create_app()


main = FlaskGroup(
    name="studyapp",
    help="The sharding study app.",
    create_app=_create_app,
    add_default_commands=False,
    load_dotenv=False,
    set_debug_flag=False,
)
