"""Anki packages (.apkg) of the bank, with the manifest and lab results beside them: `export_anki`.

What makes a re-import update notes instead of duplicating them: deck ids and the note type id
are constants, each note's GUID is `guid_for(question id)` (studyapp.anki.render), and each note
carries its own mtime from the manifest (studyapp.anki.manifest). An unchanged bank rebuilds
byte for byte.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import shutil
import sqlite3
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import genanki

from sharding_lab import atomic_write
from studyapp import REPO_ROOT
from studyapp.anki.manifest import (
    MANIFEST_FILE,
    Manifest,
    json_excerpt,
    read_export_file,
    read_manifest,
    restamp,
)
from studyapp.anki.note_type import note_type
from studyapp.anki.render import LabResult, LabResults, NoteContent, escape_text, render_decks
from studyapp.bank import Deck

DEFAULT_EXPORTS_DIR = REPO_ROOT / "exports"  # the committed decks
ALL_DECKS_FILE = "all-decks.apkg"  # the web app links this name and `<deck id>.apkg`
LAB_RESULTS_FILE = "lab-results.json"

PARENT_DECK = "Sharding study"
# Generated once, fixed forever. Anki matches decks by name on import, but genanki needs an id
# and a random one per run would make every package look like a different deck.
DECK_IDS: dict[str, int] = {"fsdp": 1_734_518_001, "zero": 1_734_518_002}


def anki_deck_id(deck_id: str) -> int:
    """The Anki id of a bank deck: a constant for known decks, a stable hash for new ones."""
    if deck_id in DECK_IDS:
        return DECK_IDS[deck_id]
    digest = hashlib.sha256(f"sharding-study deck {deck_id}".encode()).digest()
    return 1_000_000_000 + int.from_bytes(digest[:4], "big") % 1_000_000_000


def anki_deck_name(deck: Deck) -> str:
    return f"{PARENT_DECK}::{deck.title}"


class _StampedNote(genanki.Note):
    """A genanki note with its own mtime: genanki would stamp every note with the package's."""

    def __init__(self, mod: int, **kwargs: Any):
        super().__init__(**kwargs)
        self.mod = mod

    def write_to_db(self, cursor, timestamp: float, deck_id: int, id_gen) -> None:
        super().write_to_db(cursor, self.mod, deck_id, id_gen)

    def _check_invalid_html_tags_in_fields(self) -> None:
        """Skipped: render_note escapes all text and writes only well-formed markup (tested)."""


def build_package(decks: Iterable[Deck], notes: Mapping[str, list[NoteContent]], manifest: Manifest) -> genanki.Package:
    """A package of `decks` holding their notes, each stamped as the manifest says."""
    assert manifest.note_type is not None
    model = note_type(manifest.note_type.mod)
    anki_decks = []
    for deck in decks:
        anki_deck = genanki.Deck(anki_deck_id(deck.id), anki_deck_name(deck), escape_text(deck.description))
        for note in notes[deck.id]:
            anki_deck.add_note(
                _StampedNote(
                    manifest.notes[note.question_id].mod,
                    model=model,
                    fields=list(note.fields),
                    tags=list(note.tags),
                    guid=note.guid,
                )
            )
        anki_decks.append(anki_deck)
    return genanki.Package(anki_decks)


def package_timestamp(notes: Iterable[NoteContent], manifest: Manifest) -> int:
    """Seeds genanki's note and card ids: derived from the stamps, so an unchanged bank rebuilds alike."""
    assert manifest.note_type is not None
    return max([manifest.note_type.mod, *(manifest.notes[n.question_id].mod for n in notes)])


def write_apkg(package: genanki.Package, path: Path, timestamp: int) -> None:
    """genanki's `Package.write_to_file` (no media), with two differences:
    - the collection is a scratch file zipped at once, so SQLite need not fsync it (genanki's
      fsyncs cost a quarter of a second per package on a busy disk);
    - the zip entries carry a fixed date, so an unchanged bank rebuilds byte for byte and
      re-exporting it leaves exports/ unchanged in git.
    """
    # The collection is a scratch file beside the package, not in $TMPDIR: a killed export's is then
    # removed by the next one (atomic_write.remove_stale_scratch), and never fills another disk.
    with atomic_write.scratch_beside(path) as database:
        connection = sqlite3.connect(database)
        try:
            connection.execute("PRAGMA synchronous = OFF")
            connection.execute("PRAGMA journal_mode = MEMORY")
            package.write_to_db(connection.cursor(), timestamp, itertools.count(timestamp * 1000))
            connection.commit()
        finally:
            connection.close()
        collection = zipfile.ZipInfo("collection.anki2", _ZIP_DATE)
        collection.file_size = database.stat().st_size
        with atomic_write.replacing(path) as scratch, zipfile.ZipFile(scratch, "w") as archive:
            # Streamed, not read whole: at 10,000 notes the collection is 36 MB.
            with database.open("rb") as source, archive.open(collection, "w") as target:
                shutil.copyfileobj(source, target, 1 << 20)
            archive.writestr(zipfile.ZipInfo("media", _ZIP_DATE), "{}")  # no media files


