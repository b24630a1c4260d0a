"""The third deck (bank/beyond.yaml): its questions validate, each is backed by its own lab, the numbers
its explanations share with the labs' committed findings agree, and the app shows it like the others."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest
from conftest import REPO, with_committed_lab_results

from sharding_lab.catalog import CATALOG, LABS_BY_ID
from studyapp.bank import Deck, load_bank

REFERENCE = json.loads((REPO / "exports" / "lab-results.json").read_text(encoding="utf-8"))

# Stable ids: progress is keyed by them.
QUESTION_LABS = {
    "beyond-activations-do-not-shrink": "activation-memory-per-rank",
    "beyond-activation-checkpointing": "activation-checkpointing",
    "beyond-fsdp2-mixed-precision": "fsdp2-mixed-precision",
    "beyond-cpu-offload": "cpu-offload-traffic",
    "beyond-hsdp": "hsdp-two-collectives",
    "beyond-grad-accumulation": "grad-accumulation-no-sync",
    "beyond-persistence-threshold": "zero3-persistence-threshold",
    "beyond-ring-all-reduce": "ring-all-reduce",
    "beyond-ddp-buckets": "ddp-gradient-buckets",
    "beyond-zero1-whole-tensors": "zero1-whole-tensors",
}

# The answer each question intends.
CORRECT = {
    "beyond-activations-do-not-shrink": "Activations saved for backward and the kernels' temporaries",
    "beyond-activation-checkpointing": "It stores only each block's input and reruns the block's forward during backward",
    "beyond-fsdp2-mixed-precision": "fp32 parameter shards (the master weights), fp32 gradient shards and fp32 Adam "
    "state, with bf16 copies made only while gathered",
    "beyond-cpu-offload": "Sharded parameters, gradients and Adam state live on the host; each all-gather copies the "
    "parameter shard up and each reduce-scatter's output comes back down",
    "beyond-hsdp": "A reduce-scatter within each shard group, then an all-reduce of each shard across the replicas",
    "beyond-grad-accumulation": "Less communication but more memory, since each rank keeps unsharded gradients "
    "between micro-batches",
    "beyond-persistence-threshold": "Parameters of at most stage3_param_persistence_threshold elements (1e5 by default)",
    "beyond-ring-all-reduce": "2(N−1)/N · S, a reduce-scatter plus an all-gather",
    "beyond-ddp-buckets": "It groups gradients into buckets (the first 1 MiB, later ones 25 MiB) and all-reduces each "
    "bucket once it is full, overlapping backward",
    "beyond-zero1-whole-tensors": "ZeroRedundancyOptimizer gives each rank whole tensors, largest first to the "
    "least-loaded rank; DeepSpeed cuts one flat buffer into N equal parts",
}

# Figures each explanation shares with its lab's committed finding (exports/lab-results.json): measured
# numbers, written the way the finding writes them.
SHARED_FIGURES = {
    "beyond-activations-do-not-shrink": ["15.7 MiB", "7.8 MiB", "3.9 MiB", "9.1 MiB", "0.65x, not 0.25x"],
    "beyond-activation-checkpointing": ["7.1 MiB", "2.4 MiB", "0.33x", "32.0 KiB", "twice"],
    "beyond-fsdp2-mixed-precision": ["4/4/8", "2/2/12", "117.4 KiB in bf16 against 234.8 KiB"],
    "beyond-cpu-offload": ["2.9 MiB", "1.49x", "2.0 MiB", "7.8 MiB"],
    "beyond-hsdp": ["117.4 KiB", "2.0x", "1/2"],
    "beyond-grad-accumulation": ["5 reduce-scatters", "20", "234.8 KiB", "135.5 KiB"],
    "beyond-persistence-threshold": ["1e5", "49.0%", "99.0%", "0.1%"],
    "beyond-ring-all-reduce": ["2(N-1)/N", "1.00x", "1.50x"],
    "beyond-ddp-buckets": ["1 MiB", "25 MiB", "3.9 MiB", "38.2 MiB", "14 all-reduces"],
    "beyond-zero1-whole-tensors": ["262,144", "2.04x", "128,544", "2N elements"],
}


@pytest.fixture(scope="module")
def deck() -> Deck:
    return next(deck for deck in load_bank() if deck.id == "beyond")


def normalise(text: str) -> str:
    """The explanation's typography as the findings write it: plain minus signs and x for times."""
    return text.replace("−", "-").replace("×", "x")


