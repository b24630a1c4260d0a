"""Anki export: the bank as .apkg files that import cleanly, update in place and carry the lab.

What makes a re-import update notes instead of duplicating them:
- Deck ids and the note type id are constants; each note's GUID is `guid_for(question id)`,
  so an edited question is the same note to Anki.
- Anki overwrites an existing note only when the incoming note's mtime is newer than its own.
  Each note gets its own mtime from a manifest (exports/manifest.json) mapping every question
  id to the hash of its rendered note and the mtime it was exported with: an unchanged note
  keeps its mtime (Anki changes nothing and keeps the learner's own edits), a changed one gets
  max(now, previous + 1), so exactly the edited notes update. The note type is stamped the same way.

The core (rendering, stamping, building packages) is pure; `export_anki` does the file I/O and
`export_anki_command` is the thin `studyapp export-anki` CLI.
"""

from __future__ import annotations

import hashlib
import html
import itertools
import json
import sqlite3
import tempfile
import time
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import genanki
from flask import current_app, has_app_context
from flask.cli import with_appcontext

from sharding_lab.catalog import lab_info
from studyapp.anki_note_type import FIELDS, NOTE_TYPE_ID, note_type, note_type_hash
from studyapp.bank import BankError, Deck, Question, load_bank

DEFAULT_EXPORTS_DIR = Path(__file__).resolve().parent.parent / "exports"
ALL_DECKS_FILE = "all-decks.apkg"  # the web app links this name and `<deck id>.apkg`
MANIFEST_FILE = "manifest.json"
LAB_RESULTS_FILE = "lab-results.json"

PARENT_DECK = "Sharding study"
# Generated once, fixed forever. Anki matches decks by name on import, but genanki needs an id
# and a random one per run would make every package look like a different deck.
DECK_IDS: dict[str, int] = {"fsdp": 1_734_518_001, "zero": 1_734_518_002}

LabResult = Mapping[str, Any]  # the JSON of `sharding-lab run LAB --json`
LabResults = Mapping[str, Mapping[str, Any] | None]  # lab id -> its latest result, None: not run


def anki_deck_id(deck_id: str) -> int:
    """The Anki id of a bank deck: a constant for known decks, a stable hash for new ones."""
    if deck_id in DECK_IDS:
        return DECK_IDS[deck_id]
    digest = hashlib.sha256(f"sharding-study deck {deck_id}".encode()).digest()
    return 1_000_000_000 + int.from_bytes(digest[:4], "big") % 1_000_000_000


def anki_deck_name(deck: Deck) -> str:
    return f"{PARENT_DECK}::{deck.title}"


# --- Rendering a question as a note -------------------------------------------------------


@dataclass(frozen=True)
class NoteContent:
    """One question as Anki will store it: fields are HTML with the bank's text escaped."""

    question_id: str
    deck_id: str
    guid: str
    fields: tuple[str, ...]  # in anki_note_type.FIELDS order
    tags: tuple[str, ...]

    def content_hash(self) -> str:
        """A digest of what a re-import would overwrite in the learner's note."""
        # Unit and record separators cannot occur in the fields: Anki itself joins fields with \x1f.
        text = "\x1f".join(self.fields) + "\x1e" + "\x1f".join(self.tags)
        return hashlib.sha256(text.encode()).hexdigest()


def _text(value: str) -> str:
    # Quotes stay as typed: fields are element content; the two the templates put in attributes
    # (QuestionId, AnswerNumber) are a slug and a number.
    return html.escape(value, quote=False).replace("\n", "<br>")


