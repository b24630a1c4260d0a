"""Several clients at once against a real server (in a thread): duplicates count once, undo and
grades never leave a card out of step with its log, and every undo that answered "undone" undid
exactly one review."""

from __future__ import annotations

import pytest
from db_checks import assert_cards_replay
from live_server import Client, Traffic, at_once
from sqlmodel import Session, select

from studyapp.db import get_engine
from studyapp.models import Card, ReviewLog

pytestmark = pytest.mark.slow  # a real HTTP server and racing threads


def cards(app) -> list[Card]:
    with Session(get_engine(app)) as session:
        return session.exec(select(Card).order_by(Card.position)).all()


def assert_consistent(app) -> None:
    assert_cards_replay(get_engine(app))


def undid_a_review(response: tuple[int, str, str]) -> bool:
    """An undo that undid something redirects to the card it restored; "nothing to undo" does not."""
    status, location, _ = response
    return status == 302 and "card=" in location


def test_the_same_review_from_many_clients_counts_once(app, live_server):
    browser = Client(live_server, Traffic())  # one session cookie and its CSRF token
    first = cards(app)[0]
    form = {"card_id": first.id, "version": first.version, "choice": first.answer, "quality": 5}
    statuses = at_once(*[lambda: browser.request("POST", "/study/grade", form)[0]] * 8)
    assert statuses == [302] * 8
    with Session(get_engine(app)) as session:
        assert len(session.exec(select(ReviewLog)).all()) == 1
    assert_consistent(app)


def test_grades_and_undos_racing_keep_every_card_in_step_with_its_log(app, live_server):
    browser = Client(live_server, Traffic())  # one session cookie and its CSRF token
    jobs = []
    for card in cards(app):
        form = {"card_id": card.id, "version": card.version, "choice": card.answer, "quality": 4}
        jobs.append(lambda form=form: browser.request("POST", "/study/grade", form))
        jobs.append(lambda: browser.request("POST", "/study/undo", {}))
    responses = at_once(*jobs)
    assert all(status in (302, 409) for status, _, _ in responses), [r[0] for r in responses]
    grades, undos = responses[0::2], responses[1::2]
    assert all(status == 302 for status, _, _ in grades)  # a first grade per card never conflicts
    assert_consistent(app)
    with Session(get_engine(app)) as session:
        logs = session.exec(select(ReviewLog)).all()
    assert len(logs) == 5  # every grade landed once
    assert sum(log.undone_at is not None for log in logs) == sum(map(undid_a_review, undos))

    # Whatever the race left, one more undo undoes the newest live review, exactly.
    live = [log for log in logs if log.undone_at is None]
    if live:
        newest = max(live, key=lambda log: log.id)
        assert undid_a_review(browser.request("POST", "/study/undo", {}))
        with Session(get_engine(app)) as session:
            assert session.get(ReviewLog, newest.id).undone_at is not None
            card = session.get(Card, newest.card_id)
            assert (card.repetitions, card.easiness, card.interval, card.due_day, card.repeat_day) == (
                newest.before_repetitions, newest.before_easiness, newest.before_interval, newest.before_due_day,
                newest.before_repeat_day)
        assert_consistent(app)
    else:  # every review was undone: the next undo has nothing left
        assert not undid_a_review(browser.request("POST", "/study/undo", {}))
