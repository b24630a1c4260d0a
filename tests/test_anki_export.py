"""The Anki export, checked by importing it into a real Anki collection (the `anki` package)."""

from __future__ import annotations

import html
import json
import re
import time
from datetime import datetime, timezone
from pathlib import Path
from unittest.mock import ANY

import genanki
import pytest
import yaml
from anki import import_export_pb2
from anki.collection import Collection, ImportAnkiPackageOptions, ImportAnkiPackageRequest

import studyapp.anki.note_type as anki_note_type
from sharding_lab.catalog import lab_info
from studyapp.anki import (
    ALL_DECKS_FILE,
    DEFAULT_EXPORTS_DIR,
    LAB_RESULTS_FILE,
    MANIFEST_FILE,
    Manifest,
    Stamp,
    export_anki,
    read_lab_results,
    read_manifest,
    read_package,
    render_lab_result,
    render_note,
    restamp,
    stale_exports,
)
from studyapp.anki.manifest import ExportFileError
from studyapp.anki.note_type import FIELDS, NOTE_TYPE_ID, NOTE_TYPE_NAME
from studyapp.bank import load_bank

T0 = int(time.time()) - 86_400  # the first export, a day ago: the learner's edits come later

LAB_RESULT = {
    "lab": "what-fsdp-shards",
    "claim": "Under FSDP each rank holds about 1/N.",
    "holds": True,
    "finding": "optimizer state is 2.00x the parameter bytes per rank under DDP and 0.50x under FSDP at 2 ranks",
    "measurements": {"fsdp": {"bytes": 123}},
    "charts": ["<svg>bulky</svg>"],
    "config": {"strategy": "fsdp", "world_size": 2, "backend": "gloo", "device": "cpu", "torch_version": "2.13.0"},
}


def _question(qid: str, prompt: str, lab: str = "what-fsdp-shards", tags: tuple[str, ...] = ("memory",)) -> dict:
    return {
        "id": qid,
        "prompt": prompt,
        "choices": [
            {"text": f"Right answer to {qid}", "correct": True},
            {"text": f"Wrong answer to {qid}", "why_wrong": f"Why {qid}'s distractor is wrong."},
            {"text": f"Another wrong answer to {qid}", "why_wrong": "Because it moves no data."},
        ],
        "explanation": f"Why the answer to {qid} is right.\nA second line.",
        "lab": lab,
        "tags": list(tags),
    }


def write_bank(root: Path, edits: dict[str, str] | None = None, extra: list[dict] | None = None) -> Path:
    """A two-deck bank in `root`; `edits` maps a question id to a new prompt."""
    decks = {
        "fsdp": ("Fully Sharded Data Parallel", [_question(f"fsdp-q{i}", f"FSDP question {i}?") for i in range(1, 4)]),
        "zero": (
            "ZeRO and Sharded Optimizers",
            [_question(f"zero-q{i}", f"ZeRO question {i}?", lab="adam-optimizer-state", tags=("zero", "optimizer")) for i in range(1, 3)],
        ),
    }
    decks["zero"][1].extend(extra or [])
    root.mkdir(parents=True, exist_ok=True)
    for deck_id, (title, questions) in decks.items():
        for question in questions:
            question["prompt"] = (edits or {}).get(question["id"], question["prompt"])
        text = yaml.safe_dump({"id": deck_id, "title": title, "description": f"{title} & more", "questions": questions}, sort_keys=False)
        (root / f"{deck_id}.yaml").write_text(text, encoding="utf-8")
    return root


@pytest.fixture
def collection(tmp_path):
    (tmp_path / "learner").mkdir()
    col = Collection(str(tmp_path / "learner" / "collection.anki2"))
    yield col
    col.close()


IF_NEWER = import_export_pb2.ImportAnkiPackageUpdateCondition.IMPORT_ANKI_PACKAGE_UPDATE_CONDITION_IF_NEWER


def import_package(col: Collection, path: Path) -> dict[str, list[str]]:
    """Import as Anki's import dialog does by default: update notes and note types only when newer."""
    options = ImportAnkiPackageOptions(update_notes=IF_NEWER, update_notetypes=IF_NEWER, with_scheduling=False)
    response = col.import_anki_package(ImportAnkiPackageRequest(package_path=str(path), options=options))
    log = response.log
    guid_of = dict(col.db.all("SELECT id, guid FROM notes"))
    kinds = ("new", "updated", "duplicate", "conflicting", "first_field_match", "missing_notetype", "missing_deck")
    return {kind: sorted(guid_of.get(note.id.nid, "?") for note in getattr(log, kind)) for kind in kinds}


def notes_in(col: Collection) -> dict[str, dict]:
    """guid -> the note as the learner's collection holds it."""
    rows = col.db.all(
        "SELECT n.guid, n.flds, n.tags, n.mod, n.mid, c.did FROM notes n JOIN cards c ON c.nid = n.id"
    )
    return {
        guid: {"fields": dict(zip(FIELDS, flds.split("\x1f"), strict=True)), "tags": set(tags.split()), "mod": mod, "mid": mid, "deck": col.decks.name(did)}
        for guid, flds, tags, mod, mid, did in rows
    }


