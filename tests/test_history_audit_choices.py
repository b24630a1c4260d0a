"""History audit: a backup stays restorable after the bank drops the choice a past review picked."""

from __future__ import annotations

import json

import pytest
from conftest import ALPHA_DECK, BETA_DECK, write_bank
from db_checks import table_rows
from review_driver import drive_reviews
from sqlmodel import Session, select
from test_history import fresh_app, schedules

from studyapp.db import get_engine
from studyapp.models import Card, ReviewLog
from studyapp.sync import sync_bank

# alpha-shards with its last two distractors dropped: a review that picked either now names no choice.
TRIMMED_ALPHA = ALPHA_DECK.replace("""\
      - text: Only the learning rate schedule
        why_wrong: A schedule is a few scalars, nothing to shard.
      - text: The dataset files on disk
        why_wrong: Files on disk are not GPU memory.
""", "", 1)


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_a_backup_restores_after_the_bank_drops_a_chosen_choice(app, client, clock, runner, app_config, tmp_path, fmt):
    assert TRIMMED_ALPHA != ALPHA_DECK
    drive_reviews(client, clock, days=6, undo_every=4, seed=3)
    with Session(get_engine(app)) as session:
        shards = session.exec(select(Card).where(Card.question_id == "alpha-shards")).one()
        picked = {log.choice for log in session.exec(select(ReviewLog).where(ReviewLog.card_id == shards.id)).all()}
    assert picked & {2, 3}, picked  # some review picked a choice the edit drops
    trimmed = write_bank(tmp_path / "bank-trimmed", {"alpha": TRIMMED_ALPHA, "beta": BETA_DECK})
    sync_bank(get_engine(app), trimmed)
    exported = tmp_path / f"history.{fmt}"
    assert runner.invoke(args=["export-history", "--out", str(exported)]).exit_code == 0
    before = table_rows(get_engine(app))

    again = runner.invoke(args=["import-history", str(exported)])  # into the database it came from
    assert again.exit_code == 0, again.output
    assert table_rows(get_engine(app)) == before
    expected = schedules(app)
    get_engine(app).dispose()

    if fmt == "json":  # as earlier versions wrote a dropped choice's text: "", not null
        document = json.loads(exported.read_text(encoding="utf-8"))
        assert any(review["choice_text"] is None for review in document["reviews"])
        for review in document["reviews"]:
            review["choice_text"] = review["choice_text"] or ""
        (tmp_path / "old-style.json").write_text(json.dumps(document), encoding="utf-8")
    restored = fresh_app(app_config, tmp_path, trimmed, "restored")  # a new install of the same bank
    result = restored.test_cli_runner().invoke(args=["import-history", str(tmp_path / "old-style.json" if fmt == "json" else exported)])
    assert result.exit_code == 0, result.output
    assert schedules(restored) == expected
    assert restored.test_cli_runner().invoke(args=["export-history", "--format", fmt]).output == exported.read_text(encoding="utf-8")
    get_engine(restored).dispose()
