"""`studyapp bank sync`, `check` and `import-quiz`: the question bank in bank/ (studyapp.bank, studyapp.sync)."""

from __future__ import annotations

import shlex
from pathlib import Path

import click
from flask import Flask, current_app
from flask.cli import AppGroup

from sharding_lab import atomic_write
from sharding_lab.catalog import lab_info
from studyapp.bank import SLUG, BankError, Deck, load_bank, quiz_to_yaml
from studyapp.db import get_engine
from studyapp.sync import SyncRefused, SyncReport, sync_bank


def lab_warnings(decks: list[Deck]) -> list[str]:
    """A line per question whose lab the catalogue lacks: its card would show no lab (check and sync say it)."""
    return [f"warning: {deck.path}:{question.line}: question {question.id}: lab '{question.lab}' is not in the catalogue"
            for deck in decks for question in deck.questions if lab_info(question.lab) is None]


def sync_configured_bank(app: Flask) -> SyncReport:
    """Sync the app's bank (config BANK_PATH), saying its lab warnings first; a refused bank becomes a
    clean CLI error."""
    path = app.config["BANK_PATH"]
    try:
        decks = load_bank(path)
        for line in lab_warnings(decks):
            click.echo(line)
        return sync_bank(get_engine(app), path, decks)
    except BankError as error:
        raise click.ClickException(f"{error}\nNothing was changed.") from None
    except SyncRefused as error:
        raise click.ClickException(f"{app.config['BANK_PATH']}: {error}\nNothing was changed.") from None


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
    for line in lab_warnings(decks):
        click.echo(line)
    count = sum(len(deck.questions) for deck in decks)
    click.echo(f"ok: {len(decks)} decks, {count} questions")


@bank_group.command("import-quiz")
@click.argument("quiz_file", type=click.Path(exists=True, dir_okay=False))
@click.option("--deck", "deck_id", required=True, help="Id of the new deck (a slug such as 'zero').")
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="Write the YAML here (default: print it).")
def bank_import_quiz_command(quiz_file: str, deck_id: str, out: str | None) -> None:
    """Turn a plain-text quiz into a YAML deck skeleton for an author to complete."""
    if not SLUG.fullmatch(deck_id):  # the option's fault, not the quiz file's
        raise click.ClickException(f"--deck: {deck_id!r} must be a slug: lowercase letters, digits and dashes")
    raw = Path(quiz_file).read_bytes()
    try:
        text = quiz_to_yaml(raw.decode("utf-8"), deck_id)
    except UnicodeDecodeError as error:  # the line an editor shows, as `bank check` says it, not a byte offset
        line = raw.count(b"\n", 0, error.start) + 1
        raise click.ClickException(f"{quiz_file}: line {line}: is not UTF-8: byte {raw[error.start]:#04x} cannot start "
                                   "or continue a character (save the file as UTF-8)") from None
    except ValueError as error:
        raise click.ClickException(f"{quiz_file}: {error}") from None
    if out is None:
        click.echo(text, nl=False)
        return
    if Path(out).exists():
        raise click.ClickException(f"{out} exists; not overwriting it")
    if not Path(out).parent.is_dir():
        raise click.ClickException(f"{out}: there is no folder {Path(out).parent}")
    atomic_write.write_text(Path(out), text)
    check = shlex.join(["studyapp", "bank", "check", "--path", out])  # the file written, not the app's bank
    click.echo(f"wrote {out}: mark the correct choices and fill in the blanks, then run `{check}`")
