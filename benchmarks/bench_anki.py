"""Anki export of a 10,000-question bank against bare genanki writing the same notes.

Both write one .apkg with the same 10,000 notes, from the same synthetic bank.
- Ours: the whole `export_anki` path for one deck: render each question, hash it against the
  manifest, per-note mtimes, the package, manifest.json and lab-results.json.
- Bare genanki: what any genanki exporter of these notes must do and no more: build the same
  escaped fields (`render_decks`), then genanki notes with one package-wide timestamp.
The ratio is the price of updating in place (stamps, hashes, manifest). The detail line also
gives bare genanki handed the finished field strings for free, where rendering counts as ours.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import genanki

from benchmarks.figure import Figure
from sharding_lab.catalog import CATALOG
from studyapp.anki_export import anki_deck_id, anki_deck_name, export_anki, render_decks
from studyapp.anki_note_type import CSS, FIELDS, NOTE_TYPE_ID, NOTE_TYPE_NAME, note_type
from studyapp.bank import Deck, Question

QUESTIONS = 10_000
REPEATS = 5  # best of five for each side, in CPU time: the machine is shared
NOW = 1_800_000_000


def synthetic_bank(size: int = QUESTIONS) -> list[Deck]:
    labs = [lab.id for lab in CATALOG]
    questions = tuple(
        Question(
            id=f"bench-q{i}",
            deck_id="bench",
            prompt=f"Question {i}: what does FSDP shard across {i % 8 + 2} GPUs that DDP <replicates> & why?",
            choices=tuple(f"Choice {c} of question {i}, with some words to make it realistic" for c in range(4)),
            answer=i % 4,
            explanation=f"Explanation {i}. " + "Each rank holds about 1/N of the model state; 16Ψ bytes become 16Ψ/N. " * 4,
            why_wrong=tuple("" if c == i % 4 else f"Reason {c}: this is not what FSDP does at all." for c in range(4)),
            lab=labs[i % len(labs)],
            tags=("fsdp", "memory", f"topic-{i % 20}"),
        )
        for i in range(size)
    )
    return [Deck(id="bench", title="Benchmark", questions=questions)]


def lab_results() -> dict[str, dict]:
    config = {"strategy": "fsdp", "world_size": 2, "backend": "gloo", "device": "cpu", "torch_version": "2.13.0"}
    return {lab.id: {"lab": lab.id, "holds": True, "finding": f"{lab.claim} (measured: 0.50x at 2 ranks)", "config": config} for lab in CATALOG}


def _ours(decks: list[Deck], results: dict, out: Path) -> float:
    started = time.process_time()
    export_anki(decks, out, results, NOW, deck_id=decks[0].id)
    return time.process_time() - started


def _bare(decks: list[Deck], results: dict, out: Path, rendered: dict | None = None) -> float:
    """Bare genanki; with `rendered`, the fields come ready-made and are not timed."""
    deck = decks[0]
    started = time.process_time()
    rendered = rendered or render_decks(decks, results)
    model = genanki.Model(
        NOTE_TYPE_ID,
        NOTE_TYPE_NAME,
        fields=[{"name": name} for name in FIELDS],
        templates=note_type(NOW).templates,
        css=CSS,
    )
    anki_deck = genanki.Deck(anki_deck_id(deck.id), anki_deck_name(deck))
    for note in rendered[deck.id]:
        anki_deck.add_note(genanki.Note(model=model, fields=list(note.fields), tags=list(note.tags), guid=note.guid))
    genanki.Package(anki_deck).write_to_file(str(out / "bare.apkg"), timestamp=NOW)
    return time.process_time() - started


def run() -> list[Figure]:
    decks = synthetic_bank()
    results = lab_results()
    rendered = render_decks(decks, results)
    ours, bare, prerendered = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(REPEATS):  # interleaved, so a busy moment hits all three alike
            out = Path(tmp) / str(repeat)
            out.mkdir()
            bare.append(_bare(decks, results, out))
            prerendered.append(_bare(decks, results, out, rendered))
            ours.append(_ours(decks, results, out))  # a fresh folder: every note is stamped anew
    ratio = min(ours) / min(bare)
    detail = (
        f"{QUESTIONS} notes, CPU s, best of {REPEATS}: export_anki {min(ours):.3f}, bare genanki {min(bare):.3f}; "
        f"bare genanki given finished fields {min(prerendered):.3f} ({min(ours) / min(prerendered):.2f}x)"
    )
    return [Figure("Anki export / bare genanki, 10,000 questions", ratio, "x", "<= 1.2", detail)]


if __name__ == "__main__":
    for figure in run():
        print(f"{figure.name}: {figure.value:.3f} {figure.unit} (target {figure.target}) {figure.detail}")
