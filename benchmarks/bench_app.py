"""The study app under load, measured side by side in one run:

(a) review-submit throughput on a 100,000-card deck, as a ratio to a bare Flask endpoint
    served by the same server process (same WSGI stack, CSRF check and HTTP client); beside it,
    as its floor, the bare endpoint plus nothing but the durable write a grade makes;
(b) the time to fetch the next due card at 100,000 cards over the time at 1,000 cards
    (an index lookup stays flat; a scan would grow 100x).
"""

from __future__ import annotations

import http.client
import multiprocessing
import random
import statistics
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from urllib.parse import urlencode

from sqlalchemy import insert
from sqlmodel import Session

from benchmarks.figure import Figure
from studyapp import sm2
from studyapp.db import make_engine, upgrade_schema
from studyapp.models import Card, Deck, ReviewLog
from studyapp.study import StudySettings, next_card, study_day

BIG, SMALL = 100_000, 1_000
SUBMITS_PER_ROUND, ROUNDS = 100, 9  # interleaved, so drift on a shared machine hits both alike
FLOOR_CARDS = 50_000  # the floor's writes go to cards from here on, away from the submits' cards
FETCHES = 400
NOW = datetime(2026, 3, 2, 12, tzinfo=timezone.utc)
SETTINGS = StudySettings(timezone="UTC")
TODAY = study_day(NOW, SETTINGS)


def build_database(path: Path, cards: int) -> str:
    """A deck of `cards` cards: a fifth new, the rest reviewed and due from 30 days ago to 60 ahead,
    the first SUBMITS_PER_ROUND x ROUNDS of them due today; plus a day's worth of review log."""
    url = f"sqlite:///{path}"
    engine = make_engine(url)
    upgrade_schema(engine)
    rng = random.Random(cards)
    rows = []
    for i in range(cards):
        due_now = i < SUBMITS_PER_ROUND * ROUNDS
        new = not due_now and rng.random() < 0.2
        rows.append({
            "question_id": f"bench-{i}", "deck_id": "bench", "position": i,
            "prompt": f"Question {i}?", "choices": ["right", "wrong a", "wrong b", "wrong c"], "answer": 0,
            "explanation": "Because.", "why_wrong": ["", "no", "no", "no"], "lab": "what-fsdp-shards", "tags": ["bench"],
            "content_hash": f"{i:064x}", "retired": False,
            "repetitions": 0 if new else 2, "easiness": sm2.INITIAL_EASINESS, "interval": 0 if new else 6,
            "due_day": None if new else TODAY - timedelta(days=0 if due_now else rng.randint(-60, 30)),
            "repeat_day": None, "last_reviewed_at": None, "version": 0,
        })
    with Session(engine) as session:
        session.add(Deck(id="bench", title="Benchmark deck"))
        session.commit()
        for start in range(0, len(rows), 10_000):
            session.execute(insert(Card), rows[start:start + 10_000])
        logs = [{
            "card_id": cards - j, "submission_id": f"seed-{j}", "reviewed_at": NOW, "study_day": TODAY, "quality": 4,
            "choice": 0, "correct": True, "is_repeat": False, "was_new": False,
            "before_repetitions": 2, "before_easiness": 2.5, "before_interval": 6,
            "after_repetitions": 3, "after_easiness": 2.5, "after_interval": 15,
        } for j in range(50)]
        session.execute(insert(ReviewLog), logs)
        session.commit()
    engine.dispose()
    return url


# The floor's write: what a grade writes (read the card, advance it, append its log row), in SQL.
FLOOR_READ = "SELECT id, choices, answer, repetitions, easiness, interval, due_day, version FROM card WHERE id = ?"
FLOOR_ADVANCE = ("UPDATE card SET repetitions = ?, easiness = ?, interval = ?, due_day = ?, repeat_day = ?, "
                 "last_reviewed_at = ?, version = version + 1 WHERE id = ?")
FLOOR_LOG = (
    "INSERT INTO reviewlog (card_id, submission_id, reviewed_at, study_day, quality, choice, correct, is_repeat, "
    "was_new, before_repetitions, before_easiness, before_interval, before_due_day, before_repeat_day, "
    "before_last_reviewed_at, after_repetitions, after_easiness, after_interval, after_due_day, after_repeat_day, "
    "undone_at, duration_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id"
)


def _serve(database_url: str, instance: str, port_queue) -> None:
    """The server process: the study app plus a bare endpoint and the floor's endpoint, on the server
    `studyapp serve` runs (waitress; its access log off, for all alike)."""
    import itertools

    from flask import request

    from studyapp import create_app
    from studyapp.cli.serve import make_server
    from studyapp.db import get_engine

    app = create_app({"DATABASE_URL": database_url, "SECRET_KEY": "bench", "TIMEZONE": "UTC", "CLOCK": lambda: NOW},
                     instance_path=instance)

    @app.post("/bench/bare")
    def bare():
        return request.form.get("quality", "")

    floor_cards = itertools.count(FLOOR_CARDS)

    @app.post("/bench/write")
    def write():
        """The bare endpoint plus the durable write a grade makes, straight on the driver's connection
        (the app's pooled one) and committed: no app code, no SQLAlchemy. The floor of a submit."""
        card_id = next(floor_cards)
        now, day = NOW.strftime("%Y-%m-%d %H:%M:%S.%f"), TODAY.isoformat()
        connection = get_engine().raw_connection()
        try:
            cursor = connection.cursor()
            cursor.execute(FLOOR_READ, (card_id,)).fetchone()
            cursor.execute(FLOOR_ADVANCE, (3, 2.6, 15, day, None, now, card_id))
            cursor.execute(FLOOR_LOG, (card_id, f"floor-{card_id}", now, day, 5, 0, True, False, False, 2, 2.5, 6,
                                       day, None, None, 3, 2.6, 15, day, None, None, None)).fetchone()
            connection.commit()
        finally:
            connection.close()
        return request.form.get("quality", "")

    @app.get("/bench/token")
    def token():
        from studyapp.csrf import csrf_token

        return csrf_token()

    server = make_server(app, "127.0.0.1", 0, access_log=False)
    port_queue.put(server.port)
    server.serve_forever()


