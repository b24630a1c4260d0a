"""`studyapp export-anki [--check]`: the bank as Anki packages, carrying each lab's latest finished run."""

from __future__ import annotations

import shlex
import tempfile
import time
from pathlib import Path
from typing import Any

import click
from flask import current_app
from flask.cli import with_appcontext
from sqlalchemy import inspect
from sqlmodel import Session

from studyapp.anki import (
    DEFAULT_EXPORTS_DIR,
    LAB_RESULTS_FILE,
    MANIFEST_FILE,
    export_anki,
    read_lab_results,
    read_manifest,
    stale_exports,
)
from studyapp.anki.manifest import ExportFileError
from studyapp.bank import BankError, Deck, load_bank
from studyapp.cli.errors import explained, shown_url
from studyapp.db import get_engine
from studyapp.lab_runs import latest_done
from studyapp.lab_runs.findings import choose
from studyapp.lab_runs.queue import aware
from studyapp.models import LabRun


def stored_lab_results() -> dict[str, dict[str, Any]]:
    """Per lab, the result of its latest finished run in the app's database; {} without one.

    A database that does not exist yet is made, and one before the lab-run table has none. One that
    cannot be used (not a database, its folder missing) is refused, as every command refuses it: the
    committed results in its place would publish packages without the runs stored there.
    """
    try:
        engine = get_engine()
        if not inspect(engine).has_table(LabRun.__tablename__):
            return {}
        with Session(engine) as session:
            runs = latest_done(session)
    except Exception as error:
        line = explained(error, lambda: shown_url(current_app.config["DATABASE_URL"]))
        if line is None:  # a bug: its traceback is the report
            raise
        raise click.ClickException(f"{line}; nothing was written (the packages carry each lab's latest run "
                                   "stored there)") from None
    return {lab_id: _dated(run) for lab_id, run in runs.items() if isinstance(run.result, dict)}


def _dated(run: LabRun) -> dict[str, Any]:
    """The run's result with the date it finished, so the exported reference says when it was measured."""
    finished = aware(run.finished_at)
    return {**run.result, "measured_at": finished.isoformat()} if finished else run.result


@click.command("export-anki")
@click.option("--deck", "deck_id", default=None, help="Export only this deck (default: every deck, plus all-decks.apkg).")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Folder for the .apkg files, manifest.json and lab-results.json (default: the app's exports/).",
)
# A folder only: one deck's file would be exported as the whole bank, its all-decks.apkg and
# lab-results.json losing every other deck (`--deck ID` exports one deck beside the others).
@click.option("--bank", "bank_dir", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="Bank folder, the whole bank (default: the app's bank/); --deck exports one of its decks.")
@click.option("--check", is_flag=True, help="Write nothing; fail if the folder is out of date with the bank.")
@with_appcontext
def export_anki_command(deck_id: str | None, out_dir: Path | None, bank_dir: Path | None, check: bool) -> None:
    """Write the bank as Anki packages: one per deck and all-decks.apkg."""
    config = current_app.config
    # The export `--check` says to run: to the same folder, from the same bank.
    export = ["studyapp", "export-anki"] + (["--out", str(out_dir)] if out_dir else []) + (
        ["--bank", str(bank_dir)] if bank_dir else [])
    out_dir = out_dir or Path(config.get("EXPORTS_DIR") or DEFAULT_EXPORTS_DIR)
    try:
        decks = load_bank(bank_dir or config.get("BANK_PATH"))
    except BankError as error:
        raise click.ClickException(str(error)) from error
    try:
        if check:
            _check(decks, out_dir, shlex.join(export))
        else:
            _export(decks, out_dir, deck_id)
    except ExportFileError as error:
        # Refused, not read as empty as the pages do: that would rewrite its labs' notes as "Not run
        # yet" or restamp every note (so Anki overwrites the learner's), then replace the file.
        # Refusing loses nothing; the user repairs the file or deletes it knowingly.
        raise click.ClickException(f"{error}; {_remedy(error.path)}") from None


def _remedy(path: Path) -> str:
    """What to do about a file beside the packages that cannot be read back: what deleting it means."""
    committed = path.parent.resolve() == DEFAULT_EXPORTS_DIR.resolve()  # nothing to fall back on
    if path.name == MANIFEST_FILE:
        if committed:
            return "restore it, or delete it to stamp every note anew (Anki then updates every note on its next import)"
        return f"delete it to continue from the stamps of {DEFAULT_EXPORTS_DIR / MANIFEST_FILE}, as a new folder does"
    if committed:
        return "restore it, or delete it to export only the lab runs in the database"
    return f"delete it to carry the results of {DEFAULT_EXPORTS_DIR / LAB_RESULTS_FILE}, as a new folder does"


def _check(decks: list[Deck], out_dir: Path, export: str) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        problems = stale_exports(decks, out_dir, Path(scratch))
    if problems:
        raise click.ClickException(f"{out_dir} is out of date; run `{export}`:\n  " + "\n  ".join(problems))
    click.echo(f"{out_dir} is up to date with the bank")


def _export(decks: list[Deck], out_dir: Path, deck_id: str | None) -> None:
    # Per lab: its latest run in the app's database, else the result the exports already carry
    # (the same rule as the pages: studyapp.lab_runs.findings.choose).
    results_file = out_dir / LAB_RESULTS_FILE
    if not results_file.is_file():
        results_file = DEFAULT_EXPORTS_DIR / LAB_RESULTS_FILE
    from_file = read_lab_results(results_file)
    from_db = stored_lab_results()
    # Stamps continue from the folder's own manifest, else from the committed one: a learner who
    # imported the committed decks must not see unchanged notes as newer.
    # (Read only when it is needed: a damaged committed manifest must not stop another folder's export.)
    previous = None if (out_dir / MANIFEST_FILE).is_file() else read_manifest(DEFAULT_EXPORTS_DIR / MANIFEST_FILE)
    try:
        written = export_anki(decks, out_dir, choose(from_db, from_file), int(time.time()), deck_id, previous)
    except ValueError as error:  # no such deck
        raise click.ClickException(str(error)) from error
    except OSError as error:
        where = error.filename or out_dir
        raise click.ClickException(f"cannot write the packages to {out_dir}: {where}: {error.strerror or error}") from None
    click.echo(f"lab results: {len(from_db)} from the database, {len(set(from_file) - set(from_db))} from {results_file}")
    for path in written:
        click.echo(f"wrote {path}")
