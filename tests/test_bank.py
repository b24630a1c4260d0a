"""The question bank (bank/*.yaml) and its loader (studyapp/bank.py).

First the real bank: it loads, and its prompts and choices are the seeds' word for word.
Then the validator: each malformed file is a copy of bank/fsdp.yaml with one edit, written to
tmp_path, and the test names the exact file, line, question and field the refusal must cite.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import ALPHA_DECK

from studyapp.bank import BankError, BankProblem, Deck, find_question, load_bank, parse_deck

REPO = Path(__file__).resolve().parent.parent
BANK = REPO / "bank"
SEEDS = Path(__file__).resolve().parent / "data"  # copies of ../shared/seeds, checked below
SHARED_SEEDS = REPO.parent / "shared" / "seeds"
SEED_FILES = {"fsdp": "fsdp-quiz.txt", "zero": "zero-quiz.txt"}

QUESTION_IDS = {
    "fsdp": [
        "fsdp-what-is-sharded",
        "fsdp-all-gather-before-layer",
        "fsdp-free-gathered-weights",
        "fsdp-inspired-by-zero",
        "fsdp-prefetch-overlap",
        "fsdp-reduce-scatter-gradients",
        "fsdp-persistent-memory",
        "fsdp-memory-communication-tradeoff",
    ],
    "zero": [
        "zero-redundancy-removed",
        "zero-adam-state",
        "zero-stage3-parameters",
        "zero-gather-then-discard",
        "zero-fsdp-implements",
        "zero-communication-cost",
        "zero-stage1-optimizer",
        "zero-practical-cost",
    ],
}

# The answer each question intends, as the text of the correct choice.
CORRECT = {
    "fsdp-what-is-sharded": "Parameters, gradients, and optimizer states",
    "fsdp-all-gather-before-layer": "All-gather",
    "fsdp-free-gathered-weights": "To keep the permanent memory footprint to just one shard per device",
    "fsdp-inspired-by-zero": "Microsoft's ZeRO (Zero Redundancy Optimizer)",
    "fsdp-prefetch-overlap": "By overlapping communication with computation, prefetching the next layer's parameters",
    "fsdp-reduce-scatter-gradients": "Reduce-scatter",
    "fsdp-persistent-memory": "Each rank stores a shard of model state instead of a full copy",
    "fsdp-memory-communication-tradeoff": "Lower per-device memory use in exchange for collective communication",
    "zero-redundancy-removed": "Duplicate full copies of optimizer state, gradients, and parameters on every GPU",
    "zero-adam-state": "Adam keeps additional per-parameter values (like momentum and variance), often several times the model size",
    "zero-stage3-parameters": "The model parameters themselves",
    "zero-gather-then-discard": "It performs an all-gather to collect the missing slices, then discards them afterward",
    "zero-fsdp-implements": "FSDP (Fully Sharded Data Parallel)",
    "zero-communication-cost": "It adds extra communication to gather and scatter shards as needed",
    "zero-stage1-optimizer": "Optimizer states, while parameters and gradients remain replicated",
    "zero-practical-cost": "Additional communication to gather parameters and distribute gradients",
}


def parse_seed(text: str) -> tuple[str, list[tuple[str, list[str]]]]:
    """The seeds' format: a title line, then `N. prompt` lines each followed by `• choice` lines."""
    lines = [line for line in text.splitlines() if line.strip()]
    questions: list[tuple[str, list[str]]] = []
    for line in lines[1:]:
        if match := re.fullmatch(r"(\d+)\. (.+)", line.strip()):
            assert int(match.group(1)) == len(questions) + 1
            questions.append((match.group(2), []))
        elif line.strip().startswith("•"):
            questions[-1][1].append(line.strip().removeprefix("•").strip())
    return lines[0].strip(), questions


@pytest.fixture(scope="module")
def bank() -> dict[str, Deck]:
    return {deck.id: deck for deck in load_bank()}


# --- The real bank ---------------------------------------------------------------------


def test_seed_copies_match_the_shared_seeds():
    if not SHARED_SEEDS.is_dir():
        pytest.skip("../shared/seeds is not next to this checkout")
    for name in SEED_FILES.values():
        assert (SEEDS / name).read_bytes() == (SHARED_SEEDS / name).read_bytes()


