"""The stats page (/stats: card states, histograms, retention, calendar, time, forecast, mastery by
topic) at 1,000,000 review-log rows over the time at 1,000, both on a 100,000-card collection.

The learner reviews about 274 cards a day, so 1k rows are four days of history and 1M rows ten
years: the page reads a year of per-day aggregates and the card table, never the whole log.
The log is built in one INSERT ... SELECT over a recursive counter, so 1M rows take seconds.
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from sqlalchemy import insert, text
from sqlmodel import Session

from benchmarks.figure import Figure
from studyapp.db import make_engine, upgrade_schema
from studyapp.models import Card, Deck
from studyapp.study import StudySettings, study_day

CARDS = 100_000
BIG, SMALL = 1_000_000, 1_000
PER_DAY = 274  # ~1M reviews in ten years
ROUNDS = 7  # interleaved, so drift on a shared machine hits both alike
NOW = datetime(2026, 3, 2, 12, tzinfo=timezone.utc)
TODAY = study_day(NOW, StudySettings(timezone="UTC"))
TAGS = [["memory", "fsdp"], ["communication", "reduce-scatter"], ["optimizer-state", "zero"], ["memory", "zero"],
        ["all-gather", "fsdp"], ["prefetch", "overlap"], ["communication"], ["sharding", "zero"]]
LABS = ["what-fsdp-shards", "reduce-scatter-backward", "adam-optimizer-state", "prefetch-overlap"]


def build_database(path: Path, log_rows: int) -> str:
    url = f"sqlite:///{path}"
    engine = make_engine(url)
    upgrade_schema(engine)
    rng = random.Random(7)
    cards = []
    for i in range(CARDS):
        new = rng.random() < 0.15
        interval = rng.choice([1, 1, 2, 4, 6, 10, 15, 25, 40, 90, 200, 400])
        cards.append({
            "question_id": f"bench-{i}", "deck_id": "fsdp" if i % 2 else "zero", "position": i,
            "prompt": f"Question {i}?", "choices": ["right", "wrong"], "answer": 0, "explanation": "Because.",
            "why_wrong": ["", "no"], "lab": LABS[i % len(LABS)], "tags": TAGS[i % len(TAGS)],
            "content_hash": f"{i:064x}", "retired": False,
            "repetitions": 0 if new else rng.randint(0, 8), "easiness": 1.3 if new else round(rng.uniform(1.3, 2.9), 2),
            "interval": 0 if new else interval,
            "due_day": None if new else TODAY + timedelta(days=rng.randint(-5, interval)),
            "repeat_day": None, "last_reviewed_at": None, "version": 0,
        })
    with Session(engine) as session:
        session.add_all([Deck(id="fsdp", title="FSDP"), Deck(id="zero", title="ZeRO", position=1)])
        session.commit()
        for start in range(0, CARDS, 10_000):
            session.execute(insert(Card), cards[start:start + 10_000])
        session.commit()
    with engine.begin() as connection:
        connection.execute(text(
            """
            WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < :rows - 1)
            INSERT INTO reviewlog (card_id, submission_id, reviewed_at, study_day, quality, choice, correct,
                is_repeat, was_new, before_repetitions, before_easiness, before_interval,
                after_repetitions, after_easiness, after_interval, undone_at, duration_ms)
            SELECT (i * 7919) % :cards + 1, 'bench-' || i, day || ' 12:00:00.000000', day, q, 0, q >= 3,
                i % 10 = 0, i % 17 = 0, 2, 2.5, (i * 13) % 60, 3, 2.5, 15,
                CASE WHEN i % 50 = 0 THEN day || ' 12:01:00.000000' END, 2000 + (i * 37) % 20000
            FROM (SELECT i, date(:today, '-' || ((:rows - 1 - i) / :per_day) || ' days') AS day,
                         CASE WHEN i % 7 = 0 THEN 1 ELSE 3 + i % 3 END AS q FROM n)
            """
        ), {"rows": log_rows, "cards": CARDS, "today": TODAY.isoformat(), "per_day": PER_DAY})
    engine.dispose()
    return url


def _client(url: str, instance: Path):
    from studyapp import create_app

    app = create_app({"TESTING": True, "DATABASE_URL": url, "SECRET_KEY": "bench", "TIMEZONE": "UTC",
                      "CLOCK": lambda: NOW, "EXPORTS_DIR": str(instance / "exports")}, instance_path=str(instance))
    return app.test_client()


def _time_page(client) -> float:
    started = time.perf_counter()
    response = client.get("/stats")
    elapsed = time.perf_counter() - started
    assert response.status_code == 200, response.status_code
    return elapsed


def run() -> list[Figure]:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        started = time.perf_counter()
        big_url = build_database(folder / "big.sqlite3", BIG)
        built_s = time.perf_counter() - started
        small_url = build_database(folder / "small.sqlite3", SMALL)
        big, small = _client(big_url, folder / "big"), _client(small_url, folder / "small")
        _time_page(big), _time_page(small)  # warm the caches and the templates
        big_times, small_times = [], []
        for _ in range(ROUNDS):
            big_times.append(_time_page(big))
            small_times.append(_time_page(small))
        big_s, small_s = statistics.median(big_times), statistics.median(small_times)
    return [
        Figure(
            "stats page at 1,000,000 log rows / at 1,000 (100,000 cards)",
            big_s / small_s,
            "x",
            "<= 3",
            f"{big_s * 1000:.0f} ms against {small_s * 1000:.0f} ms (medians of {ROUNDS} interleaved rounds); "
            f"1M-row database built in {built_s:.1f} s",
        )
    ]
