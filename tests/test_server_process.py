"""The real server process (`studyapp serve` in a subprocess) under concurrent clients, and
killed with SIGKILL under load: every acknowledged review is kept exactly once, every card
stays in step with its log, nothing answers 5xx. A server that dies before the planned kill
fails the test. Figures, all counted, go to reliability-*.json (see live_server.record_figures)
for the README's reliability section."""

from __future__ import annotations

import http.client
import random
import re
import threading
import time
from dataclasses import dataclass, field

import pytest
from db_checks import assert_cards_replay, assert_sqlite_intact
from live_server import (
    Client,
    ServerProcess,
    Traffic,
    at_once,
    record_figures,
    shown_form,
    wait_for,
    write_load_bank,
)
from sqlmodel import Session, select

from studyapp.db import make_engine
from studyapp.models import Card, ReviewLog

CLIENTS = 4
ROUNDS_PER_CLIENT = 50  # ~700 requests in all: enough for races on 2 cores, bounded in time
TIME_LIMIT_S = 25

pytestmark = pytest.mark.slow  # real server processes under load, killed and restarted


@dataclass
class Ledger:
    """What the clients were told: the reviews acknowledged (by submission id), undos that undid."""

    acknowledged: set[str] = field(default_factory=set)
    duplicates_injected: int = 0
    undo_races: int = 0
    undos_acknowledged: int = 0
    conflicts: int = 0
    unanswered: int = 0  # requests whose answer never came (the server was killed)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def note_grade(self, form: dict, status: int) -> None:
        with self.lock:
            if status == 302:
                self.acknowledged.add(f"card{form['card_id']}-v{form['version']}")
            elif status == 409:
                self.conflicts += 1


def run_learners(learner, count: int, timeout: float, while_running=None) -> None:
    """Run learner(0..count-1) in threads; `while_running(alive)` meanwhile, where alive() says
    whether any learner still runs. A learner's failure fails the test."""
    failures: list[BaseException] = []

    def guarded(number: int) -> None:
        try:
            learner(number)
        except BaseException as error:  # noqa: BLE001 - reported below, in the test's own thread
            failures.append(error)

    threads = [threading.Thread(target=guarded, args=(n,)) for n in range(count)]
    for thread in threads:
        thread.start()
    if while_running:
        while_running(lambda: any(thread.is_alive() for thread in threads))
    for thread in threads:
        thread.join(timeout=timeout)
    assert not [t for t in threads if t.is_alive()], "a learner hung"
    if failures:
        raise failures[0]


def answers(database_url: str) -> dict[int, int]:
    engine = make_engine(database_url)
    with Session(engine) as session:
        cards = {card.id: card.answer for card in session.exec(select(Card)).all()}
    engine.dispose()
    return cards


def shown_grade_form(client: Client, card_id: int, answer: int, rng: random.Random) -> dict | None:
    """Show the card, answer it (right 60% of the time) and return the grade form to send.
    Grades stay below 4, so every card comes back the same day (step 7) and can be graded again."""
    status, _, page = client.request("GET", f"/study?card={card_id}")
    form = shown_form(page)
    if status != 200 or form is None or form["card_id"] != str(card_id):
        return None
    correct = rng.random() < 0.6
    form["choice"] = str(answer if correct else 1 - answer)
    status, _, page = client.request("POST", "/study/answer", form)
    assert status in (200, 302), (status, page[-500:])  # 302: another client graded it meanwhile
    if status != 200:
        return None
    form.pop("shown_at")
    duration = re.search(r'name="duration_ms" value="(\d+)"', page)
    return {**form, "quality": "3" if correct else str(rng.randint(0, 2)), "duration_ms": duration.group(1) if duration else ""}


def database_sids(database_url: str) -> tuple[set[str], int, int]:
    """(submission ids in the log, rows, rows undone); checks SQLite's integrity and the replay first."""
    engine = make_engine(database_url)
    try:
        assert_sqlite_intact(engine)
        assert_cards_replay(engine)
        with Session(engine) as session:
            logs = session.exec(select(ReviewLog)).all()
        return {log.submission_id for log in logs}, len(logs), sum(log.undone_at is not None for log in logs)
    finally:
        engine.dispose()