def test_the_bank_loads_with_two_seed_decks_of_eight(bank):
    # The seed decks, in file order; the third deck (bank/beyond.yaml) is tests/test_beyond_deck.py's.
    assert [deck_id for deck_id in bank if deck_id in SEED_FILES] == ["fsdp", "zero"]
    assert bank["fsdp"].title == "Fully Sharded Data Parallel"
    assert bank["zero"].title == "ZeRO and Sharded Optimizers"
    assert all(deck.description for deck in bank.values())
    for deck_id, ids in QUESTION_IDS.items():
        assert [q.id for q in bank[deck_id].questions] == ids
        assert all(q.deck_id == deck_id for q in bank[deck_id].questions)
    assert sum(len(bank[deck_id].questions) for deck_id in SEED_FILES) == 16


@pytest.mark.parametrize("deck_id", ["fsdp", "zero"])
def test_prompts_and_choices_are_the_seeds_verbatim_and_in_order(bank, deck_id):
    title, seed_questions = parse_seed((SEEDS / SEED_FILES[deck_id]).read_text(encoding="utf-8"))
    assert title == f"{bank[deck_id].title} Quiz"
    assert len(seed_questions) == 8
    got = [(q.prompt, list(q.choices)) for q in bank[deck_id].questions]
    assert got == seed_questions


def test_the_marked_answer_is_the_intended_one(bank):
    questions = [q for deck_id in SEED_FILES for q in bank[deck_id].questions]
    assert {q.id: q.choices[q.answer] for q in questions} == CORRECT


def test_every_distractor_has_a_reason_and_the_answer_has_none(bank):
    for deck in bank.values():
        for q in deck.questions:
            assert len(q.choices) == len(q.why_wrong) == 4
            for index, reason in enumerate(q.why_wrong):
                if index == q.answer:
                    assert reason == "", q.id
                else:
                    assert len(reason) > 30 and "\n" not in reason, (q.id, index)
            assert len(set(q.why_wrong)) == 4, f"{q.id}: reasons must be specific, not copied"


def test_explanations_tags_and_labs_are_filled_in(bank):
    for deck in bank.values():
        for q in deck.questions:
            assert len(q.explanation.split()) >= 40, q.id
            assert q.tags[0] == deck.id and len(q.tags) >= 3 and len(set(q.tags)) == len(q.tags), q.id
            assert all(re.fullmatch(r"[a-z0-9-]+", tag) for tag in q.tags), q.id
            assert q.lab


@pytest.mark.parametrize(
    ("question_id", "figures"),
    [
        ("fsdp-what-is-sharded", ["16Ψ", "4Ψ", "8Ψ", "16Ψ/N"]),
        ("fsdp-memory-communication-tradeoff", ["2Ψ", "3Ψ", "1.5×", "reshard_after_forward"]),
        ("fsdp-free-gathered-weights", ["reshard_after_forward", "one or two blocks"]),
        ("zero-adam-state", ["8Ψ", "12Ψ"]),
        ("zero-communication-cost", ["2Ψ", "3Ψ", "1.5×"]),
        ("zero-stage1-optimizer", ["4Ψ + 4Ψ + 8Ψ/N", "12Ψ/N"]),
        ("zero-redundancy-removed", ["16Ψ", "2Ψ + 14Ψ/N", "16Ψ/N"]),
    ],
)
def test_explanations_carry_the_numbers(bank, question_id, figures):
    explanation = find_question(list(bank.values()), question_id).explanation
    for figure in figures:
        assert figure in explanation


def test_find_question(bank):
    decks = list(bank.values())
    assert find_question(decks, "zero-adam-state").deck_id == "zero"
    assert find_question(decks, "no-such-question") is None


# --- Malformed files -------------------------------------------------------------------


class Edit:
    """A copy of bank/fsdp.yaml's text, edited in place, that knows where its lines are."""

    def __init__(self, path: Path = BANK / "fsdp.yaml"):
        self.lines = path.read_text(encoding="utf-8").splitlines(keepends=True)

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def find(self, needle: str, within: str | None = None) -> int:
        """0-based index of the first line containing `needle`, searching from question `within`."""
        start = self.find(f"- id: {within}") if within else 0
        for index in range(start, len(self.lines)):
            if needle in self.lines[index]:
                return index
        raise AssertionError(f"{needle!r} not found")

    def line(self, needle: str, within: str | None = None) -> int:
        return self.find(needle, within) + 1

    def replace(self, needle: str, new: str, within: str | None = None) -> Edit:
        index = self.find(needle, within)
        self.lines[index] = self.lines[index].replace(needle, new)
        return self

    def insert_after(self, needle: str, new_line: str, within: str | None = None) -> Edit:
        self.lines.insert(self.find(needle, within) + 1, new_line + "\n")
        return self

    def delete(self, needle: str, within: str | None = None, count: int = 1) -> Edit:
        index = self.find(needle, within)
        del self.lines[index : index + count]
        return self