def test_the_deck_loads_with_ten_questions_in_order(deck):
    assert deck.title == "Beyond the Quizzes" and deck.description
    assert [q.id for q in deck.questions] == list(QUESTION_LABS)
    assert {q.id: q.choices[q.answer] for q in deck.questions} == CORRECT
    assert deck.retired_ids == ()


def test_four_plausible_choices_with_a_specific_reason_for_each_distractor(deck):
    for q in deck.questions:
        assert len(q.choices) == 4 and len(set(q.choices)) == 4, q.id
        correct = q.choices[q.answer]
        for index, (choice, reason) in enumerate(zip(q.choices, q.why_wrong, strict=True)):
            if index == q.answer:
                assert reason == ""
                continue
            # A distractor is a real misconception: a sentence of its own, explained in one line.
            assert len(choice) >= 25 and len(choice) >= len(correct) // 3, (q.id, choice)
            assert 30 < len(reason) <= 200 and "\n" not in reason, (q.id, reason)
        assert len(set(q.why_wrong)) == 4, q.id


def test_explanations_tags_and_labs(deck):
    for q in deck.questions:
        assert len(q.explanation.split()) >= 60, q.id
        assert q.tags[0] == "beyond" and len(q.tags) >= 3 and len(set(q.tags)) == len(q.tags), q.id
        assert q.lab == QUESTION_LABS[q.id]


def test_each_question_has_its_own_lab_and_no_lab_is_orphaned(deck):
    questions = {q.id for q in deck.questions}
    beyond_labs = [lab for lab in CATALOG if set(lab.questions) & questions]
    assert [lab.id for lab in beyond_labs] == list(QUESTION_LABS.values())
    for lab in beyond_labs:
        assert set(lab.questions) <= questions, f"{lab.id} backs only this deck's questions"
    for q in deck.questions:
        assert LABS_BY_ID[q.lab].questions == (q.id,)


def test_every_lab_of_the_deck_has_a_committed_finding_that_held():
    for lab_id in QUESTION_LABS.values():
        result = REFERENCE[lab_id]
        assert result["holds"] is True, result["reasons"]
        assert result["questions"] == list(LABS_BY_ID[lab_id].questions)


@pytest.mark.parametrize("question_id", list(SHARED_FIGURES))
def test_the_explanations_numbers_are_the_labs_findings(deck, question_id):
    question = next(q for q in deck.questions if q.id == question_id)
    explanation = normalise(question.explanation)
    finding = normalise(REFERENCE[question.lab]["finding"])
    for figure in SHARED_FIGURES[question_id]:
        assert figure in explanation, f"{question_id}: {figure!r} not in the explanation"
        assert figure in finding, f"{question_id}: {figure!r} not in {question.lab}'s finding"


def test_every_measured_size_in_an_explanation_is_in_its_labs_finding(deck):
    # Any "<number> MiB/KiB" or "<number>x" the explanation states came from the lab's finding.
    for q in deck.questions:
        finding = normalise(REFERENCE[q.lab]["finding"])
        for figure in re.findall(r"\d+\.\d+ (?:MiB|KiB)|\d+\.\d+x", normalise(q.explanation)):
            assert figure in finding, f"{q.id}: {figure!r} is not in {q.lab}'s finding"


# --- in the app --------------------------------------------------------------------------------------


@pytest.fixture
def bank_dir() -> Path:
    return REPO / "bank"


@pytest.fixture
def app_config(app_config: dict, tmp_path: Path) -> dict:
    return with_committed_lab_results(app_config, tmp_path)


def page_text(response) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", response.get_data(as_text=True))).split())


def test_the_app_syncs_the_deck_and_shows_each_cards_lab(client):
    deck_page = page_text(client.get("/decks/beyond"))
    assert "Beyond the Quizzes" in deck_page
    card = page_text(client.get("/questions/beyond-hsdp"))
    assert LABS_BY_ID["hsdp-two-collectives"].title in card
    assert REFERENCE["hsdp-two-collectives"]["finding"] in card
    lab_page = client.get("/labs/zero1-whole-tensors")
    assert lab_page.status_code == 200
    assert REFERENCE["zero1-whole-tensors"]["finding"] in page_text(lab_page)
