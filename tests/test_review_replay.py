"""Property: whatever the learner does (grades, repeats, undos, days passing), every card's
state equals the replay of its live, non-repeat review log through sm2.review."""

from __future__ import annotations

import tempfile
from datetime import timedelta
from pathlib import Path

from conftest import T0, write_bank
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlmodel import Session, select

from studyapp import sm2
from studyapp.bank import load_bank
from studyapp.db import make_engine, upgrade_schema
from studyapp.models import Card, ReviewLog
from studyapp.study import StudySettings, allowed_qualities, grade, next_card, replayed_schedule, undo_last
from studyapp.sync import sync_decks

with tempfile.TemporaryDirectory() as folder:
    BANK = load_bank(write_bank(Path(folder)))

SETTINGS = StudySettings(timezone="UTC", new_per_day=3, reviews_per_day=4)

decks = st.sampled_from([None, "alpha", "beta"])  # all decks, or a one-deck session
actions = st.lists(
    st.one_of(
        st.tuples(st.just("grade"), st.booleans(), st.integers(0, 2), decks),  # right?, which allowed grade
        st.tuples(st.just("undo"), decks),
        st.tuples(st.just("wait"), st.integers(1, 60)),  # hours
    ),
    max_size=40,
)


def assert_cards_match_their_logs(session: Session) -> None:
    for card in session.exec(select(Card)).all():
        session.refresh(card)
        assert card.state == replayed_schedule(session, card.id), card.question_id
        live = session.exec(
            select(ReviewLog).where(ReviewLog.card_id == card.id, ReviewLog.undone_at.is_(None)).order_by(ReviewLog.id)
        ).all()
        if not live:
            assert card.is_new and card.state == sm2.NEW_CARD
        else:
            assert card.due_day == live[-1].after_due_day and card.repeat_day == live[-1].after_repeat_day


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions)
def test_card_state_always_equals_the_replay_of_its_log(steps):
    engine = make_engine("sqlite://")
    upgrade_schema(engine)
    with Session(engine) as session:
        sync_decks(session, BANK)
        now = T0
        for step in steps:
            if step[0] == "grade":
                _, right, pick, deck = step
                card = next_card(session, now, SETTINGS, deck)
                if card is None:
                    continue
                choice = card.answer if right else (card.answer + 1) % len(card.choices)
                grade(session, card_id=card.id, version=card.version, choice=choice,
                      quality=allowed_qualities(right)[pick], now=now, settings=SETTINGS)
            elif step[0] == "undo":
                undo_last(session, now, deck_id=step[1])  # a deck's latest review, maybe not the latest
            else:
                now += timedelta(hours=step[1])
            assert_cards_match_their_logs(session)
    engine.dispose()