@dataclass
class Case:
    edit: Edit
    expected: list[tuple[int, str | None, str | None]]  # (line, question id, field) per problem
    message: str  # a phrase the first problem's message must contain


def q(number: int) -> str:
    return QUESTION_IDS["fsdp"][number - 1]


def case_yaml_syntax_error() -> Case:
    edit = Edit().replace("prompt: How does FSDP hide", "prompt: How does FSDP: hide", within=q(5))
    return Case(edit, [(edit.line("prompt: How does FSDP: hide"), None, None)], "YAML syntax error")


def case_no_correct_choice() -> Case:
    edit = Edit().replace("correct: true", "why_wrong: Said to be wrong.", within=q(2))
    return Case(edit, [(edit.line("choices:", within=q(2)), q(2), "choices")], "marked correct: none")


def case_two_correct_choices() -> Case:
    edit = Edit().replace("why_wrong: Scatter splits", "correct: true #", within=q(2))
    return Case(edit, [(edit.line("choices:", within=q(2)), q(2), "choices")], "marked correct: 2, 3")


def case_duplicate_question_id_in_one_deck() -> Case:
    edit = Edit().replace(f"- id: {q(2)}", f"- id: {q(1)}")
    second = [i for i, text in enumerate(edit.lines) if f"- id: {q(1)}" in text][1] + 1
    return Case(edit, [(second, q(1), "id")], "duplicate question id, first used at")


def case_unknown_key_in_a_question() -> Case:
    edit = Edit().insert_after("prompt:", "    hint: think about memory", within=q(3))
    return Case(edit, [(edit.line("hint: think"), q(3), "hint")], "unknown key 'hint'")


def case_unknown_key_in_a_choice() -> Case:
    edit = Edit().insert_after("- text: To corrupt unused gradients", "        colour: red", within=q(3))
    return Case(edit, [(edit.line("colour: red"), q(3), "choices[1].colour")], "unknown key 'colour'")


def case_empty_prompt() -> Case:
    edit = Edit().replace("prompt: FSDP was largely inspired by which earlier memory-optimization approach?", 'prompt: ""')
    return Case(edit, [(edit.line('prompt: ""'), q(4), "prompt")], "must not be empty")


def case_blank_choice_text() -> Case:
    edit = Edit().replace("- text: Google's MapReduce", '- text: "   "')
    return Case(edit, [(edit.line('- text: "   "'), q(4), "choices[1].text")], "must not be empty")


def case_fewer_than_two_choices() -> Case:
    edit = Edit().delete("- text: By disabling the backward pass", within=q(5), count=6)
    return Case(edit, [(edit.line("choices:", within=q(5)), q(5), "choices")], "at least two choices, got 1")


def case_more_choices_than_keys() -> Case:
    edit = Edit()
    for number in range(6):  # q(5) has four: ten in all
        edit.insert_after("choices:", f"      - text: Extra choice {number}\n        why_wrong: Not this one.", within=q(5))
    return Case(edit, [(edit.line("choices:", within=q(5)), q(5), "choices")], "has 10 choices; at most 9")


def case_choices_not_a_list() -> Case:
    edit = Edit().delete("- text: By overlapping", within=q(5), count=8)
    edit.replace("choices:", "choices: By overlapping communication with computation", within=q(5))
    return Case(edit, [(edit.line("choices: By overlapping"), q(5), "choices")], "must be a list of choices")


def case_missing_required_key() -> Case:
    edit = Edit().delete("lab: reduce-scatter-backward")
    return Case(edit, [(edit.line(f"- id: {q(6)}"), q(6), "lab")], "missing required key 'lab'")


def case_tag_with_a_space() -> Case:
    edit = Edit().replace("tags: [fsdp, communication, reduce-scatter, gradients]", "tags: [fsdp, reduce scatter]")
    return Case(edit, [(edit.line("tags: [fsdp, reduce scatter]"), q(6), "tags")], "one word without spaces")


def case_reused_retired_id() -> Case:
    edit = Edit().replace("retired_ids: []", f"retired_ids: [{q(7)}]")
    return Case(edit, [(edit.line(f"- id: {q(7)}"), q(7), "id")], "retired")