def guid(qid: str) -> str:
    return genanki.guid_for(qid)


# --- Importing into Anki ---------------------------------------------------------------------


def test_every_question_is_a_note_with_the_expected_fields(tmp_path, collection):
    decks = load_bank(write_bank(tmp_path / "bank"))
    written = export_anki(decks, tmp_path / "out", {"what-fsdp-shards": LAB_RESULT}, T0)
    assert sorted(p.name for p in written) == [ALL_DECKS_FILE, "fsdp.apkg", "zero.apkg"]

    log = import_package(collection, tmp_path / "out" / ALL_DECKS_FILE)
    questions = [q for deck in decks for q in deck.questions]
    assert log["new"] == sorted(guid(q.id) for q in questions)
    assert not log["updated"] and not log["duplicate"] and not log["conflicting"]

    notes = notes_in(collection)
    assert len(notes) == len(questions) == 5
    for question in questions:
        note = notes[guid(question.id)]
        assert (note["fields"]["Question"], note["fields"]["QuestionId"]) == (question.prompt, question.id)
        assert note["mod"] == T0
        assert note["mid"] == NOTE_TYPE_ID
    # Two notes as Anki stores them, written out by hand: a lab with a result, and one without.
    assert notes[guid("fsdp-q1")]["fields"] == {
        "Question": "FSDP question 1?",
        "Choices": '<ol class="mc-choices"><li data-choice="1">Right answer to fsdp-q1</li>'
                   '<li data-choice="2">Wrong answer to fsdp-q1</li><li data-choice="3">Another wrong answer to fsdp-q1</li></ol>',
        "Answer": "Right answer to fsdp-q1",
        "AnswerNumber": "1",
        "Explanation": "Why the answer to fsdp-q1 is right.<br>A second line.",
        "WhyWrong": '<ul class="mc-why-wrong"><li data-choice="2"><i>Wrong answer to fsdp-q1</i>: Why fsdp-q1\'s distractor is wrong.</li>'
                    '<li data-choice="3"><i>Another wrong answer to fsdp-q1</i>: Because it moves no data.</li></ul>',
        "LabTitle": "What FSDP shards that DDP replicates",
        "LabClaim": "Under DDP every rank holds full parameters, gradients and optimizer state; "
                    "under FSDP each rank holds about 1/N of each.",
        "LabCommand": "sharding-lab run what-fsdp-shards",
        "LabResult": '<p class="mc-lab-finding"><b>The claim held.</b> optimizer state is 2.00x the parameter bytes per '
                     'rank under DDP and 0.50x under FSDP at 2 ranks</p>'
                     '<p class="mc-lab-where">Measured on cpu, world size 2, gloo backend, torch 2.13.0, strategy fsdp.</p>',
        "QuestionId": "fsdp-q1",
    }
    assert notes[guid("fsdp-q1")]["tags"] == {"fsdp", "memory", "what-fsdp-shards"}
    assert notes[guid("fsdp-q1")]["deck"] == "Sharding study::Fully Sharded Data Parallel"
    assert notes[guid("zero-q1")]["fields"] == {
        "Question": "ZeRO question 1?",
        "Choices": '<ol class="mc-choices"><li data-choice="1">Right answer to zero-q1</li>'
                   '<li data-choice="2">Wrong answer to zero-q1</li><li data-choice="3">Another wrong answer to zero-q1</li></ol>',
        "Answer": "Right answer to zero-q1",
        "AnswerNumber": "1",
        "Explanation": "Why the answer to zero-q1 is right.<br>A second line.",
        "WhyWrong": '<ul class="mc-why-wrong"><li data-choice="2"><i>Wrong answer to zero-q1</i>: Why zero-q1\'s distractor is wrong.</li>'
                    '<li data-choice="3"><i>Another wrong answer to zero-q1</i>: Because it moves no data.</li></ul>',
        "LabTitle": "Adam's optimizer state against the model",
        "LabClaim": "Adam keeps two fp32 values per parameter, 2x the fp32 parameter bytes; with PyTorch's "
                    "mixed precision a rank still keeps 4/4/8 bytes per parameter (fp32 shards as master weights), "
                    "where the ZeRO paper counts 2/2/12.",
        "LabCommand": "sharding-lab run adam-optimizer-state",
        "LabResult": '<p class="mc-lab-pending">Not run yet: run the command above (or "Run this lab" in the study app) '
                     "to measure it.</p>",
        "QuestionId": "zero-q1",
    }
    assert notes[guid("zero-q1")]["tags"] == {"zero", "optimizer", "adam-optimizer-state"}  # the deck's id once
    assert notes[guid("zero-q2")]["deck"] == "Sharding study::ZeRO and Sharded Optimizers"
    assert {d.name for d in collection.decks.all_names_and_ids()} >= {
        "Sharding study",
        "Sharding study::Fully Sharded Data Parallel",
        "Sharding study::ZeRO and Sharded Optimizers",
    }
    note_type = collection.models.get(NOTE_TYPE_ID)
    assert note_type["name"] == NOTE_TYPE_NAME
    assert [f["name"] for f in note_type["flds"]] == list(FIELDS)


