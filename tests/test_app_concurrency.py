"""Several clients at once against a real server: duplicates count once, undo and grades
never leave a card out of step with its log, and nothing answers 5xx."""

from __future__ import annotations

import threading

from live_server import Client, Traffic
from sqlmodel import Session, select

from studyapp.db import get_engine
from studyapp.models import Card, ReviewLog
from studyapp.study import replayed_schedule


def cards(app) -> list[Card]:
    with Session(get_engine(app)) as session:
        return session.exec(select(Card).order_by(Card.position)).all()


def run_all(jobs) -> list[int]:
    statuses: list[int] = []
    lock = threading.Lock()

    def run(job):
        status = job()
        with lock:
            statuses.append(status)

    threads = [threading.Thread(target=run, args=(job,)) for job in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return statuses


def assert_consistent(app) -> None:
    with Session(get_engine(app)) as session:
        for card in session.exec(select(Card)).all():
            assert card.state == replayed_schedule(session, card.id), card.question_id


def test_the_same_review_from_many_clients_counts_once(app, live_server):
    browser = Client(live_server, Traffic())  # one session cookie and its CSRF token
    first = cards(app)[0]
    form = {"card_id": first.id, "version": first.version, "choice": first.answer, "quality": 5}
    statuses = run_all([lambda: browser.request("POST", "/study/grade", form)[0]] * 8)
    assert statuses == [302] * 8
    with Session(get_engine(app)) as session:
        assert len(session.exec(select(ReviewLog)).all()) == 1
    assert_consistent(app)


def test_grades_and_undos_racing_keep_every_card_in_step_with_its_log(app, live_server):
    browser = Client(live_server, Traffic())  # one session cookie and its CSRF token
    jobs = []
    for card in cards(app):
        form = {"card_id": card.id, "version": card.version, "choice": card.answer, "quality": 4}
        jobs.append(lambda form=form: browser.request("POST", "/study/grade", form)[0])
        jobs.append(lambda: browser.request("POST", "/study/undo", {})[0])
    statuses = run_all(jobs)
    assert all(status in (302, 409) for status in statuses), statuses
    assert_consistent(app)
    with Session(get_engine(app)) as session:
        logs = session.exec(select(ReviewLog)).all()
    assert len(logs) == 5  # every grade landed once; some were undone