def case_question_id_not_a_slug() -> Case:
    edit = Edit().replace(f"- id: {q(7)}", "- id: Fsdp_Persistent")
    return Case(edit, [(edit.line("- id: Fsdp_Persistent"), "Fsdp_Persistent", "id")], "must be a slug")


def case_deck_id_not_a_slug() -> Case:
    edit = Edit().replace("id: fsdp\n", "id: FSDP deck\n")
    return Case(edit, [(edit.line("id: FSDP deck"), None, "id")], "slug")


def case_lab_not_a_slug() -> Case:
    edit = Edit().replace("lab: memory-communication-tradeoff", "lab: Memory Tradeoff")
    return Case(edit, [(edit.line("lab: Memory Tradeoff"), q(8), "lab")], "not a lab slug")


def case_distractor_without_why_wrong() -> Case:
    edit = Edit().delete("why_wrong: FSDP replicates fewer parameters")
    return Case(edit, [(edit.line("- text: More replicated parameters"), q(8), "choices[2].why_wrong")], "needs a one-line 'why_wrong'")


def case_why_wrong_of_two_lines() -> Case:
    # A literal block keeps its line break; the reason is shown as one line beside its choice.
    edit = Edit().replace("why_wrong: FSDP replicates fewer parameters, not more,",
                          "why_wrong: |\n          FSDP replicates fewer parameters, not more,\n         ")
    return Case(edit, [(edit.line("why_wrong: |", within=q(8)), q(8), "choices[2].why_wrong")], "must be one line, got 2")


def case_duplicate_yaml_key() -> Case:
    edit = Edit().insert_after("prompt: What is a central systems tradeoff", "    prompt: Asked twice?", within=q(8))
    return Case(edit, [(edit.line("prompt: Asked twice?"), q(8), "prompt")], "duplicate key 'prompt'")


def case_correct_is_not_a_boolean() -> Case:
    edit = Edit().replace("correct: true", 'correct: "true"', within=q(1))
    return Case(
        edit,
        [(edit.line('correct: "true"'), q(1), "choices[1].correct"), (edit.line("choices:", within=q(1)), q(1), "choices")],
        "must be true or false",
    )


def case_why_wrong_on_the_correct_choice() -> Case:
    edit = Edit().insert_after("correct: true", "        why_wrong: But it is right.", within=q(1))
    return Case(edit, [(edit.line("why_wrong: But it is right."), q(1), "choices[1].why_wrong")], "cannot have a 'why_wrong'")


def case_repeated_choice_text() -> Case:
    edit = Edit().replace("- text: Scatter", "- text: Barrier", within=q(2))
    second = [i for i, text in enumerate(edit.lines) if "- text: Barrier" in text][1] + 1
    return Case(edit, [(second, q(2), "choices[4].text")], "repeats the choice")


def case_choice_not_a_mapping() -> Case:
    edit = Edit().delete("why_wrong: Scatter splits", within=q(2)).replace("- text: Scatter", "- Scatter", within=q(2))
    return Case(edit, [(edit.line("- Scatter"), q(2), "choices[3]")], "must be a mapping")


def case_question_not_a_mapping() -> Case:
    edit = Edit()
    edit.lines.append("  - What is a shard?\n")
    return Case(edit, [(len(edit.lines), None, "questions")], "question #9 must be a mapping, got text")


def case_prompt_not_text() -> Case:
    edit = Edit().replace("prompt: Which collective operation does FSDP use to reconstruct", "prompt: 42 #")
    return Case(edit, [(edit.line("prompt: 42 #"), q(2), "prompt")], "must be text, got a number")


def case_missing_deck_title() -> Case:
    edit = Edit().delete("title: Fully Sharded Data Parallel")
    return Case(edit, [(edit.line("id: fsdp"), None, "title")], "missing required key 'title'")


def case_unhashable_key() -> Case:
    edit = Edit().insert_after("- id: fsdp-what-is-sharded", "    ? [a, b]\n    : c")
    return Case(edit, [(edit.line("? [a, b]"), None, None)], "unhashable key")


def case_question_id_too_long_for_the_databases_index() -> Case:
    # PostgreSQL's unique index on the id took at most 2704 bytes: `bank check` passed, `bank sync` failed
    # there naming neither file nor card. Too long to print, the question is named by its place.
    edit = Edit().replace(f"- id: {q(7)}", "- id: q" + "x" * 100)
    return Case(edit, [(edit.line("- id: qxxx"), "#7", "id")], "is 101 characters long; at most 100")