def render_lab_result(result: LabResult | None) -> str:
    """The back's lab finding: whether the claim held, the finding with its numbers, and where
    it was measured (device, world size, backend, torch version)."""
    if not result:
        return (
            '<p class="mc-lab-pending">Not run yet: run the command above (or "Run this lab" '
            "in the study app) to measure it.</p>"
        )
    verdict = {True: "<b>The claim held.</b> ", False: "<b>The claim did not hold.</b> "}.get(result.get("holds"), "")
    finding = str(result.get("finding") or "")
    parts = [f'<p class="mc-lab-finding">{verdict}{_text(finding)}</p>']
    config = result.get("config")
    if isinstance(config, Mapping):
        where = [str(config["device"])] if config.get("device") else []
        sizes = config.get("world_sizes")
        if isinstance(sizes, list) and len(sizes) > 1:
            where.append("world sizes " + ", ".join(str(size) for size in sizes))
        elif config.get("world_size") is not None:
            where.append(f"world size {config['world_size']}")
        labels = (("backend", "{} backend"), ("torch_version", "torch {}"), ("size", "{} model"))
        where += [label.format(config[key]) for key, label in labels if config.get(key) not in (None, "")]
        strategies = config.get("strategies")
        if isinstance(strategies, list) and len(strategies) > 1:
            where.append("strategies " + ", ".join(str(strategy) for strategy in strategies))
        elif config.get("strategy"):
            where.append(f"strategy {config['strategy']}")
        if where:
            parts.append(f'<p class="mc-lab-where">Measured on {_text(", ".join(where))}.</p>')
    return "".join(parts)


# lab-results.json keeps a run without its bulky parts, as `sharding-lab run --export` writes it
# (sharding_lab.labs.runner.summarize; the export reads only the torch-free catalogue).
BULKY_RESULT_KEYS = ("measurements", "charts")


def carried_result(result: LabResult) -> dict[str, Any]:
    return {key: value for key, value in result.items() if key not in BULKY_RESULT_KEYS}


def lab_fields(lab_id: str, lab_result: LabResult | None) -> tuple[str, str, str, str]:
    """LabTitle, LabClaim, LabCommand and LabResult: the same for every question of a lab."""
    lab = lab_info(lab_id)
    if lab is None:  # an unknown lab is the bank validator's to refuse; still show what we can
        return _text(lab_id), "", _text(f"sharding-lab run {lab_id}"), render_lab_result(lab_result)
    return _text(lab.title), _text(lab.claim), _text(lab.command), render_lab_result(lab_result)


def render_note(question: Question, lab_result: LabResult | None = None, lab: tuple[str, ...] | None = None) -> NoteContent:
    """The note for one question, its lab's latest result (None: not run yet) on the back.

    `lab` passes `lab_fields(...)` already rendered, to share them between a lab's questions.
    """
    choices = [_text(text) for text in question.choices]
    listed = "".join([f'<li data-choice="{n}">{text}</li>' for n, text in enumerate(choices, 1)])
    reasons = "".join(
        [
            f'<li data-choice="{n}"><i>{choices[n - 1]}</i>: {_text(reason)}</li>'
            for n, reason in enumerate(question.why_wrong, 1)
            if n - 1 != question.answer
        ]
    )
    fields = (
        _text(question.prompt),
        f'<ol class="mc-choices">{listed}</ol>',
        choices[question.answer],
        str(question.answer + 1),
        _text(question.explanation),
        f'<ul class="mc-why-wrong">{reasons}</ul>' if reasons else "",
        *(lab or lab_fields(question.lab, lab_result)),
        question.id,  # a slug: nothing to escape
    )
    assert len(fields) == len(FIELDS)
    tags = tuple(dict.fromkeys((question.deck_id, *question.tags, question.lab)))  # ordered, no repeats
    return NoteContent(question.id, question.deck_id, genanki.guid_for(question.id), fields, tags)


def render_decks(decks: Iterable[Deck], lab_results: LabResults) -> dict[str, list[NoteContent]]:
    """Every question of every deck as a note, keyed by deck id, in bank order."""
    decks = list(decks)
    labs = {q.lab: lab_fields(q.lab, lab_results.get(q.lab)) for deck in decks for q in deck.questions}
    return {deck.id: [render_note(q, lab=labs[q.lab]) for q in deck.questions] for deck in decks}


# --- Modification times -------------------------------------------------------------------


@dataclass(frozen=True)
class Stamp:
    hash: str
    mod: int  # seconds since the epoch, as Anki stores a note's mtime