def test_each_deck_package_holds_its_own_deck_and_imports_alongside_the_others(tmp_path, collection):
    export_anki(load_bank(write_bank(tmp_path / "bank")), tmp_path / "out", {}, T0)
    fsdp = read_package(tmp_path / "out" / "fsdp.apkg")
    assert fsdp.deck_names == {"Sharding study::Fully Sharded Data Parallel"}
    assert set(fsdp.notes) == {guid(f"fsdp-q{i}") for i in (1, 2, 3)}

    assert len(import_package(collection, tmp_path / "out" / "fsdp.apkg")["new"]) == 3
    assert len(import_package(collection, tmp_path / "out" / "zero.apkg")["new"]) == 2
    # The combined package then only meets notes the learner already has: nothing new, nothing doubled.
    log = import_package(collection, tmp_path / "out" / ALL_DECKS_FILE)
    assert (len(log["new"]), len(log["updated"]), len(log["duplicate"])) == (0, 0, 5)
    assert len(notes_in(collection)) == 5
    assert len([m for m in collection.models.all_names_and_ids() if m.name.startswith(NOTE_TYPE_NAME)]) == 1


def test_an_unchanged_reexport_changes_nothing_and_keeps_the_learners_edits(tmp_path, collection):
    bank = load_bank(write_bank(tmp_path / "bank"))
    export_anki(bank, tmp_path / "out", {}, T0)
    import_package(collection, tmp_path / "out" / ALL_DECKS_FILE)
    manifest_before = (tmp_path / "out" / MANIFEST_FILE).read_text()

    # The learner adds a mnemonic to one note in Anki.
    note = collection.get_note(collection.db.scalar("SELECT id FROM notes WHERE guid = ?", guid("fsdp-q2")))
    note["Explanation"] += "<br>My mnemonic."
    collection.update_note(note)

    packages_before = {p.name: p.read_bytes() for p in (tmp_path / "out").glob("*.apkg")}
    export_anki(load_bank(tmp_path / "bank"), tmp_path / "out", {}, T0 + 3600)
    assert (tmp_path / "out" / MANIFEST_FILE).read_text() == manifest_before
    # Byte for byte, even: re-running the export on an unchanged bank leaves git with nothing to commit.
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").glob("*.apkg")} == packages_before
    log = import_package(collection, tmp_path / "out" / ALL_DECKS_FILE)
    assert (len(log["new"]), len(log["updated"]), len(log["duplicate"])) == (0, 0, 5)
    notes = notes_in(collection)
    assert notes[guid("fsdp-q2")]["fields"]["Explanation"].endswith("My mnemonic.")
    assert {n["mod"] for g, n in notes.items() if g != guid("fsdp-q2")} == {T0}


def test_editing_one_question_updates_exactly_that_note(tmp_path, collection):
    export_anki(load_bank(write_bank(tmp_path / "bank")), tmp_path / "out", {}, T0)
    import_package(collection, tmp_path / "out" / ALL_DECKS_FILE)
    ids_before = dict(collection.db.all("SELECT guid, id FROM notes"))
    # The learner has studied the card: a review card, due in 10 days.
    collection.db.execute("UPDATE cards SET type = 2, queue = 2, ivl = 10, due = 100, reps = 3")
    cards_before = collection.db.all("SELECT id, nid, did, type, queue, ivl, due, reps FROM cards ORDER BY id")

    write_bank(tmp_path / "bank", edits={"zero-q1": "ZeRO question 1, reworded?"})
    now = T0 + 3600
    export_anki(load_bank(tmp_path / "bank"), tmp_path / "out", {}, now)
    stamps = read_manifest(tmp_path / "out" / MANIFEST_FILE).notes
    assert stamps["zero-q1"].mod == now
    assert {s.mod for qid, s in stamps.items() if qid != "zero-q1"} == {T0}

    log = import_package(collection, tmp_path / "out" / ALL_DECKS_FILE)
    assert log["updated"] == [guid("zero-q1")]
    assert not log["new"] and not log["conflicting"]
    assert len(log["duplicate"]) == 4
    notes = notes_in(collection)
    assert len(notes) == 5  # no duplicate note
    assert notes[guid("zero-q1")]["fields"]["Question"] == "ZeRO question 1, reworded?"
    assert dict(collection.db.all("SELECT guid, id FROM notes")) == ids_before  # same notes, updated in place
    assert collection.db.all("SELECT id, nid, did, type, queue, ivl, due, reps FROM cards ORDER BY id") == cards_before

    # Importing the same package again is a no-op; so is an older package.
    log = import_package(collection, tmp_path / "out" / "zero.apkg")
    assert (len(log["new"]), len(log["updated"]), len(log["duplicate"])) == (0, 0, 2)