def case_deck_id_too_long() -> Case:
    edit = Edit().replace("id: fsdp\n", "id: " + "d" * 101 + "\n")
    return Case(edit, [(edit.line("id: ddd"), None, "id")], "deck id is 101 characters long")


def case_two_unreadable_choice_texts_are_not_a_repeat() -> Case:
    # Each unreadable text is one problem; both once counted as the same choice '' repeated.
    edit = Edit().replace("- text: Only the input batches", "- text: 12").replace("- text: Only the learning rate", "- text: 13 #")
    return Case(edit, [(edit.line("- text: 12"), q(1), "choices[2].text"), (edit.line("- text: 13 #"), q(1), "choices[3].text")],
                "must be text, got a number")


def case_merge_key() -> Case:
    # PyYAML's SafeLoader merges `<<`; this loader said "could not determine a constructor for the tag ...merge"
    edit = Edit().insert_after("lab: what-fsdp-shards", "    <<: {hint: x}")
    return Case(edit, [(edit.line("<<: {hint"), None, None)], "a merge key (<<) is not read in a deck file")


CASES = [value for name, value in sorted(globals().items()) if name.startswith("case_")]


def problems_of(tmp_path: Path, text: str, name: str = "fsdp.yaml") -> list[BankProblem]:
    (tmp_path / name).write_text(text, encoding="utf-8")
    with pytest.raises(BankError) as refused:
        load_bank(tmp_path)
    return refused.value.problems


def test_a_file_that_is_not_utf8_names_the_line(tmp_path):
    (tmp_path / "fsdp.yaml").write_bytes(b"id: fsdp\ntitle: Caf\xe9\nquestions: []\n")  # Latin-1
    with pytest.raises(BankError) as refused:
        load_bank(tmp_path)
    [problem] = refused.value.problems
    assert problem.line == 2 and "is not UTF-8: byte 0xe9" in problem.message


def test_a_deck_file_that_is_a_list_says_so_in_yamls_words(tmp_path):
    [problem] = problems_of(tmp_path, "- id: fsdp\n- title: x\n")
    assert problem.line == 1 and problem.message.endswith("got a list")  # not the loader's class, _Sequence


def test_a_file_nested_too_deeply_for_the_yaml_reader_is_refused_not_a_traceback(tmp_path):
    # PyYAML composes recursively: 300 nested lists ran past Python's recursion limit.
    for depth in (300, 5000):
        [problem] = problems_of(tmp_path, "id: fsdp\ntitle: x\nquestions:\n- id: q\n  tags: " + "[" * depth + "]" * depth + "\n")
        assert problem.line == 0 and "nests lists or mappings too deeply" in problem.message


def test_a_tag_that_aliases_make_huge_is_refused_by_its_kind_not_printed(tmp_path):
    # Seven levels of nine aliases: the message quoted the tag whole, 34 million characters (nine levels
    # hung `bank check` for minutes and gigabytes). The file itself is eight short lines.
    anchors = "x0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
        f"x{level}: &a{level} [{', '.join([f'*a{level - 1}'] * 9)}]\n" for level in range(1, 7))
    text = anchors + "id: d\ntitle: t\nquestions:\n- id: q\n  prompt: p\n  tags: [ok, *a6]\n"
    problems = [p for p in problems_of(tmp_path, text) if p.field == "tags"]
    assert [(p.line, p.question_id, p.message) for p in problems] == [(text.count("\n"), "q", "a tag must be text, got a list")]
    long_tag = Edit().replace("tags: [fsdp, memory", "tags: ['" + "two words " * 1000 + "', memory", within=q(1)).text
    [problem] = problems_of(tmp_path, long_tag)
    assert problem.field == "tags" and "one word without spaces" in problem.message and len(str(problem)) < 300


def test_a_control_character_is_refused_at_its_line(tmp_path):
    # PyYAML's reader said only: 'in "<unicode string>", position 397', and no line.
    edit = Edit().replace("title: Fully Sharded Data Parallel", "title: Fully\x00 Sharded")
    [problem] = problems_of(tmp_path, edit.text)
    assert (problem.line, problem.field) == (edit.line("title: Fully"), None)
    assert problem.message == "YAML syntax error: unacceptable character #x0000: special characters are not allowed"


