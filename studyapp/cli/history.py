"""`studyapp export-history` and `import-history`: the review log as a file (studyapp.history)."""

from __future__ import annotations

from pathlib import Path

import click
from flask.cli import with_appcontext

from sharding_lab import atomic_write
from studyapp.db import get_engine
from studyapp.history import HistoryError, history_rows, import_history, parse_history, render_history


def _format_of(path: str | None, fmt: str | None) -> str:
    return fmt or ("json" if path and path.lower().endswith(".json") else "csv")


@click.command("export-history")
@click.option("--format", "fmt", type=click.Choice(["csv", "json"]), default=None, help="Default: from --out's suffix, else csv.")
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="Write here (default: print it).")
@with_appcontext
def export_history_command(fmt: str | None, out: str | None) -> None:
    """Write the whole review log (every review, undone ones too) as CSV or JSON."""
    rows = history_rows(get_engine())
    text = render_history(rows, _format_of(out, fmt))
    if out is None:
        click.echo(text, nl=False)
        return
    try:
        # Whole or not at all, synced (a backup), readable by its owner only (it holds the review log).
        atomic_write.write_text(Path(out), text, mode=0o600, durable=True)
    except OSError as error:
        raise click.ClickException(f"cannot write {out}: {error.strerror or error}; nothing was written") from None
    click.echo(f"wrote {len(rows)} reviews to {out}", err=True)


@click.command("import-history")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--format", "fmt", type=click.Choice(["csv", "json"]), default=None, help="Default: from the content.")
@with_appcontext
def import_history_command(file: str, fmt: str | None) -> None:
    """Restore reviews from an export-history file (skipping those already present)."""
    try:
        text = Path(file).read_text(encoding="utf-8-sig")  # a BOM, as spreadsheets write, is fine
        report = import_history(get_engine(), parse_history(text, file, fmt))
    except UnicodeDecodeError:
        raise click.ClickException(f"{file}: not UTF-8 text; nothing was imported") from None
    except HistoryError as error:
        raise click.ClickException(str(error)) from None
    click.echo(report.summary())

