"""Anki export: the bank as .apkg files that import cleanly, update in place and carry the lab.

    note_type.py   the multiple-choice note type: fields, templates, CSS and JS
    render.py      a question as a note: escaped HTML fields, tags, GUID, the lab's finding
    manifest.py    each note's mtime (exports/manifest.json), so a re-import updates exactly the edited notes
    package.py     the .apkg files, the manifest and lab-results.json beside them: `export_anki`
    check.py       whether a folder of packages is current with the bank: `stale_exports`

All of it is pure but for the files it writes; the CLI is `studyapp export-anki` (studyapp.cli.anki).
"""

from studyapp.anki.check import read_package, stale_exports
from studyapp.anki.manifest import MANIFEST_FILE, Manifest, Stamp, read_manifest, restamp
from studyapp.anki.package import (
    ALL_DECKS_FILE,
    DEFAULT_EXPORTS_DIR,
    LAB_RESULTS_FILE,
    anki_deck_id,
    anki_deck_name,
    export_anki,
    read_lab_results,
)
from studyapp.anki.render import render_decks, render_lab_result, render_note

__all__ = [
    "ALL_DECKS_FILE",
    "DEFAULT_EXPORTS_DIR",
    "LAB_RESULTS_FILE",
    "MANIFEST_FILE",
    "Manifest",
    "Stamp",
    "anki_deck_id",
    "anki_deck_name",
    "export_anki",
    "read_lab_results",
    "read_manifest",
    "read_package",
    "render_decks",
    "render_lab_result",
    "render_note",
    "restamp",
    "stale_exports",
]