@pytest.mark.parametrize("value", ["0", "false", "{}", "''", "", "[fsdp-old, Not A Slug]", "['']"])
def test_retired_ids_that_are_not_a_list_of_ids_are_refused_even_when_empty_looking(tmp_path, value):
    # `or []` once took 0, false, {}, '' and nothing for no retired ids, and any text for an id.
    edit = Edit().replace("retired_ids: []", f"retired_ids: {value}")
    [problem] = problems_of(tmp_path, edit.text)
    assert (problem.line, problem.field, problem.message) == (edit.line("retired_ids:"), "retired_ids", "must be a list of question ids")


@pytest.mark.parametrize(("value", "kind"), [("0", "a number"), ("false", "true/false"), ("[]", "a list"), ("", "nothing")])
def test_a_description_that_is_not_text_is_refused_even_when_empty_looking(tmp_path, value, kind):
    edit = Edit().delete("description: >-", count=3).insert_after("title: Fully", f"description: {value}")
    [problem] = problems_of(tmp_path, edit.text)
    assert (problem.line, problem.field, problem.message) == (edit.line("description:"), "description", f"must be text, got {kind}")


def test_an_unknown_key_shows_an_invisible_character_in_it(tmp_path):
    # A BOM inside the file (two files pasted together) made "unknown key 'title' ... (known: ... title)".
    edit = Edit().replace("title: Fully", "\ufefftitle: Fully")
    problems = problems_of(tmp_path, edit.text)
    assert "unknown key '\\ufefftitle' in the deck" in problems[0].message
    assert [(p.line, p.field) for p in problems] == [(edit.line("title: Fully"), "\ufefftitle"), (edit.line("id: fsdp"), "title")]


def test_a_tag_of_dots_alone_is_refused_since_its_page_would_be_another(tmp_path):
    # /stats/tags/.. is /stats/ to a browser: every tag the bank takes must have its own page.
    for tag in (".", "..", ".hidden"):
        [problem] = problems_of(tmp_path, Edit().replace("tags: [", f"tags: ['{tag}', ", within=q(1)).text)
        assert problem.field == "tags" and repr(tag) in problem.message, tag


def test_the_harness_copy_itself_loads(tmp_path):
    (tmp_path / "fsdp.yaml").write_text(Edit().text, encoding="utf-8")
    assert [len(deck.questions) for deck in load_bank(tmp_path)] == [8]


def test_there_are_at_least_twelve_kinds_of_malformed_file():
    assert len(CASES) >= 12


@pytest.mark.parametrize("make_case", CASES, ids=[c.__name__.removeprefix("case_") for c in CASES])
def test_a_malformed_file_is_refused_naming_file_line_and_field(tmp_path, make_case):
    case = make_case()
    problems = problems_of(tmp_path, case.edit.text)
    assert {p.file for p in problems} == {str(tmp_path / "fsdp.yaml")}
    assert [(p.line, p.question_id, p.field) for p in problems] == case.expected, [str(p) for p in problems]
    assert case.message in problems[0].message
    assert all(p.line >= 1 for p in problems)


def test_every_problem_in_a_file_is_reported_not_just_the_first(tmp_path):
    edit = Edit().replace("lab: what-fsdp-shards", "lab: Bad Lab").replace('prompt: FSDP was largely', 'prompt: ""  #')
    edit.replace("tags: [fsdp, zero, history]", "tags: [fsdp, two words]")
    problems = problems_of(tmp_path, edit.text)
    assert [(p.question_id, p.field) for p in problems] == [(q(1), "lab"), (q(4), "prompt"), (q(4), "tags")]


def test_a_problem_reads_as_file_line_question_field(tmp_path):
    problems = problems_of(tmp_path, Edit().delete("lab: reduce-scatter-backward").text)
    path = tmp_path / "fsdp.yaml"
    line = Edit(path).line(f"- id: {q(6)}")
    assert str(problems[0]) == (
        f"{path}:{line}, question {q(6)}, field 'lab': missing required key 'lab' in a question"
    )
    assert str(path) in str(BankError(problems))


# --- Across files: the bank is refused as a whole --------------------------------------


def two_decks(tmp_path: Path, zero_edit: Edit) -> tuple[Path, Path]:
    fsdp, zero = tmp_path / "fsdp.yaml", tmp_path / "zero.yaml"
    shutil.copy(BANK / "fsdp.yaml", fsdp)
    zero.write_text(zero_edit.text, encoding="utf-8")
    return fsdp, zero


