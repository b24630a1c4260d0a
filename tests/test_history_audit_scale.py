"""History audit: an import's queries do not grow with the number of cards it touches (a query
per card made 100,000 reviews of 100,000 cards take over two minutes to import)."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

from conftest import T0
from sqlalchemy import event
from sqlmodel import Session, select

from studyapp.db import get_engine
from studyapp.history import FIELD_NAMES, import_history, parse_history, render_history
from studyapp.models import Card
from studyapp.study import Schedule, schedule_after
from studyapp.sync import sync_bank

QUESTIONS = 50
REVIEWS_PER_CARD = 2


def many_questions_bank(folder):
    folder.mkdir()
    questions = "".join(f"""\
  - id: many-{i}
    prompt: Question {i}?
    choices:
      - text: Right
        correct: true
      - text: Wrong
        why_wrong: Because.
    explanation: Because.
    lab: what-fsdp-shards
    tags: [fsdp]
""" for i in range(QUESTIONS))
    (folder / "many.yaml").write_text(f"id: many\ntitle: Many\nquestions:\n{questions}", encoding="utf-8")
    return folder


def history_of(cards: list[Card]) -> str:
    """Each card graded 4, REVIEWS_PER_CARD times a day apart, as SM-2 schedules it: the same shape for every card."""
    rows = []
    for card in cards:
        before, last, when = Schedule(0, 2.5, 0, None, None), None, T0
        for k in range(REVIEWS_PER_CARD):
            after = schedule_after(before, 4, False, when.date())
            rows.append({
                "submission_id": f"card{card.id}-v{k}", "question_id": card.question_id, "deck_id": card.deck_id,
                "reviewed_at": when, "study_day": when.date(), "quality": 4, "choice": 0, "choice_text": "Right",
                "correct": True, "is_repeat": False, "was_new": k == 0, "undone": False, "undone_at": None,
                "duration_ms": 1000, "before_last_reviewed_at": last,
                **{f"before_{name}": getattr(before, name) for name in ("repetitions", "easiness", "interval", "due_day", "repeat_day")},
                **{f"after_{name}": getattr(after, name) for name in ("repetitions", "easiness", "interval", "due_day", "repeat_day")},
            })
            before, last, when = after, when, when + timedelta(days=after.interval)
    return render_history([{name: row[name] for name in FIELD_NAMES} for row in rows], "csv")


def test_an_import_takes_as_many_queries_for_40_cards_as_for_5(app, tmp_path):
    engine = get_engine(app)
    sync_bank(engine, many_questions_bank(tmp_path / "bank-many"))
    with Session(engine) as session:
        cards = session.exec(select(Card).where(Card.deck_id == "many").order_by(Card.id)).all()
    statements: list[str] = []

    def count(_conn, _cursor, statement, *_args) -> None:
        statements.append(statement)

    def statements_to_import(some: list[Card]) -> int:
        records = parse_history(history_of(some), "h.csv")
        statements.clear()
        event.listen(engine, "before_cursor_execute", count)
        try:
            report = import_history(engine, records)
        finally:
            event.remove(engine, "before_cursor_execute", count)
        assert (report.imported, report.cards) == (len(some) * REVIEWS_PER_CARD, len(some))
        return len(statements)

    few, many = statements_to_import(cards[:5]), statements_to_import(cards[5:45])
    assert many == few, (f"{few} statements for 5 cards, {many} for 40", Counter(s.split()[0] + " " + s.split()[2] for s in statements))
    assert many < 40