def test_a_new_question_is_one_new_note(tmp_path, collection):
    export_anki(load_bank(write_bank(tmp_path / "bank")), tmp_path / "out", {}, T0)
    import_package(collection, tmp_path / "out" / ALL_DECKS_FILE)
    write_bank(tmp_path / "bank", extra=[_question("zero-q9", "A new question?", lab="adam-optimizer-state")])
    export_anki(load_bank(tmp_path / "bank"), tmp_path / "out", {}, T0 + 60)
    log = import_package(collection, tmp_path / "out" / "zero.apkg")
    assert (log["new"], log["updated"], len(log["duplicate"])) == ([guid("zero-q9")], [], 2)


def test_a_new_lab_result_updates_the_notes_of_that_lab_only(tmp_path, collection):
    bank = load_bank(write_bank(tmp_path / "bank"))
    export_anki(bank, tmp_path / "out", {}, T0)
    import_package(collection, tmp_path / "out" / ALL_DECKS_FILE)
    assert "Not run yet" in notes_in(collection)[guid("fsdp-q1")]["fields"]["LabResult"]

    export_anki(bank, tmp_path / "out", {"what-fsdp-shards": LAB_RESULT}, T0 + 60)
    carried = read_lab_results(tmp_path / "out" / LAB_RESULTS_FILE)
    assert carried == {"what-fsdp-shards": {k: v for k, v in LAB_RESULT.items() if k not in ("measurements", "charts")}}
    log = import_package(collection, tmp_path / "out" / ALL_DECKS_FILE)
    assert log["updated"] == sorted(guid(f"fsdp-q{i}") for i in (1, 2, 3))
    assert len(log["duplicate"]) == 2
    result = notes_in(collection)[guid("fsdp-q1")]["fields"]["LabResult"]
    assert "The claim held." in result
    assert "2.00x the parameter bytes per rank under DDP and 0.50x under FSDP at 2 ranks" in result
    assert "Measured on cpu, world size 2, gloo backend, torch 2.13.0, strategy fsdp." in result


def test_a_changed_note_type_is_updated_in_place(tmp_path, collection, monkeypatch):
    bank = load_bank(write_bank(tmp_path / "bank"))
    export_anki(bank, tmp_path / "out", {}, T0)
    import_package(collection, tmp_path / "out" / ALL_DECKS_FILE)

    monkeypatch.setattr(anki_note_type, "CSS", anki_note_type.CSS + "\n.mc-prompt { color: teal; }\n")
    export_anki(bank, tmp_path / "out", {}, T0 + 60)
    assert read_manifest(tmp_path / "out" / MANIFEST_FILE).note_type.mod == T0 + 60
    log = import_package(collection, tmp_path / "out" / ALL_DECKS_FILE)
    assert (len(log["new"]), len(log["updated"]), len(log["conflicting"])) == (0, 0, 0)
    ours = [m for m in collection.models.all_names_and_ids() if m.name.startswith(NOTE_TYPE_NAME)]
    assert [m.id for m in ours] == [NOTE_TYPE_ID]
    assert "color: teal" in collection.models.get(NOTE_TYPE_ID)["css"]


def test_text_is_escaped_html(tmp_path, collection):
    nasty = _question("fsdp-q9", "Is <script>alert('x')</script> & <b>bold</b> shown as text?")
    nasty["choices"][1]["text"] = "a < b && c > d"
    nasty["explanation"] = "Use &amp; to write &."
    write_bank(tmp_path / "bank")
    (tmp_path / "bank" / "extra.yaml").write_text(
        yaml.safe_dump({"id": "extra", "title": "Q&A <tricky>", "questions": [nasty]}), encoding="utf-8"
    )
    export_anki(load_bank(tmp_path / "bank"), tmp_path / "out", {}, T0)
    import_package(collection, tmp_path / "out" / "extra.apkg")
    note = notes_in(collection)[guid("fsdp-q9")]
    assert note["fields"]["Question"] == "Is &lt;script&gt;alert('x')&lt;/script&gt; &amp; &lt;b&gt;bold&lt;/b&gt; shown as text?"
    assert '<li data-choice="2">a &lt; b &amp;&amp; c &gt; d</li>' in note["fields"]["Choices"]
    assert note["fields"]["Explanation"] == "Use &amp;amp; to write &amp;."
    assert "<script>" not in "".join(note["fields"].values())
    # The export skips genanki's own check for unescaped tags (for speed): it must find nothing.
    assert all(genanki.Note._find_invalid_html_tags_in_field(value) == [] for value in note["fields"].values())
    assert note["deck"] == "Sharding study::Q&A <tricky>"  # a deck name is plain text, not HTML


def test_lab_result_says_whether_the_claim_held_and_where_it_was_measured():
    assert "Not run yet" in render_lab_result(None)
    failed = {
        "holds": False,
        "finding": "stage 3 moved 3.1x < 2x & more",
        "config": {"strategy": "zero2, zero3", "strategies": ["zero2", "zero3"], "world_size": 4, "world_sizes": [2, 4], "device": "cuda", "torch_version": "2.13.0+cu128", "size": "debugmodel"},
    }
    assert render_lab_result(failed) == (
        '<p class="mc-lab-finding"><b>The claim did not hold.</b> stage 3 moved 3.1x &lt; 2x &amp; more</p>'
        '<p class="mc-lab-where">Measured on cuda, world sizes 2, 4, torch 2.13.0+cu128, debugmodel model, strategies zero2, zero3.</p>'
    )
    assert render_lab_result({"finding": "no config"}) == '<p class="mc-lab-finding">no config</p>'
    on_gpu = {"holds": True, "finding": "f", "config": {"device": "cuda", "gpu_name": "NVIDIA H200", "world_size": 2,
                                                        "backend": "nccl", "torch_version": "2.11.0+cu130", "cuda_version": "13.0"}}
    assert render_lab_result(on_gpu).endswith(
        '<p class="mc-lab-where">Measured on cuda (NVIDIA H200), world size 2, nccl backend, torch 2.11.0+cu130, CUDA 13.0.</p>')


