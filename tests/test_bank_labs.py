"""The bank and the lab catalogue agree: every card names a lab that backs it, every lab backs cards."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sharding_lab.catalog import CATALOG, LABS_BY_ID, lab_info
from studyapp.bank import load_bank

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def questions():
    return {q.id: q for deck in load_bank() for q in deck.questions}


def test_every_question_names_a_catalogued_lab_that_backs_it(questions):
    for question in questions.values():
        assert question.lab in LABS_BY_ID, f"{question.id}: unknown lab {question.lab!r}"
        assert question.id in LABS_BY_ID[question.lab].questions, f"{question.id}: lab {question.lab} does not list it"


def test_every_catalogued_question_exists_and_each_is_backed_once(questions):
    listed = [question_id for lab in CATALOG for question_id in lab.questions]
    assert sorted(listed) == sorted(questions), "the catalogue and the bank must list the same 16 questions"
    assert len(listed) == len(set(listed)), "a question is backed by one lab"


def test_every_lab_backs_at_least_one_question(questions):
    for lab in CATALOG:
        assert lab.questions, lab.id
        assert all(question_id in questions for question_id in lab.questions), lab.id


def test_lab_ids_are_unique_and_looked_up(questions):
    assert len(LABS_BY_ID) == len(CATALOG)
    lab = lab_info(questions["zero-practical-cost"].lab)
    assert lab is not None and lab.id == "memory-communication-tradeoff"
    assert lab.command == "sharding-lab run memory-communication-tradeoff"
    assert lab_info("no-such-lab") is None


def test_importing_the_catalogue_does_not_import_torch():
    code = "import sys, sharding_lab.catalog; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_importing_the_bank_loader_does_not_import_torch():
    code = "import sys, studyapp.bank; studyapp.bank.load_bank(); print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"