@dataclass(frozen=True)
class Manifest:
    """The mtime each note (and the note type) was last exported with, and its content then."""

    note_type: Stamp | None = None
    notes: dict[str, Stamp] = field(default_factory=dict)  # question id -> stamp

    def to_json(self) -> str:
        """One line per note, sorted, so a changed question is a one-line diff."""
        note_type = json.dumps(vars(self.note_type) if self.note_type else None, sort_keys=True)
        notes = ",\n".join(
            f'  {json.dumps(qid)}: {{"hash": "{stamp.hash}", "mod": {stamp.mod}}}' for qid, stamp in sorted(self.notes.items())
        )
        return f'{{\n "note_type": {note_type},\n "notes": {{' + (f"\n{notes}\n " if notes else "") + "}\n}\n"

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        data = json.loads(text)
        note_type = Stamp(**data["note_type"]) if data.get("note_type") else None
        return cls(note_type, {qid: Stamp(**stamp) for qid, stamp in data.get("notes", {}).items()})


def _next_stamp(previous: Stamp | None, content_hash: str, now: int) -> Stamp:
    if previous is not None and previous.hash == content_hash:
        return previous
    # Strictly later than what Anki may already hold, even if the clock went backwards.
    return Stamp(content_hash, now if previous is None else max(now, previous.mod + 1))


def restamp(previous: Manifest, notes: Iterable[NoteContent], now: int) -> Manifest:
    """The manifest for exporting `notes` at `now`. Notes not exported keep their entries."""
    stamps = dict(previous.notes)
    for note in notes:
        stamps[note.question_id] = _next_stamp(previous.notes.get(note.question_id), note.content_hash(), now)
    return Manifest(_next_stamp(previous.note_type, note_type_hash(), now), stamps)


# --- Packages ----------------------------------------------------------------------------


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
        anki_deck = genanki.Deck(anki_deck_id(deck.id), anki_deck_name(deck), _text(deck.description))
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
    with tempfile.TemporaryDirectory() as tmp:
        database = Path(tmp) / "collection.anki2"
        connection = sqlite3.connect(database)
        try:
            connection.execute("PRAGMA synchronous = OFF")
            connection.execute("PRAGMA journal_mode = MEMORY")
            package.write_to_db(connection.cursor(), timestamp, itertools.count(timestamp * 1000))
            connection.commit()
        finally:
            connection.close()
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr(zipfile.ZipInfo("collection.anki2", _ZIP_DATE), database.read_bytes())
            archive.writestr(zipfile.ZipInfo("media", _ZIP_DATE), "{}")  # no media files


_ZIP_DATE = (1980, 1, 1, 0, 0, 0)


def write_package(decks: list[Deck], notes: Mapping[str, list[NoteContent]], manifest: Manifest, path: Path) -> Path:
    package = build_package(decks, notes, manifest)
    write_apkg(package, path, package_timestamp((n for deck in decks for n in notes[deck.id]), manifest))
    return path


# --- Files --------------------------------------------------------------------------------


def read_manifest(path: Path) -> Manifest | None:
    return Manifest.from_json(path.read_text(encoding="utf-8")) if path.is_file() else None