# --- Stamps ---------------------------------------------------------------------------------


def test_stamps_keep_unchanged_notes_and_move_changed_ones_strictly_later(tmp_path):
    decks = load_bank(write_bank(tmp_path / "bank"))
    notes = [render_note(q) for deck in decks for q in deck.questions]
    first = restamp(Manifest(), notes, now=1000)
    assert {s.mod for s in first.notes.values()} == {1000} and first.note_type.mod == 1000
    assert restamp(first, notes, now=5000) == first

    edited = load_bank(write_bank(tmp_path / "bank", edits={"fsdp-q1": "Edited?"}))
    edited_notes = [render_note(q) for deck in edited for q in deck.questions]
    second = restamp(first, edited_notes, now=5000)
    assert second.notes["fsdp-q1"].mod == 5000
    assert {qid for qid, s in second.notes.items() if s != first.notes[qid]} == {"fsdp-q1"}
    # A clock that went backwards still gives a strictly later stamp.
    third = restamp(second, [render_note(edited[0].questions[0], LAB_RESULT)], now=10)
    assert third.notes["fsdp-q1"].mod == 5001
    # Exporting one deck keeps the other deck's stamps.
    assert restamp(Manifest(), notes[:3], now=7).notes.keys() == {"fsdp-q1", "fsdp-q2", "fsdp-q3"}
    assert set(restamp(first, notes[:3], now=7).notes) == set(first.notes)


def test_manifest_round_trips_through_json():
    manifest = Manifest(Stamp("a", 1), {"q2": Stamp("b", 3), "q1": Stamp("c", 2)})
    assert Manifest.from_json(manifest.to_json()) == manifest


def test_exporting_one_deck_writes_only_its_package(tmp_path):
    decks = load_bank(write_bank(tmp_path / "bank"))
    written = export_anki(decks, tmp_path / "out", {"adam-optimizer-state": LAB_RESULT}, T0, deck_id="zero")
    assert [p.name for p in written] == ["zero.apkg"]
    assert set(read_manifest(tmp_path / "out" / MANIFEST_FILE).notes) == {"zero-q1", "zero-q2"}
    with pytest.raises(ValueError, match="no deck 'nope'"):
        export_anki(decks, tmp_path / "out", {}, T0, deck_id="nope")


# --- The CLI and the committed exports ------------------------------------------------------


def test_cli_writes_every_package(runner, tmp_path):
    write_bank(tmp_path / "ours")
    out = tmp_path / "out"
    args = ["export-anki", "--bank", str(tmp_path / "ours"), "--out", str(out)]
    result = runner.invoke(args=args)
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == sorted([ALL_DECKS_FILE, "fsdp.apkg", "zero.apkg", MANIFEST_FILE, LAB_RESULTS_FILE])
    assert f"wrote {out / ALL_DECKS_FILE}" in result.output

    result = runner.invoke(args=[*args, "--deck", "fsdp"])
    assert result.exit_code == 0, result.output
    assert "fsdp.apkg" in result.output and ALL_DECKS_FILE not in result.output
    result = runner.invoke(args=[*args, "--deck", "nope"])
    assert result.exit_code != 0 and "no deck 'nope'" in result.output


def test_a_folder_with_its_own_manifest_exports_whatever_the_committed_one_holds(runner, tmp_path, monkeypatch):
    import studyapp.cli.anki as anki_cli

    write_bank(tmp_path / "ours")
    out = tmp_path / "out"
    args = ["export-anki", "--bank", str(tmp_path / "ours"), "--out", str(out)]
    assert runner.invoke(args=args).exit_code == 0  # the folder now has its own manifest
    committed = tmp_path / "committed"
    committed.mkdir()
    (committed / MANIFEST_FILE).write_text("{", encoding="utf-8")  # damaged, and never needed here
    (committed / LAB_RESULTS_FILE).write_text("{}", encoding="utf-8")
    monkeypatch.setattr(anki_cli, "DEFAULT_EXPORTS_DIR", committed)
    result = runner.invoke(args=args)
    assert result.exit_code == 0 and f"wrote {out / ALL_DECKS_FILE}" in result.output, result.output
    (out / MANIFEST_FILE).unlink()  # now the committed stamps are needed: refused, naming that file
    result = runner.invoke(args=args)
    assert result.exit_code == 1 and f"Error: {committed / MANIFEST_FILE} is not a manifest this app wrote" in result.output