def test_one_bad_file_of_two_refuses_the_whole_bank(tmp_path):
    fsdp, zero = two_decks(tmp_path, Edit(BANK / "zero.yaml").delete("lab: adam-optimizer-state"))
    with pytest.raises(BankError) as refused:
        load_bank(tmp_path)
    assert [(p.file, p.question_id, p.field) for p in refused.value.problems] == [(str(zero), "zero-adam-state", "lab")]
    # the good file on its own loads: only the bad one was the reason
    assert [deck.id for deck in load_bank(fsdp)] == ["fsdp"]


def test_duplicate_question_id_across_decks(tmp_path):
    edit = Edit(BANK / "zero.yaml").replace("- id: zero-adam-state", f"- id: {q(5)}")
    fsdp, zero = two_decks(tmp_path, edit)
    with pytest.raises(BankError) as refused:
        load_bank(tmp_path)
    first = Edit(fsdp).line(f"- id: {q(5)}")
    (problem,) = refused.value.problems
    assert (problem.file, problem.line, problem.question_id, problem.field) == (str(zero), edit.line(f"- id: {q(5)}"), q(5), "id")
    assert f"first used at {fsdp}:{first}" in problem.message


def test_duplicate_deck_id(tmp_path):
    edit = Edit(BANK / "zero.yaml").replace("id: zero\n", "id: fsdp\n")
    fsdp, zero = two_decks(tmp_path, edit)
    with pytest.raises(BankError) as refused:
        load_bank(tmp_path)
    (problem,) = refused.value.problems
    assert (problem.file, problem.line, problem.question_id, problem.field) == (str(zero), edit.line("id: fsdp"), None, "id")
    assert str(fsdp) in problem.message


def test_an_id_retired_by_another_deck_is_not_reused(tmp_path):
    edit = Edit(BANK / "zero.yaml").replace("retired_ids: []", f"retired_ids: [{q(5)}]")
    fsdp, _ = two_decks(tmp_path, edit)
    with pytest.raises(BankError) as refused:
        load_bank(tmp_path)
    (problem,) = refused.value.problems
    assert (problem.file, problem.line, problem.question_id, problem.field) == (str(fsdp), Edit(fsdp).line(f"- id: {q(5)}"), q(5), "id")


def test_a_missing_or_empty_bank_is_refused(tmp_path):
    with pytest.raises(BankError, match="no such file"):
        load_bank(tmp_path / "nowhere")
    with pytest.raises(BankError, match="no deck files"):
        load_bank(tmp_path)


def test_an_empty_file_is_refused_at_line_1(tmp_path):
    (problem,) = problems_of(tmp_path, "")
    assert (problem.line, problem.field) == (1, None)
    assert "must be a mapping" in problem.message


def test_parse_deck_alone_refuses_duplicate_ids():
    # parse_deck is what validates a single file (e.g. an imported quiz): it must not need load_bank
    edit = Edit().replace(f"- id: {q(2)}", f"- id: {q(1)}")
    deck, problems = parse_deck(edit.text, "one.yaml")
    assert deck is None
    assert [(p.question_id, p.field) for p in problems] == [(q(1), "id")]


def test_parse_deck_accepts_a_valid_deck():
    deck, problems = parse_deck(Edit().text, "fsdp.yaml")
    assert problems == [] and deck is not None
    assert (deck.id, deck.path, deck.line, len(deck.questions)) == ("fsdp", "fsdp.yaml", Edit().line("id: fsdp"), 8)
    assert deck.questions[0].line == Edit().line(f"- id: {q(1)}")


def test_decks_are_listed_by_their_order_then_by_file_name(tmp_path):
    # The repository's bank: the two seed quizzes first, the third deck after them.
    assert [deck.id for deck in load_bank()] == ["fsdp", "zero", "beyond"]
    # A file named to sort first still comes where its `order` puts it.
    shutil.copy(BANK / "fsdp.yaml", tmp_path / "b.yaml")
    shutil.copy(BANK / "zero.yaml", tmp_path / "a.yaml")
    assert [deck.id for deck in load_bank(tmp_path)] == ["fsdp", "zero"]


def test_a_deck_order_that_is_not_a_whole_number_is_refused_by_line(tmp_path):
    edit = Edit(BANK / "zero.yaml").replace("order: 2", "order: second")
    (problem,) = problems_of(tmp_path, edit.text)
    assert (problem.line, problem.field) == (edit.line("order: second"), "order")
    assert "whole number" in problem.message


