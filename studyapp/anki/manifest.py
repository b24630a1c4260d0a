"""Each note's modification time, kept in exports/manifest.json so that re-imports update in place.

Anki overwrites an existing note only when the incoming note's mtime is newer than its own. The
manifest maps every question id to the hash of its rendered note and the mtime it was exported
with: an unchanged note keeps its mtime (Anki changes nothing and keeps the learner's own
edits), a changed one gets max(now, previous + 1), so exactly the edited notes update. The note
type is stamped the same way.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from studyapp.anki.note_type import note_type_hash
from studyapp.anki.render import NoteContent

T = TypeVar("T")

MANIFEST_FILE = "manifest.json"


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
        """The manifest `to_json` wrote; ValueError saying what is wrong with any other text."""
        data = json.loads(text)
        if not isinstance(data, dict) or not isinstance(data.get("notes", {}), dict):
            raise ValueError(f'not an object with "notes" by question id: {json_excerpt(data)}')
        note_type = _stamp(data["note_type"], "the note type's stamp") if data.get("note_type") else None
        return cls(note_type, {qid: _stamp(stamp, f"the stamp of {qid}") for qid, stamp in data.get("notes", {}).items()})


class ExportFileError(Exception):
    """A file beside the packages (the manifest, lab-results.json) that is not as this app writes it:
    one line naming the file and what is wrong."""

    def __init__(self, path: Path, problem: str):
        super().__init__(f"{path} {problem}")
        self.path = path


def read_export_file(path: Path, what: str, parse: Callable[[str], T]) -> T:
    """`parse` of the file's text; ExportFileError naming the file when it cannot be read or parsed
    (`parse` raises ValueError saying why; not UTF-8 and bad JSON are ValueErrors too)."""
    try:
        return parse(path.read_text(encoding="utf-8"))
    except OSError as error:  # e.g. no permission
        raise ExportFileError(path, f"cannot be read: {error.strerror}") from None
    except ValueError as error:
        raise ExportFileError(path, f"is not {what}: {error}") from None
    except RecursionError:  # JSON nested past Python's recursion limit
        raise ExportFileError(path, f"is not {what}: it nests too deeply to read") from None


def json_excerpt(value: object) -> str:
    """`value` as JSON, cut to fit in an error line."""
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _stamp(value: object, what: str) -> Stamp:
    if isinstance(value, dict) and value.keys() == {"hash", "mod"}:
        content_hash, mod = value["hash"], value["mod"]
        if isinstance(content_hash, str) and isinstance(mod, int) and not isinstance(mod, bool):  # JSON true is no mtime
            return Stamp(content_hash, mod)
    raise ValueError(f'{what} is not {{"hash": text, "mod": seconds}}: {json_excerpt(value)}')


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


def read_manifest(path: Path) -> Manifest | None:
    """The manifest in `path`; None when there is none yet. ExportFileError when it is not one."""
    if not path.is_file():
        return None
    return read_export_file(path, "a manifest this app wrote", Manifest.from_json)