def test_an_export_cut_off_midway_never_leaves_a_published_package_newer_than_its_manifest(tmp_path, collection,
                                                                                           monkeypatch):
    # Killed after fsdp.apkg but before the manifest, an export once left the edit's stamp unrecorded: the
    # author's revert was then stamped as old as before the edit, and the learner, who had imported the
    # edited fsdp.apkg, kept the edit (Anki updates a note only from a newer one).
    import studyapp.anki.package as package

    bank, out = tmp_path / "bank", tmp_path / "out"
    export_anki(load_bank(write_bank(bank)), out, {}, T0)
    import_package(collection, out / ALL_DECKS_FILE)
    write_bank(bank, edits={"fsdp-q1": "FSDP question 1, reworded?"})
    write_whole_package = package.write_package

    def killed_after_the_first_package(decks, *args):
        if (out / "fsdp.apkg").stat().st_mtime_ns != first_written:
            raise KeyboardInterrupt  # stands for the SIGKILL: nothing after this runs
        return write_whole_package(decks, *args)

    first_written = (out / "fsdp.apkg").stat().st_mtime_ns
    monkeypatch.setattr(package, "write_package", killed_after_the_first_package)
    with pytest.raises(KeyboardInterrupt):
        export_anki(load_bank(bank), out, {}, T0 + 3600)
    monkeypatch.undo()
    assert import_package(collection, out / "fsdp.apkg")["updated"] == [guid("fsdp-q1")]  # the learner has the edit

    write_bank(bank)  # the author reverts it
    export_anki(load_bank(bank), out, {}, T0 + 7200)
    assert import_package(collection, out / "fsdp.apkg")["updated"] == [guid("fsdp-q1")]
    assert notes_in(collection)[guid("fsdp-q1")]["fields"]["Question"] == "FSDP question 1?"