def test_an_editors_hidden_lock_file_is_no_deck_and_a_fifo_is_refused_not_read(tmp_path):
    import os

    (tmp_path / "fsdp.yaml").write_text(Edit().text, encoding="utf-8")
    os.symlink("user@host.1234:1700000000", tmp_path / ".#fsdp.yaml")  # Emacs's lock: a dangling link
    (tmp_path / ".fsdp.yaml.swp").write_bytes(b"\0vim swap")
    assert [deck.id for deck in load_bank(tmp_path)] == ["fsdp"]
    os.mkfifo(tmp_path / "pipe.yaml")  # reading it would block until a writer came
    with pytest.raises(BankError) as refused:
        load_bank(tmp_path)
    assert [(Path(p.file).name, p.message) for p in refused.value.problems] == [("pipe.yaml", "is not a regular file")]


NOT_A_DECK = "is not a deck file (*.yaml or *.yml): rename it, or move it out of the bank folder"


def test_a_file_in_the_bank_folder_that_is_no_deck_file_is_refused_by_name(tmp_path):
    # zero.json was skipped unread, so `bank sync` retired the whole deck and said nothing of it.
    shutil.copy(BANK / "fsdp.yaml", tmp_path / "fsdp.yaml")
    shutil.copy(BANK / "zero.yaml", tmp_path / "zero.json")
    (tmp_path / "notes.txt").write_text("drafts\n", encoding="utf-8")
    with pytest.raises(BankError) as refused:
        load_bank(tmp_path)
    assert [str(p) for p in refused.value.problems] == [
        f"{tmp_path / 'notes.txt'}: {NOT_A_DECK}",
        f"{tmp_path / 'zero.json'}: {NOT_A_DECK}",
    ]


def test_what_the_bank_folder_may_hold_beside_its_decks(tmp_path):
    shutil.copy(BANK / "fsdp.yaml", tmp_path / "fsdp.yaml")
    shutil.copy(BANK / "zero.yaml", tmp_path / "Zero.YAML")  # the extension in any case is a deck file
    (tmp_path / "README.md").write_text("# Our decks\n", encoding="utf-8")
    (tmp_path / ".DS_Store").write_bytes(b"\0")
    (tmp_path / "fsdp.yaml~").write_text("an editor's backup\n", encoding="utf-8")
    (tmp_path / "drafts").mkdir()  # a folder is not read: the bank is the folder's own files
    (tmp_path / "drafts" / "draft.yaml").write_text("not: a deck\n", encoding="utf-8")
    assert [(deck.id, Path(deck.path).name) for deck in load_bank(tmp_path)] == [("fsdp", "fsdp.yaml"),
                                                                                ("zero", "Zero.YAML")]



def test_a_surrogate_escape_is_refused_naming_file_field_and_question(tmp_path):
    # A double-quoted "\ud83d\ude00" is two halves of a UTF-16 pair, not one character: `bank check` passed
    # it, and `bank sync` then failed with a UnicodeEncodeError traceback.
    edits = {
        "title: Alpha deck": 'title: "Alpha \\ud800"',
        "prompt: Why are gathered weights freed after a layer runs?": 'prompt: "Why \\ud83d\\ude00 large?"',
        "why_wrong: Nothing is corrupted.": 'why_wrong: "Nothing \\ude00 is."',
        "lab: reshard-after-forward": 'lab: reshard-after-forward\n    "hint\\ud800": x',
    }
    text = ALPHA_DECK
    for old, new in edits.items():
        text = text.replace(old, new)
    lines = text.splitlines()

    def line(needle: str) -> int:
        return next(number for number, text in enumerate(lines, start=1) if needle in text)

    problems = problems_of(tmp_path, text, "alpha.yaml")
    file = tmp_path / "alpha.yaml"
    half = "half of a UTF-16 surrogate pair, which is not a character and cannot be stored"
    assert [str(p) for p in problems] == [
        f"{file}:2, field 'title': holds U+D800, {half}: remove it",
        f"{file}:{line('hint')}, question alpha-free, field 'hint\\ud800': unknown key 'hint\\ud800' in a question "
        "(known: choices, explanation, id, lab, prompt, tags)",
        f"{file}:{line('Why')}, question alpha-free, field 'prompt': holds U+D83D, {half}: write \\U0001F600 "
        "(or the character itself)",
        f"{file}:{line('Nothing')}, question alpha-free, field 'choices[1].why_wrong': holds U+DE00, {half}: remove it",
    ]