def test_concurrent_clients_duplicates_and_racing_undos(database_url, tmp_path, tmp_path_factory):
    server = ServerProcess(tmp_path, database_url, write_load_bank(tmp_path / "bank"))
    url = server.start()
    traffic, ledger = Traffic(), Ledger()
    cards = answers(database_url)
    deadline = time.monotonic() + TIME_LIMIT_S

    def learner(number: int) -> None:
        rng = random.Random(number)
        client = Client(url, traffic)
        own = [card_id for card_id in cards if card_id % CLIENTS == number]
        for _ in range(ROUNDS_PER_CLIENT):
            if time.monotonic() > deadline:
                return
            card_id = rng.choice(own) if rng.random() < 0.5 else rng.choice(list(cards))  # half: anyone's card
            form = shown_grade_form(client, card_id, cards[card_id], rng)
            if form is None:
                continue
            def grade(form=form) -> int:
                return client.request("POST", "/study/grade", form)[0]

            roll = rng.random()
            if roll < 0.15:  # two tabs submit the same review at once
                statuses = at_once(grade, grade)
                with ledger.lock:
                    ledger.duplicates_injected += 1
            elif roll < 0.30:  # an undo racing a new review
                statuses, (undo_status, location, _) = at_once(grade, lambda: client.request("POST", "/study/undo", {}))
                statuses = [statuses]
                assert undo_status in (302, 409), undo_status
                with ledger.lock:
                    ledger.undo_races += 1
                    ledger.undos_acknowledged += undo_status == 302 and "card=" in location
            else:
                statuses = [grade()]
            if rng.random() < 0.25:  # a browser retries the same submission later
                statuses.append(grade())
                with ledger.lock:
                    ledger.duplicates_injected += 1
            for status in statuses:
                assert status in (302, 409), status
                ledger.note_grade(form, status)

    try:
        run_learners(learner, CLIENTS, timeout=TIME_LIMIT_S + 30)
    finally:
        server.stop()

    sids, rows, undone = database_sids(database_url)
    server_errors = sum(count for status, count in traffic.statuses.items() if status >= 500)
    assert server_errors == 0, traffic.statuses
    assert sids == ledger.acknowledged  # every acknowledged review is there, and nothing else
    assert rows == len(ledger.acknowledged)  # exactly one row each
    assert undone == ledger.undos_acknowledged
    assert ledger.duplicates_injected > 10 and ledger.undo_races > 3 and rows > 50
    record_figures(tmp_path_factory.getbasetemp(), f"concurrency-{database_url.split(':')[0].split('+')[0]}", {
        "requests_sent": traffic.sent, "statuses": {str(k): v for k, v in sorted(traffic.statuses.items())},
        "clients": CLIENTS, "reviews_acknowledged": len(ledger.acknowledged), "log_rows": rows,
        "duplicates_injected": ledger.duplicates_injected, "undo_races": ledger.undo_races,
        "undos_acknowledged": ledger.undos_acknowledged, "conflicts_409": ledger.conflicts,
        "server_errors": server_errors, "reviews_lost": len(ledger.acknowledged - sids),
    })


CRASHES = 3


def test_kill_9_under_load_loses_no_acknowledged_review(database_url, tmp_path, tmp_path_factory):
    server = ServerProcess(tmp_path, database_url, write_load_bank(tmp_path / "bank"))
    traffic, ledger = Traffic(), Ledger()
    rng = random.Random(1)
    cards: dict[int, int] = {}
    try:
        for _ in range(CRASHES):
            url = server.start()  # a restart after a crash: migrations, bank sync, then serving
            cards = cards or answers(database_url)
            stop, killing = threading.Event(), threading.Event()

            def learner(number: int, url=url, stop=stop, killing=killing, cards=cards) -> None:
                local = random.Random(number + rng.random())
                try:
                    client = Client(url, traffic)
                    while not stop.is_set():
                        card_id = local.choice(list(cards))
                        form = shown_grade_form(client, card_id, cards[card_id], local)
                        if form is None:
                            continue
                        ledger.note_grade(form, client.request("POST", "/study/grade", form)[0])
                        if local.random() < 0.2:
                            ledger.note_grade(form, client.request("POST", "/study/grade", form)[0])
                            with ledger.lock:
                                ledger.duplicates_injected += 1
                except (OSError, http.client.HTTPException) as error:  # no answer came
                    if not killing.is_set():
                        raise AssertionError(f"the server died before the planned kill: {error!r}\n{server.log()}") from None
                    with ledger.lock:
                        ledger.unanswered += 1

            def crash(alive, stop=stop, killing=killing) -> None:
                # Load until a random number of further reviews is acknowledged, then kill mid-stream.
                target = len(ledger.acknowledged) + rng.randint(10, 30)
                wait_for(lambda: len(ledger.acknowledged) >= target or not alive(), 60, "reviews acknowledged under load")
                killing.set()
                server.kill()
                stop.set()

            run_learners(learner, CLIENTS, timeout=30, while_running=crash)

            sids, _, undone = database_sids(database_url)  # SQLite recovers its WAL on this first open
            assert ledger.acknowledged <= sids, sorted(ledger.acknowledged - sids)[:5]
            assert undone == 0
        url = server.start()  # and once more: it serves, and the history is all there
        Client(url, traffic)
    finally:
        server.stop()

    sids, rows, _ = database_sids(database_url)
    server_errors = sum(count for status, count in traffic.statuses.items() if status >= 500)
    assert ledger.acknowledged <= sids and rows == len(sids)
    assert server_errors == 0, traffic.statuses
    assert len(ledger.acknowledged) >= 10 * CRASHES  # real load at each kill
    record_figures(tmp_path_factory.getbasetemp(), f"crash-{database_url.split(':')[0].split('+')[0]}", {
        "crashes_survived": server.starts - 1, "requests_sent": traffic.sent,
        "statuses": {str(k): v for k, v in sorted(traffic.statuses.items())}, "server_errors": server_errors,
        "reviews_acknowledged": len(ledger.acknowledged), "log_rows": rows,
        "requests_cut_off_by_kill": ledger.unanswered, "committed_but_unanswered": len(sids - ledger.acknowledged),
        "duplicates_injected": ledger.duplicates_injected,
        "reviews_lost": len(ledger.acknowledged - sids),
    })