def read_lab_results(path: Path) -> dict[str, dict[str, Any]]:
    """lab id -> the JSON of `sharding-lab run LAB --json`; {} when the file is absent or empty."""
    if not path.is_file() or not path.read_text(encoding="utf-8").strip():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
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
    """
    chosen = [deck for deck in decks if deck_id in (None, deck.id)]
    if not chosen:
        raise ValueError(f"no deck {deck_id!r} in the bank (decks: {', '.join(d.id for d in decks)})")
    out_dir.mkdir(parents=True, exist_ok=True)
    notes = render_decks(chosen, lab_results)
    manifest = restamp(read_manifest(out_dir / MANIFEST_FILE) or previous or Manifest(), (n for ns in notes.values() for n in ns), now)

    written = [write_package([deck], notes, manifest, out_dir / f"{deck.id}.apkg") for deck in chosen]
    if deck_id is None:
        written.append(write_package(chosen, notes, manifest, out_dir / ALL_DECKS_FILE))
    (out_dir / MANIFEST_FILE).write_text(manifest.to_json(), encoding="utf-8")

    # Record the results these notes were built with; with one deck, only its labs change.
    carried = read_lab_results(out_dir / LAB_RESULTS_FILE) if deck_id else {}
    for lab in {q.lab for deck in chosen for q in deck.questions}:
        carried.pop(lab, None)
        if lab_results.get(lab):
            carried[lab] = carried_result(lab_results[lab])
    (out_dir / LAB_RESULTS_FILE).write_text(json.dumps(carried, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return written


# --- Reading packages back: is exports/ current? ----------------------------------------


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
        expected, found = read_package(scratch_dir / name), read_package(exports_dir / name)
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


# --- CLI -----------------------------------------------------------------------------------


def stored_lab_results() -> dict[str, dict[str, Any]]:
    """Per lab, the result of its latest finished run in the app's database; {} without one.

    Read defensively: the export must also work outside the app (no app context), against a
    database that does not exist yet, or before the lab-run table does.
    """
    if not has_app_context():
        return {}
    try:
        from sqlalchemy import inspect
        from sqlmodel import Session, select

        from studyapp.db import get_engine
        from studyapp.models import LabRun

        engine = get_engine()
        if not inspect(engine).has_table(LabRun.__tablename__):
            return {}
        with Session(engine) as session:
            query = select(LabRun).where(LabRun.status == "done").order_by(LabRun.finished_at, LabRun.id)
            runs = session.exec(query).all()
    except Exception as error:  # noqa: BLE001 - no usable database is a normal case: use the file
        click.echo(f"lab results: not read from the database ({type(error).__name__}: {error})", err=True)
        return {}
    latest: dict[str, dict[str, Any]] = {}
    for run in runs:  # oldest first, so each lab's latest run wins
        if isinstance(run.result, dict):
            latest[run.lab_id] = run.result
    return latest


def _app_setting(key: str) -> str | None:
    """A setting of the running app (`studyapp export-anki` runs in its context), else None."""
    return current_app.config.get(key) if has_app_context() else None


@click.command("export-anki")
@click.option("--deck", "deck_id", default=None, help="Export only this deck (default: every deck, plus all-decks.apkg).")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Folder for the .apkg files, manifest.json and lab-results.json (default: the app's exports/).",
)
@click.option("--bank", "bank_dir", type=click.Path(exists=True, path_type=Path), default=None, help="Bank folder (default: the app's bank/).")
@click.option("--check", is_flag=True, help="Write nothing; fail if the folder is out of date with the bank.")
@with_appcontext
def export_anki_command(deck_id: str | None, out_dir: Path | None, bank_dir: Path | None, check: bool) -> None:
    """Write the bank as Anki packages: one per deck and all-decks.apkg."""
    out_dir = out_dir or Path(_app_setting("EXPORTS_DIR") or DEFAULT_EXPORTS_DIR)
    try:
        decks = load_bank(bank_dir or _app_setting("BANK_PATH"))
    except BankError as error:
        raise click.ClickException(str(error)) from error
    if check:
        with tempfile.TemporaryDirectory() as scratch:
            problems = stale_exports(decks, out_dir, Path(scratch))
        if problems:
            raise click.ClickException(f"{out_dir} is out of date; run `studyapp export-anki`:\n  " + "\n  ".join(problems))
        click.echo(f"{out_dir} is up to date with the bank")
        return
    # Per lab: its latest run in the app's database, else the result the exports already carry.
    results_file = out_dir / LAB_RESULTS_FILE
    if not results_file.is_file():
        results_file = DEFAULT_EXPORTS_DIR / LAB_RESULTS_FILE
    from_file = read_lab_results(results_file)
    from_db = stored_lab_results()
    # Stamps continue from the folder's own manifest, else from the committed one: a learner who
    # imported the committed decks must not see unchanged notes as newer.
    previous = read_manifest(DEFAULT_EXPORTS_DIR / MANIFEST_FILE)
    try:
        written = export_anki(decks, out_dir, {**from_file, **from_db}, int(time.time()), deck_id, previous)
    except ValueError as error:
        raise click.ClickException(str(error)) from error
    click.echo(f"lab results: {len(from_db)} from the database, {len(set(from_file) - set(from_db))} from {results_file}")
    for path in written:
        click.echo(f"wrote {path}")