_ZIP_DATE = (1980, 1, 1, 0, 0, 0)


def write_package(decks: list[Deck], notes: Mapping[str, list[NoteContent]], manifest: Manifest, path: Path) -> Path:
    package = build_package(decks, notes, manifest)
    write_apkg(package, path, package_timestamp((n for deck in decks for n in notes[deck.id]), manifest))
    return path


# lab-results.json keeps a run without its bulky parts, as `sharding-lab run --export` writes it
# (sharding_lab.labs.runner.summarize; the export reads only the torch-free catalogue).
BULKY_RESULT_KEYS = ("measurements", "charts")


def carried_result(result: LabResult) -> dict[str, Any]:
    return {key: value for key, value in result.items() if key not in BULKY_RESULT_KEYS}


def read_lab_results(path: Path) -> dict[str, dict[str, Any]]:
    """lab id -> the JSON of `sharding-lab run LAB --json`; {} when the file is absent or empty.
    ExportFileError when it is not JSON of an object; an entry that is not an object is left out."""
    if not path.is_file():
        return {}
    return read_export_file(path, "a lab results file", _lab_results_from_json)


def _lab_results_from_json(text: str) -> dict[str, dict[str, Any]]:
    data = json.loads(text) if text.strip() else {}
    if not isinstance(data, dict):
        raise ValueError(f"not an object by lab id but {json_excerpt(data)}")
    return {lab: result for lab, result in data.items() if isinstance(result, dict)}


def export_anki(
    decks: list[Deck],
    out_dir: Path,
    lab_results: LabResults,
    now: int,
    deck_id: str | None = None,
    previous: Manifest | None = None,
) -> list[Path]:
    """Write `<deck id>.apkg` per deck and all-decks.apkg (only the one deck with `deck_id`).

    Stamps come from `out_dir`'s manifest, else from `previous`; the updated manifest and the
    lab results the notes carry are written beside the packages, so that a rebuild from those
    files gives the same notes. Returns the packages written.

    Those two files are written first: they describe the packages about to be written. An export
    killed midway then leaves packages older than the manifest (`--check` says so, and the next
    export writes them), never a published package newer than its manifest: its stamps would be
    lost, and a later export with the edit reverted would stamp the note older than the learner's
    copy, which Anki would keep.
    """
    chosen = [deck for deck in decks if deck_id in (None, deck.id)]
    if not chosen:
        raise ValueError(f"no deck {deck_id!r} in the bank (decks: {', '.join(d.id for d in decks)})")
    out_dir.mkdir(parents=True, exist_ok=True)
    notes = render_decks(chosen, lab_results)
    manifest = restamp(read_manifest(out_dir / MANIFEST_FILE) or previous or Manifest(), (n for ns in notes.values() for n in ns), now)
    # Read before anything is written: a file that cannot be read back then stops the export whole.
    results_file = out_dir / LAB_RESULTS_FILE
    if deck_id and results_file.is_file():
        carried = read_lab_results(results_file)
    else:  # a folder without one starts as a full export writes it: left empty, the next full
        # export would read it back and rebuild the other decks' notes as "Not run yet"
        labs = {q.lab for deck in decks for q in deck.questions}
        carried = {lab: carried_result(result) for lab, result in lab_results.items() if result and lab in labs}

    # Record the results these notes are built with; with one deck, only its labs change.
    for lab in {q.lab for deck in chosen for q in deck.questions}:
        carried.pop(lab, None)
        if lab_results.get(lab):
            carried[lab] = carried_result(lab_results[lab])
    atomic_write.write_text(out_dir / MANIFEST_FILE, manifest.to_json())
    atomic_write.write_text(out_dir / LAB_RESULTS_FILE, json.dumps(carried, indent=1, sort_keys=True) + "\n")

    written = [write_package([deck], notes, manifest, out_dir / f"{deck.id}.apkg") for deck in chosen]
    if deck_id is None:
        written.append(write_package(chosen, notes, manifest, out_dir / ALL_DECKS_FILE))
    return written