def test_one_decks_file_is_refused_as_the_bank_to_export(runner, tmp_path):
    # It was exported as the whole bank: all-decks.apkg and lab-results.json lost every other deck.
    write_bank(tmp_path / "ours")
    result = runner.invoke(args=["export-anki", "--bank", str(tmp_path / "ours" / "fsdp.yaml"), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and "'--bank'" in result.output and "is a file" in result.output
    assert not (tmp_path / "out").exists()


def test_a_failed_export_keeps_the_packages_it_had_and_says_why(runner, tmp_path, monkeypatch):
    import studyapp.anki.package as package

    write_bank(tmp_path / "ours")
    out = tmp_path / "out"
    args = ["export-anki", "--bank", str(tmp_path / "ours"), "--out", str(out)]
    assert runner.invoke(args=args).exit_code == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def disk_fills(source, target, length):  # the collection's copy into the zip runs out of room midway
        target.write(source.read(1000))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(package.shutil, "copyfileobj", disk_fills)
    result = runner.invoke(args=args)
    assert result.exit_code == 1
    assert "cannot write the packages to" in result.output and "No space left on device" in result.output
    assert "Traceback" not in result.output
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # every file as it was, nothing beside


def test_studyapp_export_anki_carries_the_latest_finished_lab_run_from_the_database(app, runner, tmp_path):
    from sqlmodel import Session

    from studyapp.db import get_engine
    from studyapp.models import LabRun

    def run(status: str, minute: int, finding: str) -> LabRun:
        at = datetime(2026, 3, 2, 12, minute, tzinfo=timezone.utc)
        result = {**LAB_RESULT, "finding": finding} if status == "done" else None
        return LabRun(lab_id="what-fsdp-shards", status=status, result=result, created_at=at, finished_at=at)

    with Session(get_engine(app)) as session:
        session.add_all([run("done", 1, "older finding"), run("done", 2, "latest finding"), run("failed", 3, "")])
        session.commit()
    result = runner.invoke(args=["export-anki"])
    assert result.exit_code == 0, result.output
    exports = Path(app.config["EXPORTS_DIR"])
    assert "lab results: 1 from the database" in result.output
    assert read_lab_results(exports / LAB_RESULTS_FILE)["what-fsdp-shards"]["finding"] == "latest finding"
    package = read_package(exports / ALL_DECKS_FILE)
    note = package.notes[guid("alpha-shards")]  # conftest's bank: alpha and beta decks
    assert "latest finding" in note.fields[FIELDS.index("LabResult")]
    assert (exports / "alpha.apkg").is_file() and (exports / "beta.apkg").is_file()


def test_committed_exports_are_up_to_date_with_the_bank(tmp_path):
    problems = stale_exports(load_bank(), DEFAULT_EXPORTS_DIR, tmp_path)
    assert problems == [], (
        "exports/ is out of date with bank/, the lab titles and claims in sharding_lab/catalog.py, or "
        "exports/lab-results.json: run `studyapp export-anki` "
        "and commit exports/.\n" + "\n".join(problems)
    )


def test_committed_exports_import_into_anki_with_every_bank_question(collection):
    decks = load_bank()
    lab_results = read_lab_results(DEFAULT_EXPORTS_DIR / LAB_RESULTS_FILE)
    for deck in decks:
        log = import_package(collection, DEFAULT_EXPORTS_DIR / f"{deck.id}.apkg")
        assert log["new"] == sorted(guid(q.id) for q in deck.questions)
    log = import_package(collection, DEFAULT_EXPORTS_DIR / ALL_DECKS_FILE)
    questions = [q for deck in decks for q in deck.questions]
    assert (len(log["new"]), len(log["updated"]), len(log["duplicate"])) == (0, 0, len(questions))
    notes = notes_in(collection)
    assert len(notes) == len(questions)
    for deck in decks:
        for question in deck.questions:
            note, fields = notes[guid(question.id)], notes[guid(question.id)]["fields"]
            assert note["deck"] == f"Sharding study::{deck.title}"
            assert note["tags"] == {deck.id, *question.tags, question.lab}
            # Read back out of Anki's HTML, every field says what the bank says.
            assert plain(fields["Question"]) == question.prompt and fields["QuestionId"] == question.id
            listed = re.findall(r'<li data-choice="(\d+)">(.*?)</li>', fields["Choices"])
            assert listed == [(str(n), ANY) for n in range(1, len(question.choices) + 1)]
            assert [plain(text) for _, text in listed] == list(question.choices)
            assert plain(fields["Answer"]) == question.choices[question.answer]
            assert fields["AnswerNumber"] == str(question.answer + 1)
            assert plain(fields["Explanation"]) == question.explanation
            reasons = re.findall(r'<li data-choice="(\d+)"><i>(.*?)</i>: (.*?)</li>', fields["WhyWrong"])
            assert [(int(n), plain(choice), plain(reason)) for n, choice, reason in reasons] == [
                (n, choice, reason)
                for n, (choice, reason) in enumerate(zip(question.choices, question.why_wrong, strict=True), 1)
                if n - 1 != question.answer
            ]
            lab = lab_info(question.lab)
            assert (plain(fields["LabTitle"]), plain(fields["LabClaim"])) == (lab.title, lab.claim)
            assert fields["LabCommand"] == f"sharding-lab run {question.lab}"
            result = lab_results.get(question.lab)
            if result is None:
                assert "Not run yet" in fields["LabResult"]
            else:
                verdict = {True: "The claim held.", False: "The claim did not hold."}[result["holds"]]
                finding = re.match(r'<p class="mc-lab-finding"><b>(.*?)</b> (.*?)</p>', fields["LabResult"])
                assert finding and (finding[1], plain(finding[2])) == (verdict, result["finding"]), fields["LabResult"]


def plain(field: str) -> str:
    """A field's HTML back to the bank's text: line breaks, then entities; no other tag may be left."""
    text = field.replace("<br>", "\n")
    assert "<" not in text, field
    return html.unescape(text)


def test_stale_exports_name_what_is_out_of_date(tmp_path, runner):
    bank, out = write_bank(tmp_path / "bank"), tmp_path / "out"
    export_anki(load_bank(bank), out, {}, T0)
    scratch = iter(tmp_path / f"scratch{i}" for i in range(10))
    assert stale_exports(load_bank(bank), out, next(scratch)) == []
    assert runner.invoke(args=["export-anki", "--check", "--bank", str(bank), "--out", str(out)]).exit_code == 0

    write_bank(bank, edits={"zero-q1": "Reworded?"})
    problems = stale_exports(load_bank(bank), out, next(scratch))
    assert problems == [
        "all-decks.apkg: note zero-q1 has changed",
        "zero.apkg: note zero-q1 has changed",
        "manifest.json is out of date",
    ]
    result = runner.invoke(args=["export-anki", "--check", "--bank", str(bank), "--out", str(out)])
    assert result.exit_code == 1 and "zero.apkg: note zero-q1 has changed" in result.output

    write_bank(bank)
    (out / LAB_RESULTS_FILE).write_text(json.dumps({"adam-optimizer-state": LAB_RESULT}))
    assert "zero.apkg: note zero-q2 has changed" in stale_exports(load_bank(bank), out, next(scratch))
    (out / LAB_RESULTS_FILE).write_text("{}")
    (out / "fsdp.apkg").unlink()
    assert stale_exports(load_bank(bank), out, next(scratch)) == ["fsdp.apkg is missing"]


def test_check_hints_the_export_of_the_folders_it_checked(tmp_path, runner):
    # The hint was `studyapp export-anki`: followed as written, it exported bank/ into the app's exports/.
    bank, out = write_bank(tmp_path / "my bank"), tmp_path / "my out"
    result = runner.invoke(args=["export-anki", "--check", "--bank", str(bank), "--out", str(out)])
    assert result.exit_code == 1
    assert f"Error: {out} is out of date; run `studyapp export-anki --out '{tmp_path}/my out' --bank '{tmp_path}/my bank'`:" \
        in result.output, result.output


# --- Files beside the packages that cannot be read back --------------------------------------

JSON_ERROR = "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"
COMMITTED_STAMPS = f"delete it to continue from the stamps of {DEFAULT_EXPORTS_DIR / MANIFEST_FILE}, as a new folder does"
COMMITTED_RESULTS = f"delete it to carry the results of {DEFAULT_EXPORTS_DIR / LAB_RESULTS_FILE}, as a new folder does"


@pytest.mark.parametrize("check", [False, True], ids=["export", "check"])
@pytest.mark.parametrize("name, content, says", [
    (LAB_RESULTS_FILE, "{", f"is not a lab results file: {JSON_ERROR}; {COMMITTED_RESULTS}"),
    (LAB_RESULTS_FILE, "[]", f"is not a lab results file: not an object by lab id but []; {COMMITTED_RESULTS}"),
    (MANIFEST_FILE, "{", f"is not a manifest this app wrote: {JSON_ERROR}; {COMMITTED_STAMPS}"),
    (MANIFEST_FILE, "[]", f'is not a manifest this app wrote: not an object with "notes" by question id: []; {COMMITTED_STAMPS}'),
    (MANIFEST_FILE, '{"notes": 5}',
     f'is not a manifest this app wrote: not an object with "notes" by question id: {{"notes": 5}}; {COMMITTED_STAMPS}'),
    (MANIFEST_FILE, '{"note_type": null, "notes": {"zero-q1": {"mod": 1}}}',
     f'is not a manifest this app wrote: the stamp of zero-q1 is not {{"hash": text, "mod": seconds}}: {{"mod": 1}}; {COMMITTED_STAMPS}'),
])
def test_a_file_beside_the_packages_that_is_not_ours_stops_the_export_in_one_line(runner, tmp_path, check, name, content, says):
    out = tmp_path / "out"
    args = ["export-anki", "--bank", str(write_bank(tmp_path / "ours")), "--out", str(out), *(["--check"] if check else [])]
    assert runner.invoke(args=args[:5]).exit_code == 0
    (out / name).write_text(content, encoding="utf-8")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    result = runner.invoke(args=args)
    assert (result.exit_code, result.output) == (1, f"Error: {out / name} {says}\n")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # refused whole: nothing rewritten
    (out / name).unlink()  # as the line says: without the file, the export goes ahead
    assert runner.invoke(args=args[:5]).exit_code == 0


def test_in_the_committed_folder_the_line_says_what_deleting_loses(runner, tmp_path, monkeypatch):
    import studyapp.cli.anki as cli

    out = tmp_path / "exports"
    monkeypatch.setattr(cli, "DEFAULT_EXPORTS_DIR", out)  # no folder behind it to fall back on
    args = ["export-anki", "--bank", str(write_bank(tmp_path / "ours")), "--out", str(out)]
    assert runner.invoke(args=args).exit_code == 0
    (out / MANIFEST_FILE).write_text("{")
    result = runner.invoke(args=args)
    assert result.output == (f"Error: {out / MANIFEST_FILE} is not a manifest this app wrote: {JSON_ERROR}; restore it, or "
                             "delete it to stamp every note anew (Anki then updates every note on its next import)\n")
    (out / MANIFEST_FILE).unlink()
    (out / LAB_RESULTS_FILE).write_text("null")
    result = runner.invoke(args=args)
    assert result.output == (f"Error: {out / LAB_RESULTS_FILE} is not a lab results file: not an object by lab id but null; "
                             "restore it, or delete it to export only the lab runs in the database\n")


def test_one_deck_is_not_exported_beside_lab_results_it_cannot_read(tmp_path):
    bank, out = write_bank(tmp_path / "bank"), tmp_path / "out"
    export_anki(load_bank(bank), out, {}, T0)
    (out / LAB_RESULTS_FILE).write_text('"x"')
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    changed = load_bank(write_bank(bank, edits={"zero-q1": "Reworded?"}))
    with pytest.raises(ExportFileError, match=r'lab-results\.json is not a lab results file: not an object by lab id but "x"'):
        export_anki(changed, out, {}, T0 + 60, deck_id="zero")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # not the package and manifest without the results


def test_a_file_beside_the_packages_that_cannot_be_read_is_named_with_the_reason(tmp_path, monkeypatch):
    # The suite runs as root, whom file modes do not stop: the OS's refusal is raised here instead.
    for name in ("manifest.json", "lab-results.json"):
        (tmp_path / name).write_text("{}", encoding="utf-8")

    def refused(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_text", refused)
    for name, read in (("manifest.json", read_manifest), ("lab-results.json", read_lab_results)):
        with pytest.raises(ExportFileError) as error:
            read(tmp_path / name)
        assert str(error.value) == f"{tmp_path / name} cannot be read: Permission denied"


@pytest.mark.parametrize("content, says", [
    (b"\xff\xfe{}", "'utf-8' codec can't decode byte 0xff"),
    (b"[" * 100_000, "it nests too deeply to read"),
])
def test_a_file_beside_the_packages_that_is_not_text_or_nests_too_deeply_is_named(tmp_path, content, says):
    for name, read, what in (("manifest.json", read_manifest, "a manifest this app wrote"),
                             ("lab-results.json", read_lab_results, "a lab results file")):
        (tmp_path / name).write_bytes(content)
        with pytest.raises(ExportFileError) as error:
            read(tmp_path / name)
        assert str(error.value).startswith(f"{tmp_path / name} is not {what}: ") and says in str(error.value)
