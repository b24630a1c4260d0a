"""The review log in and out of the database: every review as history rows, and importing them.

Import adds only the reviews not yet present (same submission id: skipped, so importing twice
changes nothing) and writes nothing if any review cannot belong in this database. After an import
every card's schedule equals the replay of its log, as after a review.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Row
from sqlalchemy import select as sa_select
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from studyapp import sm2
from studyapp.history.format import (
    FIELD_NAMES,
    LOG_COLUMNS,
    SCHEDULE_FIELDS,
    SUBMISSION_ID,
    HistoryError,
    Record,
    describe_schedule,
    schedule_of,
    shown,
)
from studyapp.models import Card, ReviewLog
from studyapp.study import Schedule, schedule_after

# --- Export -----------------------------------------------------------------------------


def history_rows(engine: Engine) -> list[dict[str, Any]]:
    """Every review ever logged (undone ones included), oldest first, as FIELDS-keyed dicts."""
    with Session(engine) as session:
        pairs = session.exec(select(ReviewLog, Card).join(Card, Card.id == ReviewLog.card_id).order_by(ReviewLog.id)).all()
    rows = []
    for log, card in pairs:
        row = {name: getattr(log, name) for name in LOG_COLUMNS}
        choice_text = card.choices[log.choice] if 0 <= log.choice < len(card.choices) else None
        row.update(question_id=card.question_id, deck_id=card.deck_id, choice_text=choice_text, undone=log.undone_at is not None)
        rows.append({name: row[name] for name in FIELD_NAMES})
    return rows


# --- Import -----------------------------------------------------------------------------


@dataclass
class ImportReport:
    imported: int
    already_present: int
    cards: int

    def summary(self) -> str:
        return f"imported {self.imported} reviews ({self.already_present} already present) for {self.cards} cards"


def import_history(engine: Engine, records: list[Record]) -> ImportReport:
    """Add the reviews not yet present and set each touched card's schedule from its log, in one
    transaction that is rolled back (HistoryError) if any review cannot belong in this database."""
    with Session(engine) as session:
        try:
            return _import(session, records)
        except HistoryError:
            session.rollback()
            raise


def _import(session: Session, records: list[Record]) -> ImportReport:
    cards = {card.question_id: card for card in session.exec(select(Card)).all()}
    existing = {log.submission_id: log for log in _log_rows(session)}
    problems: list[str] = []
    new_rows: list[tuple[Card, dict[str, Any]]] = []
    for record in records:
        values = record.values
        card = cards.get(values["question_id"])
        if card is None:
            problems.append(f"{record.where}: field 'question_id': no card '{values['question_id']:.60}' in this "
                            "database; sync the bank it came from first (`studyapp bank sync`)")
            continue
        # A choice the bank has since dropped exports without its text: only a named choice must exist.
        if values["choice_text"] is not None and values["choice"] >= len(card.choices):
            problems.append(f"{record.where}: field 'choice': card {card.question_id} has {len(card.choices)} choices, got {values['choice']}")
            continue
        present = existing.get(values["submission_id"])
        if present is None:
            new_rows.append((card, values))
        elif (present.card_id, present.quality, present.reviewed_at) != (card.id, values["quality"], values["reviewed_at"]):
            problems.append(f"{record.where}: field 'submission_id': '{values['submission_id']}' is already in this "
                            "database as a different review")
    in_file = {record.values["submission_id"] for record in records}
    touched = {card.id: card for card, _ in new_rows}
    for log in existing.values():
        if log.card_id in touched and log.submission_id not in in_file:
            problems.append(f"card {touched[log.card_id].question_id}: the database has review {log.submission_id}, "
                            "which the file lacks; import into an empty database or the one the file came from")
            touched.pop(log.card_id)
    if not problems:
        problems.extend(_chain_problems((record.where, record.values) for record in records))
    if problems:
        raise HistoryError(problems)

    if new_rows:  # a table insert is one executemany; ORM inserts went one a row (each fetching its id)
        session.connection().execute(ReviewLog.__table__.insert(), [
            {"card_id": card.id, **{name: values[name] for name in LOG_COLUMNS}} for card, values in new_rows])
    _bump_versions(session, in_file, touched)
    logs = _logs_by_card(session, set(touched))
    for card in touched.values():
        _restore_schedule(session, card, logs[card.id])
    session.flush()
    session.expire_all()  # what follows reads back what the database now holds
    if problems := _stored_problems(session, touched):
        raise HistoryError(problems)
    session.commit()
    return ImportReport(len(new_rows), len(records) - len(new_rows), len(touched))


# A card never reviewed: its schedule, and no last review time.
NEW_CARD_SCHEDULE = (Schedule(sm2.NEW_CARD.repetitions, sm2.NEW_CARD.easiness, sm2.NEW_CARD.interval, None, None), None)


def _chain_problems(reviews: Iterable[tuple[str, dict[str, Any]]]) -> list[str]:
    """Each card's live reviews must follow on: each starts from the whole schedule the one before
    left (repetitions, easiness, interval, due day, repeat day) and from its review time; a card's
    first from a new card's. A gap (such as a dropped same-day repeat) means a review is missing."""
    problems = []
    left: dict[str, tuple[Schedule, datetime | None]] = {}
    for where, values in reviews:
        if values["undone"]:
            continue
        question = values["question_id"]
        schedule, last_reviewed_at = expected = left.get(question, NEW_CARD_SCHEDULE)
        before = (schedule_of(values, "before"), values["before_last_reviewed_at"])
        if before != expected:
            wrong = [f"before_{name}" for name in SCHEDULE_FIELDS if getattr(before[0], name) != getattr(schedule, name)]
            wrong += ["before_last_reviewed_at"] if before[1] != last_reviewed_at else []
            problems.append(f"{where}: fields 'before_*' ({', '.join(wrong)}): card {question}'s previous review left "
                            f"{describe_schedule(schedule)}, last reviewed {shown(last_reviewed_at)}, but this one "
                            f"starts from {describe_schedule(before[0])}, last reviewed {shown(before[1])} "
                            "(a review is missing?)")
        left[question] = (schedule_of(values, "after"), values["reviewed_at"])
    return problems