def _post(port: int, path: str, body: dict, cookie: str) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request("POST", path, urlencode(body), {"Content-Type": "application/x-www-form-urlencoded", "Cookie": cookie})
    response = connection.getresponse()
    response.read()
    connection.close()
    return response.status


def submit_throughput(folder: Path) -> list[tuple[float, float, float]]:
    """Requests per second of (review submits, bare endpoint, the floor) for each round, interleaved."""
    url = build_database(folder / "big.sqlite3", BIG)
    context = multiprocessing.get_context("spawn")
    ports = context.Queue()
    server = context.Process(target=_serve, args=(url, str(folder / "instance"), ports), daemon=True)
    server.start()
    try:
        port = ports.get(timeout=120)
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        connection.request("GET", "/bench/token")
        response = connection.getresponse()
        token = response.read().decode()
        cookie = response.getheader("Set-Cookie").split(";")[0]
        rounds = []
        card_id = 1
        for _ in range(ROUNDS):
            started = time.perf_counter()
            for _ in range(SUBMITS_PER_ROUND):
                body = {"csrf_token": token, "card_id": card_id, "version": 0, "choice": 0, "quality": 5}
                assert _post(port, "/study/grade", body, cookie) == 302
                card_id += 1
            submit_rate = SUBMITS_PER_ROUND / (time.perf_counter() - started)
            started = time.perf_counter()
            for _ in range(SUBMITS_PER_ROUND):
                body = {"csrf_token": token, "card_id": card_id, "version": 0, "choice": 0, "quality": 5}
                assert _post(port, "/bench/bare", body, cookie) == 200
            bare_rate = SUBMITS_PER_ROUND / (time.perf_counter() - started)
            started = time.perf_counter()
            for _ in range(SUBMITS_PER_ROUND):
                body = {"csrf_token": token, "card_id": card_id, "version": 0, "choice": 0, "quality": 5}
                assert _post(port, "/bench/write", body, cookie) == 200
            rounds.append((submit_rate, bare_rate, SUBMITS_PER_ROUND / (time.perf_counter() - started)))
        _check_every_write_stored(url, graded=card_id - 1)
        return rounds
    finally:
        server.terminate()
        server.join(timeout=10)


def _check_every_write_stored(url: str, graded: int) -> None:
    """A write that was never committed would be cheap: hold each timed one to a stored review row."""
    engine = make_engine(url)
    with engine.connect() as connection:
        grades = connection.exec_driver_sql("SELECT count(*) FROM reviewlog WHERE submission_id LIKE 'card%'").scalar_one()
        floors = connection.exec_driver_sql("SELECT count(*) FROM reviewlog WHERE submission_id LIKE 'floor-%'").scalar_one()
    engine.dispose()
    expected = SUBMITS_PER_ROUND * ROUNDS
    if (grades, floors) != (graded, expected):
        raise RuntimeError(f"the database holds {grades} grades and {floors} floor writes, not {graded} and {expected}")


def fetch_time(url: str) -> float:
    """Median seconds for next_card on this database."""
    engine = make_engine(url)
    times = []
    with Session(engine) as session:
        for _ in range(FETCHES):
            started = time.perf_counter()
            card = next_card(session, NOW, SETTINGS)
            times.append(time.perf_counter() - started)
            assert card is not None
    engine.dispose()
    return statistics.median(times)


def run() -> list[Figure]:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        rounds = submit_throughput(folder)
        # Fresh databases for (b): the one the server wrote to would time its WAL, not the index.
        small_url = build_database(folder / "small.sqlite3", SMALL)
        big_url = build_database(folder / "big-fetch.sqlite3", BIG)
        fetch_time(small_url), fetch_time(big_url)  # warm caches
        small, big = [], []
        for _ in range(3):
            small.append(fetch_time(small_url))
            big.append(fetch_time(big_url))
    small_s, big_s = min(small), min(big)
    # The median of the per-round ratios: a burst of load from elsewhere spoils a round, not the figure.
    ratio = statistics.median(submit / bare for submit, bare, _ in rounds)
    submits = statistics.median(submit for submit, _, _ in rounds)
    bare = statistics.median(bare for _, bare, _ in rounds)
    floor_ratio = statistics.median(write / bare for _, bare, write in rounds)
    writes = statistics.median(write for _, _, write in rounds)
    return [
        Figure(
            "app: review submits/s on 100k cards / bare Flask endpoint",
            ratio,
            "x",
            ">= 0.8",
            f"median of {ROUNDS} interleaved rounds of {SUBMITS_PER_ROUND}: {submits:.0f} submits/s against "
            f"{bare:.0f} bare requests/s on the same server; floor: the bare endpoint plus only a grade's "
            f"committed write, on the driver, {writes:.0f}/s ({floor_ratio:.2f}x)",
        ),
        Figure(
            "app: next-due-card fetch, 100k cards / 1k cards",
            big_s / small_s,
            "x",
            "<= 1.5",
            f"{big_s * 1e6:.0f} us at {BIG:,} cards against {small_s * 1e6:.0f} us at {SMALL:,} (median of {FETCHES})",
        ),
    ]
