"""Bank → database sync: idempotent; edits keep progress; removals retire; a bad bank changes nothing."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable

import pytest
from conftest import ALPHA_DECK, BETA_DECK, T0, write_bank
from sqlalchemy import event
from sqlmodel import Session, select

from studyapp.bank import BankError
from studyapp.db import get_engine
from studyapp.models import Card, Deck, ReviewLog
from studyapp.study import ReviewConflict, StudySettings, grade
from studyapp.sync import SyncReport, sync_bank

SETTINGS = StudySettings(timezone="UTC")


def snapshot(app) -> dict[str, tuple]:
    with Session(get_engine(app)) as session:
        cards = session.exec(select(Card)).all()
        return {c.question_id: (c.prompt, c.retired, c.repetitions, c.easiness, c.interval, c.due_day, c.content_hash) for c in cards}


def review(app, qid: str) -> None:
    with Session(get_engine(app)) as session:
        card = session.exec(select(Card).where(Card.question_id == qid)).one()
        grade(session, card_id=card.id, version=card.version, choice=card.answer, quality=5, now=T0, settings=SETTINGS)


def test_first_sync_adds_every_question_and_deck(app):
    with Session(get_engine(app)) as session:
        decks = session.exec(select(Deck).order_by(Deck.position)).all()
        cards = session.exec(select(Card).order_by(Card.position)).all()
    assert [(d.id, d.title) for d in decks] == [("alpha", "Alpha deck"), ("beta", "Beta deck")]
    assert [c.question_id for c in cards] == ["alpha-shards", "alpha-gather", "alpha-free", "beta-adam", "beta-stage3"]
    gather = cards[1]
    assert gather.choices == ["Broadcast-only", "All-gather", "Scatter", "Barrier"]
    assert gather.answer == 1 and gather.why_wrong[1] == "" and gather.lab == "allgather-before-layer"
    assert gather.is_new and not gather.retired


def test_sync_is_idempotent(app, bank_dir):
    before = snapshot(app)
    report = sync_bank(get_engine(app), bank_dir)
    assert not report.changed and report.unchanged == 5
    assert snapshot(app) == before


def test_an_edited_question_updates_its_card_and_keeps_its_progress(app, bank_dir):
    review(app, "alpha-gather")
    progress = snapshot(app)["alpha-gather"][2:6]
    write_bank(bank_dir, {"alpha": ALPHA_DECK.replace("rebuilds a layer's full weights", "reassembles a layer's weights"),
                          "beta": BETA_DECK})
    report = sync_bank(get_engine(app), bank_dir)
    assert report.updated == ["alpha-gather"] and not report.added and not report.retired
    after = snapshot(app)["alpha-gather"]
    assert after[0] == "Which collective reassembles a layer's weights before it runs?"
    assert after[2:6] == progress


def test_a_removed_question_is_retired_with_its_history_and_restored_if_it_returns(app, bank_dir):
    review(app, "beta-adam")
    stage3_only = "id: beta\ntitle: Beta deck\nquestions:\n" + BETA_DECK[BETA_DECK.index("  - id: beta-stage3"):]
    write_bank(bank_dir, {"alpha": ALPHA_DECK, "beta": stage3_only})
    report = sync_bank(get_engine(app), bank_dir)
    assert report.retired == ["beta-adam"]
    state = snapshot(app)["beta-adam"]
    assert state[1] is True and state[2] == 1  # retired, progress kept
    with Session(get_engine(app)) as session:
        assert len(session.exec(select(ReviewLog)).all()) == 1  # history kept

    write_bank(bank_dir, {"alpha": ALPHA_DECK, "beta": BETA_DECK})
    report = sync_bank(get_engine(app), bank_dir)
    assert report.restored == ["beta-adam"]
    assert snapshot(app)["beta-adam"][1:3] == (False, 1)


def test_a_removed_deck_is_retired_with_its_cards(app, bank_dir):
    write_bank(bank_dir, {"alpha": ALPHA_DECK})
    report = sync_bank(get_engine(app), bank_dir)
    assert sorted(report.retired) == ["beta-adam", "beta-stage3"]
    with Session(get_engine(app)) as session:
        assert session.get(Deck, "beta").retired


def test_a_retired_deck_is_named_in_the_summary_with_its_reviewed_cards(app, bank_dir):
    # A deck file gone from the folder (renamed, moved) retired its reviewed cards among the counts alone.
    review(app, "beta-adam")
    write_bank(bank_dir, {"alpha": ALPHA_DECK})
    report = sync_bank(get_engine(app), bank_dir)
    assert report.summary() == ("1 decks: 0 added, 0 updated, 2 retired, 0 restored, 3 unchanged; "
                                "retired deck beta (2 cards, 1 reviewed; their history is kept)")
    assert "retired deck" not in sync_bank(get_engine(app), bank_dir).summary()  # said once, when it happens


def test_a_sync_from_one_deck_file_refuses_to_retire_the_other_decks(app, bank_dir, runner):
    before = snapshot(app)
    edited = ALPHA_DECK.replace("What does FSDP shard that DDP replicates?", "An edit synced with its folder")
    write_bank(bank_dir, {"alpha": edited, "beta": BETA_DECK})
    one_file = bank_dir / "alpha.yaml"
    result = runner.invoke(args=["bank", "sync", "--path", str(one_file)])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert (f"Error: {one_file}: this bank is one file, and a sync makes the database match its bank: it would "
            "retire the decks the file does not hold (beta) and their 2 cards.") in result.output
    assert "Nothing was changed." in result.output and snapshot(app) == before
    report = sync_bank(get_engine(app), bank_dir)  # the folder takes the same edit
    assert report.updated == ["alpha-shards"] and report.retired == []


def test_a_bad_bank_changes_nothing_and_names_file_line_and_field(app, bank_dir):
    before = snapshot(app)
    broken = ALPHA_DECK.replace("      - text: All-gather\n        correct: true\n", "      - text: All-gather\n")
    broken = broken.replace("What does FSDP shard that DDP replicates?", "An edit that must not land")
    write_bank(bank_dir, {"alpha": broken, "beta": BETA_DECK})
    with pytest.raises(BankError) as refused:
        sync_bank(get_engine(app), bank_dir)
    message = str(refused.value)
    assert re.search(r"alpha\.yaml:\d+, question alpha-gather, field 'choices'", message), message
    assert snapshot(app) == before


def test_a_reordered_bank_moves_cards_without_staling_an_open_answer(app, bank_dir):
    with Session(get_engine(app)) as session:
        open_form = session.exec(select(Card).where(Card.question_id == "beta-adam")).one()  # shown, not yet graded
        versions = {c.question_id: c.version for c in session.exec(select(Card))}
    write_bank(bank_dir, {"alpha": ALPHA_DECK + "order: 1\n", "beta": BETA_DECK})  # beta's deck first now
    report = sync_bank(get_engine(app), bank_dir)
    assert report.moved == ["beta-adam", "beta-stage3", "alpha-shards", "alpha-gather", "alpha-free"]
    assert report.changed and not (report.updated or report.added or report.retired or report.restored)
    assert "5 moved, 0 unchanged" in report.summary()
    with Session(get_engine(app)) as session:
        cards = session.exec(select(Card).order_by(Card.position)).all()
        assert [c.question_id for c in cards] == report.moved
        assert {c.question_id: c.version for c in cards} == versions  # nothing a learner sees changed
        result = grade(session, card_id=open_form.id, version=open_form.version, choice=open_form.answer, quality=5,
                       now=T0, settings=SETTINGS)
    assert not result.duplicate and result.log.card_id == open_form.id


GAMMA_DECK = BETA_DECK.replace("id: beta", "id: gamma").replace("Beta deck", "Gamma deck")


def run_between_read_and_write(sync: Callable[[], SyncReport], meanwhile: Callable[[], object]) -> tuple[SyncReport, list]:
    """`sync()`, with `meanwhile()` started in another thread once the sync has read the database and before
    it writes (its first flush); waits a moment for it, then lets the sync go on. Returns the sync's report
    and what `meanwhile` returned or raised."""
    outcome: list = []

    def run() -> None:
        try:
            outcome.append(meanwhile())
        except Exception as error:  # noqa: BLE001 - the test inspects it
            outcome.append(error)

    thread = threading.Thread(target=run)
    event.listen(Session, "before_flush", lambda *_: (thread.start(), thread.join(timeout=1)), once=True)
    try:
        report = sync()
    finally:
        thread.join(timeout=60)
    return report, outcome


def test_two_syncs_at_once_each_succeed_and_add_a_new_deck_once(app, bank_dir):
    """Two processes starting together (serve, bank sync) must not both insert the new deck."""
    write_bank(bank_dir, {"alpha": ALPHA_DECK, "beta": BETA_DECK, "gamma": GAMMA_DECK.replace("beta-", "gamma-")})
    engine = get_engine(app)
    first, (second,) = run_between_read_and_write(lambda: sync_bank(engine, bank_dir), lambda: sync_bank(engine, bank_dir))
    assert not isinstance(second, Exception), second
    assert sorted([*first.added, *second.added]) == ["gamma-adam", "gamma-stage3"]
    assert first.unchanged + second.unchanged == 5 + 7  # the 5 old cards, then all 7 on the later sync
    with Session(engine) as session:
        assert sorted(c.question_id for c in session.exec(select(Card))) == sorted(
            ["alpha-shards", "alpha-gather", "alpha-free", "beta-adam", "beta-stage3", "gamma-adam", "gamma-stage3"])


def test_a_grade_during_a_sync_is_not_applied_to_the_edited_text_under_a_stale_version(app, bank_dir):
    """A learner answers the old text while a sync edits it: either the grade is refused, or the
    edit bumps the version past the grade's, so every change shows in the version."""
    engine = get_engine(app)
    with Session(engine) as session:
        shown = session.exec(select(Card).where(Card.question_id == "alpha-gather")).one()
    write_bank(bank_dir, {"alpha": ALPHA_DECK.replace("rebuilds a layer's full weights", "reassembles a layer's weights"),
                          "beta": BETA_DECK})

    def answer_the_old_text():
        with Session(engine) as session:
            return grade(session, card_id=shown.id, version=shown.version, choice=shown.answer, quality=5,
                         now=T0, settings=SETTINGS)

    report, (graded,) = run_between_read_and_write(lambda: sync_bank(engine, bank_dir), answer_the_old_text)
    assert report.updated == ["alpha-gather"]
    with Session(engine) as session:
        card = session.get(Card, shown.id)
        logs = session.exec(select(ReviewLog).where(ReviewLog.card_id == shown.id)).all()
    grades_applied = 0 if isinstance(graded, ReviewConflict) else 1
    assert len(logs) == grades_applied
    assert card.version == shown.version + 1 + grades_applied  # the sync's bump and the grade's, if any
