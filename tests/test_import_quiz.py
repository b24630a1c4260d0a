"""Importing a quiz in the seeds' plain-text format (`quiz_to_yaml`, `studyapp bank import-quiz`).

The skeleton keeps every prompt and choice verbatim, leaves the answers to the author, and the
validator then names each missing piece by question and field.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from test_bank import SEED_FILES, SEEDS, parse_seed

from studyapp.bank import BankError, load_bank, parse_deck, quiz_to_yaml

MISSING_PER_QUESTION = ["explanation", "lab"] + [f"choices[{n}].why_wrong" for n in range(1, 5)] + ["choices"]


def skeleton(deck_id: str) -> str:
    return quiz_to_yaml((SEEDS / SEED_FILES[deck_id]).read_text(encoding="utf-8"), deck_id)


@pytest.mark.parametrize("deck_id", ["fsdp", "zero"])
def test_the_skeleton_keeps_every_prompt_and_choice_verbatim(deck_id):
    title, seed_questions = parse_seed((SEEDS / SEED_FILES[deck_id]).read_text(encoding="utf-8"))
    raw = yaml.safe_load(skeleton(deck_id))
    assert (raw["id"], raw["title"]) == (deck_id, title)
    assert len(raw["questions"]) == 8
    assert [q["id"] for q in raw["questions"]] == [f"{deck_id}-q{n}" for n in range(1, 9)]
    got = [(q["prompt"], [c["text"] for c in q["choices"]]) for q in raw["questions"]]
    assert got == seed_questions
    # nothing is decided for the author
    assert all(c["correct"] is False for q in raw["questions"] for c in q["choices"])


@pytest.mark.parametrize("deck_id", ["fsdp", "zero"])
def test_the_validator_names_what_the_author_must_fill_in(deck_id):
    text = skeleton(deck_id)
    deck, problems = parse_deck(text, f"{deck_id}.yaml")
    assert deck is None
    expected = [(f"{deck_id}-q{n}", field) for n in range(1, 9) for field in MISSING_PER_QUESTION]
    assert [(p.question_id, p.field) for p in problems] == expected
    assert {p.file for p in problems} == {f"{deck_id}.yaml"}
    lines = text.splitlines()
    for problem in problems:
        source = lines[problem.line - 1].strip()
        if problem.field in ("explanation", "lab"):
            assert source == f"{problem.field}: ''"
        elif problem.field == "choices":
            assert source == "choices:"
            assert "marked correct: none" in problem.message
        else:
            assert source == "why_wrong: ''"


def test_a_completed_skeleton_loads(tmp_path):
    raw = yaml.safe_load(skeleton("zero"))
    for question in raw["questions"]:
        question["choices"][0]["correct"] = True
        del question["choices"][0]["why_wrong"]
        for number, choice in enumerate(question["choices"][1:], start=2):
            choice["why_wrong"] = f"Reason {number}."
        question.update(explanation="Why the first choice is right.", lab="zero-stages-model-states")
    (tmp_path / "zero.yaml").write_text(yaml.safe_dump(raw, sort_keys=False, allow_unicode=True), encoding="utf-8")
    (deck,) = load_bank(tmp_path)
    assert (deck.id, len(deck.questions), deck.questions[1].answer) == ("zero", 8, 0)


@pytest.mark.parametrize(
    ("quiz", "deck_id", "complaint"),
    [
        ("", "new", "empty"),
        ("A title only\n", "new", "no numbered questions"),
        ("Quiz\n1. Why?\n   • Because\n   something else\n", "new", "line 4"),
        ("Quiz\n1. Why?\n   • Because\n", "Not A Slug", "slug"),
    ],
)
def test_a_quiz_it_cannot_read_is_refused(quiz, deck_id, complaint):
    with pytest.raises(ValueError, match=complaint):
        quiz_to_yaml(quiz, deck_id)


def test_the_import_quiz_command_writes_a_skeleton_the_validator_refuses(runner, tmp_path: Path):
    out = tmp_path / "zero.yaml"
    result = runner.invoke(args=["bank", "import-quiz", str(SEEDS / "zero-quiz.txt"), "--deck", "zero", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_text(encoding="utf-8") == skeleton("zero")
    with pytest.raises(BankError) as refused:
        load_bank(out)
    assert len(refused.value.problems) == 8 * len(MISSING_PER_QUESTION)
    again = runner.invoke(args=["bank", "import-quiz", str(SEEDS / "zero-quiz.txt"), "--deck", "zero", "--out", str(out)])
    assert again.exit_code != 0 and "not overwriting" in again.output


def test_the_import_quiz_command_hints_a_check_of_the_file_it_wrote(runner, tmp_path: Path):
    # The hint was `studyapp bank check`, which checks the app's bank/, not the new file.
    (tmp_path / "my decks").mkdir()
    out = tmp_path / "my decks" / "zz.yaml"
    result = runner.invoke(args=["bank", "import-quiz", str(SEEDS / "zero-quiz.txt"), "--deck", "zz", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert result.output == (f"wrote {out}: mark the correct choices and fill in the blanks, "
                             f"then run `studyapp bank check --path '{tmp_path}/my decks/zz.yaml'`\n")


def test_a_line_it_cannot_read_is_named_as_the_file_numbers_it():
    # Blank lines were left out before counting: the seed's line 14 was called line 12.
    lines = (SEEDS / "fsdp-quiz.txt").read_text(encoding="utf-8").splitlines()
    number = lines.index("   • Barrier") + 1
    lines[number - 1] = "   Barrier"
    with pytest.raises(ValueError, match=rf"^line {number}: expected a numbered question or a bulleted choice, got 'Barrier'$"):
        quiz_to_yaml("\n".join(lines), "fsdp")


def test_a_byte_order_mark_is_not_part_of_the_title():
    # A quiz saved by a Windows editor starts with one: the title was "\uFEFFFully Sharded ...".
    text = (SEEDS / "fsdp-quiz.txt").read_text(encoding="utf-8")
    assert quiz_to_yaml("\ufeff" + text, "fsdp") == quiz_to_yaml(text, "fsdp")


def test_the_import_quiz_command_names_the_line_of_a_byte_that_is_not_utf8(runner, tmp_path: Path):
    quiz = tmp_path / "quiz.txt"
    quiz.write_bytes(b"Quiz\n\n1. Caf\xe9 or tea?\n   \xe2\x80\xa2 Tea\n")  # Latin-1 on line 3
    result = runner.invoke(args=["bank", "import-quiz", str(quiz), "--deck", "new"])
    assert result.exit_code == 1
    assert result.output == (f"Error: {quiz}: line 3: is not UTF-8: byte 0xe9 cannot start or continue a character "
                             "(save the file as UTF-8)\n")


def test_the_import_quiz_command_blames_a_bad_deck_id_on_the_option_not_the_file(runner):
    result = runner.invoke(args=["bank", "import-quiz", str(SEEDS / "zero-quiz.txt"), "--deck", "Zero Deck"])
    assert result.exit_code == 1
    assert result.output == "Error: --deck: 'Zero Deck' must be a slug: lowercase letters, digits and dashes\n"


def test_the_line_named_is_the_files_own_though_a_line_holds_a_form_feed(runner, tmp_path: Path):
    # splitlines() also broke at \x0c, \x85 and \u2028: the bad line 5 was called line 6.
    quiz = tmp_path / "quiz.txt"
    quiz.write_bytes(b"T\n1. a\n- b\n\x0c\n1) c\n")
    result = runner.invoke(args=["bank", "import-quiz", str(quiz), "--deck", "zz"])
    assert (result.exit_code, result.output) == (
        1, f"Error: {quiz}: line 5: expected a numbered question or a bulleted choice, got '1) c'\n")
    with pytest.raises(ValueError, match=r"^line 3: expected .*, got 'c'$"):
        quiz_to_yaml("T\n1. a \u2028 b\nc\n", "zz")


def test_windows_line_endings_read_as_unix_ones():
    text = (SEEDS / SEED_FILES["fsdp"]).read_text(encoding="utf-8")
    assert quiz_to_yaml(text.replace("\n", "\r\n"), "fsdp") == quiz_to_yaml(text, "fsdp")
    raw = yaml.safe_load(quiz_to_yaml("T\r\n1. Why \u2028 not?\r\n- a\r\n- b\r\n", "zz"))
    assert raw["questions"][0]["prompt"] == "Why \u2028 not?"  # a character of the line, not a line break
