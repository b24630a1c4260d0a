"""The daily review: which card comes next, grading it, and undoing the last grade.

A thin layer over `sm2`: the pure parts (study day, choice order, the schedule a grade
leads to) take their time as an argument; the rest reads and writes through a session
passed in. Every grade appends a ReviewLog row holding the card's schedule before and
after, so undo restores a card exactly and the log always replays to the card's state.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from functools import cached_property
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from sqlalchemy import bindparam, func, update
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlmodel import Session, select

from studyapp import sm2
from studyapp.db import DirectStatement, driver_transaction
from studyapp.models import Card, ReviewLog
from studyapp.sm2 import allowed_qualities


class SettingError(ValueError):
    """A setting the app cannot use: names the setting and what is wrong with it, and `source`, where it
    was set (the instance's config.py), when that is known. The command line says it in one line."""

    def __init__(self, setting: str, problem: str, source: str | None = None):
        self.setting, self.problem, self.source = setting, problem, source
        super().__init__(f"{source}: {setting} {problem}" if source else f"{setting} {problem}")

    def set_in(self, source: str) -> SettingError:
        return SettingError(self.setting, self.problem, source)


def _whole_number(config: Any, setting: str) -> int:
    """A count or an hour: an int, or text of one (never True, which int() takes for 1, nor 4.5, cut to 4)."""
    value = config[setting]
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            pass
    raise SettingError(setting, f"must be a whole number, got {value!r}")


@dataclass(frozen=True)
class StudySettings:
    new_per_day: int = 20  # new cards introduced per study day
    reviews_per_day: int = 200  # first-pass reviews of due cards per study day
    day_start_hour: int = 4  # the study day rolls over at this local hour (Anki's default)
    timezone: str | None = None  # IANA name such as "Europe/Berlin"; None: the system's own

    @classmethod
    def from_config(cls, config: Any) -> StudySettings:
        """Raises SettingError naming the first setting it cannot use."""
        timezone = config.get("TIMEZONE") or None
        if timezone is not None and not isinstance(timezone, str):
            raise SettingError("TIMEZONE", f"must be a time zone name such as 'Europe/Berlin', got {timezone!r}")
        return cls(
            new_per_day=_whole_number(config, "NEW_CARDS_PER_DAY"),
            reviews_per_day=_whole_number(config, "REVIEWS_PER_DAY"),
            day_start_hour=_whole_number(config, "DAY_START_HOUR"),
            timezone=timezone,
        )

    def __post_init__(self) -> None:
        if not 0 <= self.day_start_hour <= 23:
            raise SettingError("DAY_START_HOUR", f"must be 0..23, got {self.day_start_hour}")
        for setting, limit in (("NEW_CARDS_PER_DAY", self.new_per_day), ("REVIEWS_PER_DAY", self.reviews_per_day)):
            if limit < 0:
                raise SettingError(setting, f"is a daily limit and cannot be negative, got {limit}")
        if self.timezone:
            try:  # an unknown zone name is refused at start-up, not mid-review
                ZoneInfo(self.timezone)
            except (ZoneInfoNotFoundError, ValueError):  # ValueError: a path such as '../x' or '/etc/x'
                raise SettingError("TIMEZONE", f"{self.timezone!r} is not a time zone name (IANA, such as "
                                   "'Europe/Berlin')") from None


class ReviewRejected(ValueError):
    """A grade that cannot be applied; the message says why. `status` is the HTTP status."""

    status = 400

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


class ReviewConflict(ReviewRejected):
    """The card changed after it was shown (another tab, a concurrent undo)."""

    def __init__(self, message: str = "this card changed since it was shown (another tab?); reload and try again"):
        super().__init__(message, status=409)


class RepeatEnded(ReviewRejected):
    """A step-7 repeat graded after its study day rolled over (the page was open across it): the
    repeat ended with that day, so there is nothing to record."""

    def __init__(self, question_id: str, repeat_day: date):
        super().__init__(f"card {question_id}'s same-day repeat ended with the study day {repeat_day}; nothing was recorded")
        self.repeat_day = repeat_day


class AlreadyUndone(ReviewRejected):
    """The review an undo names was undone already: a resubmitted undo form, which changes nothing."""

    def __init__(self, log: ReviewLog):
        super().__init__(f"review {log.id} was already undone; nothing changed", status=409)
        self.log = log


# --- Pure parts -------------------------------------------------------------------------


def as_utc(now: datetime) -> datetime:
    """The form stored in the database: aware UTC. Refuses naive input, whose zone is a guess."""
    if now.tzinfo is None:
        raise ValueError("a time must be timezone-aware")
    return now.astimezone(timezone.utc)


def study_day(now: datetime, settings: StudySettings) -> date:
    """The learner's study day at `now`: the local date, rolling over at `day_start_hour`."""
    if now.tzinfo is None:
        raise ValueError("a time must be timezone-aware")
    local = now.astimezone(ZoneInfo(settings.timezone)) if settings.timezone else now.astimezone()
    return (local.replace(tzinfo=None) - timedelta(hours=settings.day_start_hour)).date()


def choice_order(card_id: int, day: date, count: int) -> list[int]:
    """Choice indices in display order: shuffled, but the same for a card all day (reloads agree)."""
    order = list(range(count))
    random.Random(f"{card_id}:{day.isoformat()}").shuffle(order)
    return order


@dataclass(frozen=True)
class Schedule:
    """The part of a card a grade changes."""

    repetitions: int
    easiness: float
    interval: int
    due_day: date | None
    repeat_day: date | None

    @classmethod
    def of(cls, card: Card) -> Schedule:
        return cls(card.repetitions, card.easiness, card.interval, card.due_day, card.repeat_day)

    @property
    def state(self) -> sm2.SM2State:
        return sm2.SM2State(self.repetitions, self.easiness, self.interval)


def schedule_after(before: Schedule, quality: int, is_repeat: bool, today: date) -> Schedule:
    """The schedule a grade leads to. A step-7 repeat only decides whether it comes back today."""
    repeat_day = today if sm2.needs_same_day_repeat(quality) else None
    if is_repeat:
        if not 0 <= quality <= 5:
            raise ValueError(f"quality must be an integer from 0 to 5, got {quality!r}")
        return Schedule(before.repetitions, before.easiness, before.interval, before.due_day, repeat_day)
    state = sm2.review(before.state, quality)
    return Schedule(state.repetitions, state.easiness, state.interval, today + timedelta(days=state.interval), repeat_day)


@dataclass(frozen=True)
class GradeOption:
    quality: int
    wording: str
    interval: int  # days until the card is next due
    again_today: bool  # step 7 brings it back this session


def grade_options(card: Card, correct: bool, today: date) -> list[GradeOption]:
    """The grades open to this answer, each with the interval it leads to."""
    is_repeat = card.repeat_day == today
    options = []
    for quality in allowed_qualities(correct):
        after = schedule_after(Schedule.of(card), quality, is_repeat, today)
        options.append(GradeOption(quality, sm2.QUALITY_WORDING[quality], after.interval, after.repeat_day == today))
    return options


def is_up_today(card: Card | Any, today: date) -> bool:
    """Whether the card may be graded today: new, due, or waiting for its step-7 repeat."""
    if card.retired:
        return False
    return card.repeat_day == today or card.due_day is None or card.due_day <= today


# --- The queue --------------------------------------------------------------------------


@dataclass(frozen=True)
class DayProgress:
    reviews_done: int  # first-pass reviews of cards seen before
    new_done: int  # new cards introduced
    repeats_done: int  # step-7 repeats


def day_progress(session: Session, today: date) -> DayProgress:
    rows = session.exec(
        select(ReviewLog.is_repeat, ReviewLog.was_new, func.count())
        .where(ReviewLog.study_day == today, ReviewLog.undone_at.is_(None))
        .group_by(ReviewLog.is_repeat, ReviewLog.was_new)
    ).all()
    reviews = new = repeats = 0
    for is_repeat, was_new, count in rows:
        if is_repeat:
            repeats += count
        elif was_new:
            new += count
        else:
            reviews += count
    return DayProgress(reviews, new, repeats)


def _live(deck_id: str | None):
    query = select(Card).where(Card.retired.is_(False))
    return query.where(Card.deck_id == deck_id) if deck_id else query


def next_card(session: Session, now: datetime, settings: StudySettings, deck_id: str | None = None) -> Card | None:
    """The next card to show: due reviews, then new cards (each within its daily limit),
    then the day's step-7 repeats. Each is one index range lookup."""
    today = study_day(now, settings)
    progress = day_progress(session, today)
    if progress.reviews_done < settings.reviews_per_day:
        card = session.exec(
            _live(deck_id).where(Card.due_day.is_not(None), Card.due_day <= today).order_by(Card.due_day, Card.position).limit(1)
        ).first()
        if card:
            return card
    if progress.new_done < settings.new_per_day:
        card = session.exec(_live(deck_id).where(Card.due_day.is_(None)).order_by(Card.position).limit(1)).first()
        if card:
            return card
    repeats = select(Card).where(Card.repeat_day == today, Card.retired.is_(False))
    if deck_id:
        repeats = repeats.where(Card.deck_id == deck_id)
    return session.exec(repeats.order_by(Card.last_reviewed_at).limit(1)).first()


# --- Grading and undo -------------------------------------------------------------------


# Built once and run on the driver's cursor (db.DirectStatement) in a driver transaction: grading is
# the app's hot path, and SQLAlchemy's per-call machinery costs more there than the statements themselves.
_CARD_TO_GRADE = DirectStatement(select(
    Card.id, Card.question_id, Card.choices, Card.answer, Card.retired, Card.repetitions, Card.easiness,
    Card.interval, Card.due_day, Card.repeat_day, Card.last_reviewed_at, Card.version,
).where(Card.id == bindparam("card_id")))
# Applies a grade only if the card is still at the version that was shown.
_ADVANCE_CARD = DirectStatement(
    update(Card)
    .where(Card.id == bindparam("card_id"), Card.version == bindparam("expected_version"))
    .values(
        repetitions=bindparam("new_repetitions"),
        easiness=bindparam("new_easiness"),
        interval=bindparam("new_interval"),
        due_day=bindparam("new_due_day"),
        repeat_day=bindparam("new_repeat_day"),
        last_reviewed_at=bindparam("new_last_reviewed_at"),
        version=bindparam("new_version"),
    )
)
_LOG_COLUMNS = [column.key for column in ReviewLog.__table__.columns if column.key != "id"]  # _review_log's keys
# RETURNING, on SQLite (3.35+) as on PostgreSQL: one way to learn the new row's id everywhere.
_APPEND_LOG = DirectStatement(ReviewLog.__table__.insert().returning(ReviewLog.__table__.c.id), _LOG_COLUMNS)


def submission_id(card_id: int, version: int) -> str:
    """One answer to one showing of a card: two tabs or a retry of the same showing share it."""
    return f"card{card_id}-v{version}"


@dataclass
class GradeResult:
    row: dict[str, Any]  # the review log row, as stored
    duplicate: bool  # the same submission was already recorded; nothing changed

    @cached_property
    def log(self) -> ReviewLog:
        """The row as a (detached) ReviewLog; built on demand, off the grading hot path."""
        return ReviewLog(**self.row)

    @classmethod
    def of(cls, log: ReviewLog, duplicate: bool) -> GradeResult:
        return cls(log.model_dump(), duplicate)


def _find_submission(session: Session, sid: str) -> ReviewLog | None:
    return session.exec(select(ReviewLog).where(ReviewLog.submission_id == sid)).first()


def _card_version(session: Session, card_id: int) -> int | None:
    return session.exec(select(Card.version).where(Card.id == card_id)).first()


def grade(
    session: Session,
    *,
    card_id: int,
    version: int,
    choice: int,
    quality: int,
    now: datetime,
    settings: StudySettings,
    duration_ms: int | None = None,
) -> GradeResult:
    """Record the learner's answer `choice` and grade `quality` for the card as shown at `version`
    (`duration_ms`: how long answering took, if known).

    The server decides correctness from the choice; a wrong answer takes 0..2, a right one 3..5.
    Submitting the same showing again returns the first result and changes nothing.

    The grade is one transaction of its own on the session's engine (db.driver_transaction: this is
    the app's hot path), committed before it returns; the session's loaded objects are then expired,
    so they load what it wrote. The session must hold no unsaved changes: they would not be part of it.
    """
    if session.new or session.dirty or session.deleted:
        raise RuntimeError("grade commits in a transaction of its own: commit or discard the session's changes first")
    sid = submission_id(card_id, version)
    today, reviewed_at = study_day(now, settings), as_utc(now)
    try:
        with driver_transaction(session.get_bind()) as connection:
            card = next(iter(_CARD_TO_GRADE.rows(connection, {"card_id": card_id})), None)
            if card is None:
                raise ReviewRejected(f"there is no card {card_id}", status=404)
            if card.version != version:
                raise ReviewConflict()  # versions only grow and every grade bumps one: maybe a repeat
            log = _review_log(card, sid, choice, quality, reviewed_at, today)
            log["duration_ms"] = duration_ms
            changed = _ADVANCE_CARD.rowcount(
                connection,
                {
                    "card_id": card_id,
                    "expected_version": version,
                    "new_repetitions": log["after_repetitions"],
                    "new_easiness": log["after_easiness"],
                    "new_interval": log["after_interval"],
                    "new_due_day": log["after_due_day"],
                    "new_repeat_day": log["after_repeat_day"],
                    "new_last_reviewed_at": log["reviewed_at"],
                    "new_version": version + 1,
                },
            )
            if changed != 1:
                raise ReviewConflict()
            (log_id,) = _APPEND_LOG.rows(connection, log)[0]
    except (ReviewConflict, IntegrityError, OperationalError) as error:
        # A repeat, or a lost race (rolled back): if it was this same submission, that one counts.
        if existing := _find_submission(session, sid):
            if existing.undone_at is not None:  # this showing's answer was taken back: it no longer counts
                raise ReviewConflict("that answer was undone, so it no longer counts; reload to answer the card again") from None
            return GradeResult.of(existing, duplicate=True)
        if isinstance(error, OperationalError) and _card_version(session, card_id) == version:
            # Nothing else wrote the card, so no race was lost: the database refused the write (full,
            # read-only, locked past its busy timeout), which the app answers with a 503.
            raise
        raise ReviewConflict() from None
    finally:
        session.expire_all()
    return GradeResult({**log, "id": log_id}, duplicate=False)


def _review_log(card, sid: str, choice: int, quality: int, reviewed_at: datetime, today: date) -> dict:
    """The log row for this grade, checked: the choice exists, the grade fits the answer, the card is up."""
    if not 0 <= choice < len(card.choices):
        raise ReviewRejected(f"choice must be from 0 to {len(card.choices) - 1}, got {choice}")
    correct = choice == card.answer
    if problem := sm2.misgraded(correct, quality):
        raise ReviewRejected(problem)
    if not is_up_today(card, today):
        if not card.retired and card.repeat_day is not None and card.repeat_day < today:
            raise RepeatEnded(card.question_id, card.repeat_day)
        why = "is retired" if card.retired else f"is not due until {card.due_day}"
        raise ReviewRejected(f"card {card.question_id} {why}")
    is_repeat = card.repeat_day == today
    before = Schedule(card.repetitions, card.easiness, card.interval, card.due_day, card.repeat_day)
    after = schedule_after(before, quality, is_repeat, today)
    return {
        "card_id": card.id,
        "submission_id": sid,
        "reviewed_at": reviewed_at,
        "study_day": today,
        "quality": quality,
        "choice": choice,
        "correct": correct,
        "is_repeat": is_repeat,
        "was_new": card.due_day is None and not is_repeat,
        "before_repetitions": before.repetitions,
        "before_easiness": before.easiness,
        "before_interval": before.interval,
        "before_due_day": before.due_day,
        "before_repeat_day": before.repeat_day,
        "before_last_reviewed_at": card.last_reviewed_at,
        "after_repetitions": after.repetitions,
        "after_easiness": after.easiness,
        "after_interval": after.interval,
        "after_due_day": after.due_day,
        "after_repeat_day": after.repeat_day,
        "undone_at": None,
        "duration_ms": None,
    }


def last_live_review(session: Session, deck_id: str | None = None) -> ReviewLog | None:
    """The latest review not yet undone, of a card in `deck_id` when given (a one-deck session's)."""
    query = select(ReviewLog).where(ReviewLog.undone_at.is_(None))
    if deck_id:
        # Walked back from the log's newest row to the deck's first live one (EXISTS keeps that plan; a
        # join is planned from the deck's cards and sorts all their reviews: 0.5 s at 1M), and only once
        # a join from the deck's cards has found it has one: a deck never reviewed would walk the whole log.
        any_in_deck = (select(ReviewLog.id).join(Card, Card.id == ReviewLog.card_id)
                       .where(Card.deck_id == deck_id, ReviewLog.undone_at.is_(None)).limit(1))
        if session.exec(any_in_deck).first() is None:
            return None
        query = query.where(select(Card.id).where(Card.id == ReviewLog.card_id, Card.deck_id == deck_id).exists())
    return session.exec(query.order_by(ReviewLog.id.desc()).limit(1)).first()


def undo_last(
    session: Session, now: datetime, review_id: int | None = None, deck_id: str | None = None
) -> ReviewLog | None:
    """Undo the latest review not yet undone (of a card in `deck_id` when given: a one-deck session
    undoes its own reviews, not a newer one of another deck): its card gets its schedule back exactly
    and the log row is marked undone (never deleted). Returns that row, or None when there is none.

    `review_id` (what the undo form offered) makes a resubmitted undo change nothing: unless that
    review is the latest live one, it raises AlreadyUndone (it was undone before) or ReviewConflict
    (a newer review came after it), and undoes nothing."""
    log = last_live_review(session, deck_id)
    if review_id is not None and (log is None or log.id != review_id):
        named = session.get(ReviewLog, review_id)
        if named is None:
            raise ReviewRejected(f"there is no review {review_id}", status=404)
        if named.undone_at is not None:
            raise AlreadyUndone(named)
        raise ReviewConflict("a newer review came after the one it offered to undo, so nothing was undone")
    if log is None:
        return None
    card = session.get(Card, log.card_id)
    newer = session.exec(
        select(ReviewLog.id).where(ReviewLog.card_id == log.card_id, ReviewLog.undone_at.is_(None), ReviewLog.id > log.id)
    ).first()
    if card is None or newer is not None:
        raise ReviewConflict("another review arrived meanwhile, so nothing was undone")
    card_id, read_version = card.id, card.version  # as read: a rollback expires `card`
    try:
        changed = session.execute(
            update(Card)
            .where(Card.id == card.id, Card.version == card.version)
            .values(
                repetitions=log.before_repetitions,
                easiness=log.before_easiness,
                interval=log.before_interval,
                due_day=log.before_due_day,
                repeat_day=log.before_repeat_day,
                last_reviewed_at=log.before_last_reviewed_at,
                version=card.version + 1,
            )
        ).rowcount
        marked = session.execute(
            update(ReviewLog).where(ReviewLog.id == log.id, ReviewLog.undone_at.is_(None)).values(undone_at=as_utc(now))
        ).rowcount
        if changed != 1 or marked != 1:
            raise ReviewConflict("another review or undo arrived meanwhile, so nothing was undone")
        session.commit()
    except (ReviewConflict, OperationalError) as error:
        session.rollback()
        if review_id is not None and (named := session.get(ReviewLog, review_id)) and named.undone_at is not None:
            raise AlreadyUndone(named) from None  # the same undo, posted twice at once: the other one did it
        if isinstance(error, OperationalError) and _card_version(session, card_id) == read_version:
            raise  # nothing else wrote the card: the database refused the write (see grade)
        raise ReviewConflict("another review or undo arrived meanwhile, so nothing was undone") from None
    finally:
        session.expire_all()
    return session.get(ReviewLog, log.id)


def replayed_schedule(session: Session, card_id: int) -> sm2.SM2State:
    """The state a card's live, non-repeat review log replays to (what its state must equal)."""
    qualities = session.exec(
        select(ReviewLog.quality)
        .where(ReviewLog.card_id == card_id, ReviewLog.undone_at.is_(None), ReviewLog.is_repeat.is_(False))
        .order_by(ReviewLog.id)
    ).all()
    return sm2.replay(list(qualities))