def _stored_problems(session: Session, touched: dict[int, Card]) -> list[str]:
    """The import's result, read back: each touched card's live log, in the database's order,
    chains and replays through SM-2 (grade by grade from a new card) to the card's whole schedule."""
    problems = []
    session.exec(select(Card)).all()  # each expired card reloaded in one query, not one query each
    logs_by_card = _logs_by_card(session, set(touched))
    for card in touched.values():
        logs = [log for log in logs_by_card[card.id] if log.undone_at is None]
        rows = [(f"card {card.question_id}: review {log.submission_id}",
                 {**{name: getattr(log, name) for name in LOG_COLUMNS}, "question_id": card.question_id, "undone": False})
                for log in logs]
        problems.extend(_chain_problems(rows))
        replayed, last_reviewed_at = NEW_CARD_SCHEDULE
        for log in logs:
            replayed, last_reviewed_at = schedule_after(replayed, log.quality, log.is_repeat, log.study_day), log.reviewed_at
        if (Schedule.of(card), card.last_reviewed_at) != (replayed, last_reviewed_at):
            problems.append(f"card {card.question_id}: its reviews replay through SM-2 to {describe_schedule(replayed)}, "
                            f"last reviewed {shown(last_reviewed_at)}, not to the last review's "
                            f"{describe_schedule(Schedule.of(card))} (the file was edited?)")
    return problems


def _log_rows(session: Session) -> Iterable[Row]:
    """The whole log in the database's order, as plain rows: a fraction of ORM objects' memory."""
    return session.connection().execute(sa_select(ReviewLog.__table__).order_by(ReviewLog.id))


def _logs_by_card(session: Session, card_ids: set[int]) -> dict[int, list[Row]]:
    """Each of these cards' whole log, in the database's order, read in one query (a query per card
    took over two minutes to import 100,000 reviews of 100,000 cards)."""
    logs: dict[int, list[Row]] = defaultdict(list)
    for log in _log_rows(session):
        if log.card_id in card_ids:
            logs[log.card_id].append(log)
    return logs


def _restore_schedule(session: Session, card: Card, logs: list[Row]) -> None:
    """The card's schedule after its latest live review; before its first, if all were undone."""
    live = [log for log in logs if log.undone_at is None]
    if live:
        last = live[-1]
        card.repetitions, card.easiness, card.interval = last.after_repetitions, last.after_easiness, last.after_interval
        card.due_day, card.repeat_day, card.last_reviewed_at = last.after_due_day, last.after_repeat_day, last.reviewed_at
    else:
        first = logs[0]
        card.repetitions, card.easiness, card.interval = first.before_repetitions, first.before_easiness, first.before_interval
        card.due_day, card.repeat_day = first.before_due_day, first.before_repeat_day
        card.last_reviewed_at = first.before_last_reviewed_at
    session.add(card)


def _bump_versions(session: Session, submission_ids: set[str], touched: dict[int, Card]) -> None:
    """Keep every card's next submission id unused. Imported ids embed the source database's card
    ids (`card{id}-v{version}`), which may name other cards here: each card's version moves past
    any imported id naming it. A card whose schedule changes gets a new version too (stale forms)."""
    highest: dict[int, int] = defaultdict(lambda: -1)
    for sid in submission_ids:
        card_number, version = map(int, SUBMISSION_ID.fullmatch(sid).groups())
        highest[card_number] = max(highest[card_number], version)
    for card in session.exec(select(Card)).all():
        version = max(card.version + (1 if card.id in touched else 0), highest[card.id] + 1)
        if version != card.version:
            card.version = version
            session.add(card)
