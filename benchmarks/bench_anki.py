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

import gc
import tempfile
import time
from pathlib import Path

import genanki

from benchmarks.figure import Figure
from sharding_lab.catalog import CATALOG
from studyapp.anki import anki_deck_id, anki_deck_name, export_anki, render_decks
from studyapp.anki.note_type import CSS, FIELDS, NOTE_TYPE_ID, NOTE_TYPE_NAME, note_type
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


def _timed(work, *args) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one call. CPU time is the figure: the machine is shared."""
    gc.collect()  # each side starts from a clean heap: no collecting of the other side's garbage
    cpu, wall = time.process_time(), time.perf_counter()
    work(*args)
    return time.process_time() - cpu, time.perf_counter() - wall


def _best(timings: list[tuple[float, float]]) -> tuple[float, float]:
    return min(cpu for cpu, _ in timings), min(wall for _, wall in timings)


def _ours(decks: list[Deck], results: dict, out: Path) -> None:
    export_anki(decks, out, results, NOW, deck_id=decks[0].id)


def _bare(decks: list[Deck], results: dict, out: Path, rendered: dict | None = None) -> None:
    """Bare genanki; with `rendered`, the fields come ready-made and are not timed."""
    deck = decks[0]
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
    # genanki's scratch collection is a mkstemp file it never deletes (36 MB at 10,000 notes): made in
    # `out`, so the bench's own temporary folder takes it away.
    previous, tempfile.tempdir = tempfile.tempdir, str(out)
    try:
        genanki.Package(anki_deck).write_to_file(str(out / "bare.apkg"), timestamp=NOW)
    finally:
        tempfile.tempdir = previous


def run() -> list[Figure]:
    decks = synthetic_bank()
    results = lab_results()
    rendered = render_decks(decks, results)
    ours, bare, prerendered = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(REPEATS):  # interleaved, so a busy moment hits all three alike
            out = Path(tmp) / str(repeat)
            out.mkdir()
            bare.append(_timed(_bare, decks, results, out))
            prerendered.append(_timed(_bare, decks, results, out, rendered))
            ours.append(_timed(_ours, decks, results, out))  # a fresh folder: every note is stamped anew
    (ours_cpu, ours_wall), (bare_cpu, bare_wall), (prerendered_cpu, _) = (_best(t) for t in (ours, bare, prerendered))
    ratio = ours_cpu / bare_cpu
    detail = (
        f"{QUESTIONS} notes, best of {REPEATS}, CPU s: export_anki {ours_cpu:.3f}, bare genanki {bare_cpu:.3f}, "
        f"bare genanki given finished fields {prerendered_cpu:.3f} ({ours_cpu / prerendered_cpu:.2f}x); "
        f"wall s: {ours_wall:.3f} vs {bare_wall:.3f} ({ours_wall / bare_wall:.2f}x)"
    )
    return [Figure("Anki export / bare genanki, 10,000 questions", ratio, "x", "<= 1.2", detail)]


if __name__ == "__main__":
    for figure in run():
        print(f"{figure.name}: {figure.value:.3f} {figure.unit} (target {figure.target}) {figure.detail}")
