"""Defects an Anki user hit in the export, each held here: found by importing into a real collection
(the `anki` package) or by running `studyapp export-anki` as a user would."""

from __future__ import annotations

import pytest
from anki.collection import Collection
from test_anki_export import T0, _question, guid, import_package, notes_in, write_bank

from studyapp.anki import (
    ALL_DECKS_FILE,
    LAB_RESULTS_FILE,
    export_anki,
    read_lab_results,
    read_package,
    render_lab_result,
)
from studyapp.anki.note_type import FIELDS
from studyapp.bank import load_bank


@pytest.fixture
def collection(tmp_path):
    (tmp_path / "learner").mkdir()
    col = Collection(str(tmp_path / "learner" / "collection.anki2"))
    yield col
    col.close()


def test_a_control_character_in_the_bank_does_not_make_anki_refuse_the_package(tmp_path, collection):
    # A YAML "\x1f" (or text pasted from a PDF, with form feeds): Anki joins a note's fields with
    # \x1f, so one in a field made it refuse the whole package ("note has 12 fields, expected 11").
    odd = _question("zero-q9", "Which\x1f collective\x0c?", lab="adam-optimizer-state")
    odd["choices"][1]["text"] = "All-\x1egather\r"
    odd["explanation"] = "Tabs\tand\nnewlines stay;\x00 the rest\x7f goes."
    export_anki(load_bank(write_bank(tmp_path / "bank", extra=[odd])), tmp_path / "out", {}, T0)
    log = import_package(collection, tmp_path / "out" / ALL_DECKS_FILE)
    assert len(log["new"]) == 6
    fields = notes_in(collection)[guid("zero-q9")]["fields"]
    assert fields["Question"] == "Which collective?"
    assert '<li data-choice="2">All-gather</li>' in fields["Choices"]
    assert fields["Explanation"] == "Tabs\tand<br>newlines stay; the rest goes."


@pytest.mark.parametrize("holds", [1, 0, "true", None])
def test_only_a_json_true_or_false_is_a_verdict_on_the_back(holds):
    # A hand-edited lab-results.json with "holds": 1 read "The claim held." on the card (1 == True as
    # a dict key), where the pages, which take only a JSON true, do not say it held.
    back = render_lab_result({"holds": holds, "finding": "f"})
    assert back == '<p class="mc-lab-finding">f</p>'


def test_a_finding_that_is_not_text_is_left_out_not_printed_as_python():
    back = render_lab_result({"holds": True, "finding": ["a", "b"], "at_scale": {"7b": 1}})
    assert back == '<p class="mc-lab-finding"><b>The claim held.</b> </p>'


@pytest.mark.parametrize("damage", ["truncated", "empty", "not-a-collection"])
def test_check_names_a_damaged_package_in_one_line(runner, tmp_path, damage):
    # A package cut short (an interrupted copy or download) made `export-anki --check` end in a
    # traceback (zipfile.BadZipFile) instead of saying which file is out of date.
    bank, out = write_bank(tmp_path / "ours"), tmp_path / "out"
    args = ["export-anki", "--bank", str(bank), "--out", str(out)]
    assert runner.invoke(args=args).exit_code == 0
    package = out / "fsdp.apkg"
    if damage == "truncated":
        package.write_bytes(package.read_bytes()[:5000])
    elif damage == "empty":
        package.write_bytes(b"")
    else:
        import zipfile

        with zipfile.ZipFile(package, "w") as archive:
            archive.writestr("collection.anki2", b"not SQLite")
    result = runner.invoke(args=[*args, "--check"])
    assert result.exit_code == 1 and "Traceback" not in result.output, repr(result.exception)
    assert "  fsdp.apkg is not a readable Anki package (" in result.output
    assert "zero.apkg" not in result.output  # the others are still compared, and current
    assert runner.invoke(args=args).exit_code == 0  # a rebuild replaces it
    assert runner.invoke(args=[*args, "--check"]).exit_code == 0


def test_one_deck_exported_first_into_a_new_folder_does_not_drop_the_other_decks_lab_results(runner, tmp_path):
    # `export-anki --deck zero --out new/` wrote a lab-results.json with zero's labs only; the next
    # `export-anki --out new/` read it back and rebuilt every fsdp note as "Not run yet", newer than
    # the committed notes, so importing it overwrote the committed finding on the learner's cards.
    bank = write_bank(tmp_path / "ours")
    backs = {}
    for folder, runs in (("fresh", [[]]), ("zero-first", [["--deck", "zero"], []])):
        for extra in runs:
            result = runner.invoke(args=["export-anki", "--bank", str(bank), "--out", str(tmp_path / folder), *extra])
            assert result.exit_code == 0, result.output
        package = read_package(tmp_path / folder / ALL_DECKS_FILE)
        backs[folder] = {g: n.fields[FIELDS.index("LabResult")] for g, n in package.notes.items()}
        assert read_lab_results(tmp_path / folder / LAB_RESULTS_FILE).keys() == {"what-fsdp-shards", "adam-optimizer-state"}
    assert "The claim held." in backs["fresh"][guid("fsdp-q1")]  # the committed reference
    assert backs["zero-first"] == backs["fresh"]
