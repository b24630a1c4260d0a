"""Is exports/ current? Read packages back as Anki sees them and compare them with a rebuild."""

from __future__ import annotations

import json
import sqlite3
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from studyapp.anki.manifest import MANIFEST_FILE, read_manifest
from studyapp.anki.note_type import FIELDS, NOTE_TYPE_ID
from studyapp.anki.package import LAB_RESULTS_FILE, export_anki, read_lab_results
from studyapp.bank import Deck


@dataclass(frozen=True)
class PackageNote:
    guid: str
    fields: tuple[str, ...]
    tags: tuple[str, ...]
    mod: int
    note_type_id: int


@dataclass(frozen=True)
class PackageContent:
    deck_names: frozenset[str]
    notes: dict[str, PackageNote]  # by guid
    note_types: dict[int, dict[str, Any]]  # id -> Anki's JSON of the note type


# What reading a damaged .apkg raises: a truncated or foreign zip, a zip without Anki's collection,
# a collection that is not SQLite or lacks Anki's tables or JSON.
UNREADABLE_PACKAGE = (zipfile.BadZipFile, KeyError, TypeError, ValueError, sqlite3.DatabaseError, EOFError)


def read_package(path: Path) -> PackageContent:
    """What an .apkg holds, as Anki will see it: deck names, notes, note types."""
    with zipfile.ZipFile(path) as archive, tempfile.TemporaryDirectory() as tmp:
        database = Path(tmp) / "collection.anki2"
        database.write_bytes(archive.read("collection.anki2"))
        connection = sqlite3.connect(database)
        try:
            decks_json, models_json = connection.execute("SELECT decks, models FROM col").fetchone()
            rows = connection.execute("SELECT guid, flds, tags, mod, mid FROM notes").fetchall()
        finally:
            connection.close()
    decks = json.loads(decks_json)
    notes = {
        guid: PackageNote(guid, tuple(flds.split("\x1f")), tuple(tags.split()), mod, mid) for guid, flds, tags, mod, mid in rows
    }
    return PackageContent(
        frozenset(d["name"] for d in decks.values() if d["id"] != 1),  # 1: genanki's empty "Default"
        notes,
        {int(k): v for k, v in json.loads(models_json).items()},
    )


def stale_exports(decks: list[Deck], exports_dir: Path, scratch_dir: Path) -> list[str]:
    """How `exports_dir` differs from a rebuild of `decks` with its own manifest and lab results.

    Compares what Anki reads (deck names, note fields, tags, GUIDs, mtimes, the note type),
    never bytes. [] when the exports are current. `scratch_dir` must be an empty folder.
    """
    manifest = read_manifest(exports_dir / MANIFEST_FILE)
    if manifest is None:
        return [f"{MANIFEST_FILE} is missing"]
    # A far-future clock: any note whose content changed gets a stamp the committed one lacks.
    export_anki(decks, scratch_dir, read_lab_results(exports_dir / LAB_RESULTS_FILE), 2**31 - 1, previous=manifest)
    question_id = FIELDS.index("QuestionId")
    problems = []
    for name in sorted(path.name for path in scratch_dir.glob("*.apkg")):
        if not (exports_dir / name).is_file():
            problems.append(f"{name} is missing")
            continue
        expected = read_package(scratch_dir / name)
        try:
            found = read_package(exports_dir / name)
        except UNREADABLE_PACKAGE as error:  # truncated, not a zip, not Anki's collection inside
            problems.append(f"{name} is not a readable Anki package ({type(error).__name__}: {error})")
            continue
        if expected.deck_names != found.deck_names:
            problems.append(f"{name}: decks {sorted(found.deck_names)}, expected {sorted(expected.deck_names)}")
        for guid in sorted(expected.notes.keys() | found.notes.keys()):
            want, have = expected.notes.get(guid), found.notes.get(guid)
            if want is None or have is None:
                note = want or have
                problems.append(f"{name}: note {note.fields[question_id]} is {'missing' if have is None else 'no longer in the bank'}")
            elif (want.fields, want.tags) != (have.fields, have.tags):
                problems.append(f"{name}: note {want.fields[question_id]} has changed")
            elif want.mod != have.mod:
                problems.append(f"{name}: note {want.fields[question_id]} has a stale modification time")
        want_type, have_type = expected.note_types.get(NOTE_TYPE_ID), found.note_types.get(NOTE_TYPE_ID)
        keys = ("name", "flds", "tmpls", "css", "mod")
        if have_type is None or any(want_type[key] != have_type[key] for key in keys):
            problems.append(f"{name}: the note type has changed")
    if read_manifest(scratch_dir / MANIFEST_FILE) != manifest:
        problems.append(f"{MANIFEST_FILE} is out of date")
    return problems
