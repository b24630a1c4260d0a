"""Downloads of the built Anki decks, served by exact name from the exports folder only."""

from __future__ import annotations

import re
from pathlib import Path

from flask import Blueprint, abort, current_app, send_from_directory

bp = Blueprint("exports", __name__, url_prefix="/exports")

EXPORT_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*\.apkg$")  # a deck id or all-decks, never a path


def exports_dir() -> Path:
    return Path(current_app.config["EXPORTS_DIR"])


def available_exports() -> set[str]:
    """Names of the .apkg files that exist now (the home and deck pages link only to these)."""
    folder = exports_dir()
    if not folder.is_dir():
        return set()
    # Plain files only: a symlink named like a deck could point anywhere on the machine.
    return {p.name for p in folder.iterdir() if EXPORT_NAME.match(p.name) and p.is_file() and not p.is_symlink()}


@bp.get("/<name>")
def download(name: str):
    if not EXPORT_NAME.match(name) or name not in available_exports():
        abort(404, description=f"There is no export named '{name[:80]}'. Build them with `studyapp export-anki`.")
    return send_from_directory(exports_dir(), name, as_attachment=True, mimetype="application/octet-stream")
