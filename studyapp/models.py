"""The database tables: decks and cards synced from the bank, the review log, lab runs.

Times are aware UTC datetimes (SQLModel refuses naive ones; PostgreSQL stores timestamptz,
SQLite UTC without an offset), study days are dates in the learner's own day (see
`study.study_day`).
"""

from __future__ import annotations

from datetime import date, datetime
from enum import Enum
from typing import Any

from sqlalchemy import JSON, Column, Index, text
from sqlmodel import Field, SQLModel

from studyapp import sm2


class Deck(SQLModel, table=True):
    id: str = Field(primary_key=True)  # the bank's stable deck id
    title: str
    description: str = ""
    position: int = 0  # order of the deck file in bank/
    retired: bool = False  # its file left the bank; cards kept with their history


class Card(SQLModel, table=True):
    """One bank question: a copy of its content and the learner's SM-2 state."""

    __table_args__ = (
        # "Next due card" is one range scan on these: (retired, due_day, position) in order.
        Index("ix_card_next_due", "retired", "due_day", "position"),
        Index("ix_card_deck_next_due", "deck_id", "retired", "due_day", "position"),
        # Today's step-7 repeats: only cards with one are in it, so a grade of any other card
        # leaves it alone (migration 0003).
        Index(
            "ix_card_repeat", "repeat_day", "last_reviewed_at",
            sqlite_where=text("repeat_day IS NOT NULL"), postgresql_where=text("repeat_day IS NOT NULL"),
        ),
    )

    id: int | None = Field(default=None, primary_key=True)
    question_id: str = Field(unique=True, index=True)  # the bank's stable question id
    deck_id: str = Field(foreign_key="deck.id")
    position: int = 0  # order within the whole bank, for introducing new cards in bank order

    prompt: str
    choices: list[str] = Field(sa_column=Column(JSON, nullable=False))  # in the bank's order
    answer: int  # index of the correct choice in `choices`
    explanation: str
    why_wrong: list[str] = Field(sa_column=Column(JSON, nullable=False))  # "" at the answer
    lab: str
    tags: list[str] = Field(sa_column=Column(JSON, nullable=False))
    content_hash: str
    retired: bool = False  # the question left the bank: out of reviews, history kept

    repetitions: int = 0
    easiness: float = sm2.INITIAL_EASINESS
    interval: int = 0
    due_day: date | None = None  # None: a new card, never reviewed
    repeat_day: date | None = None  # step 7: graded below 4 on this day, comes back that day
    last_reviewed_at: datetime | None = None
    # Bumped on every change (never restored by undo): a submission names the version it
    # answered, so a stale or repeated submission cannot apply twice.
    version: int = 0

    @property
    def state(self) -> sm2.SM2State:
        return sm2.SM2State(self.repetitions, self.easiness, self.interval)

    @property
    def is_new(self) -> bool:
        return self.due_day is None


class ReviewLog(SQLModel, table=True):
    """Append-only: one row per graded answer. Undo marks a row; nothing is ever deleted."""

    __table_args__ = (Index("ix_reviewlog_day", "study_day", "undone_at"),)

    id: int | None = Field(default=None, primary_key=True)
    card_id: int = Field(foreign_key="card.id", index=True)
    submission_id: str = Field(unique=True)  # the same submission twice is one review
    reviewed_at: datetime  # UTC
    study_day: date
    quality: int
    choice: int  # the chosen choice's index in the bank's order
    correct: bool
    is_repeat: bool = False  # a step-7 same-day repeat: logged, but changes no SM-2 state
    was_new: bool = False  # the card's first review: counts against the new-card limit

    before_repetitions: int
    before_easiness: float
    before_interval: int
    before_due_day: date | None = None
    before_repeat_day: date | None = None
    before_last_reviewed_at: datetime | None = None
    after_repetitions: int
    after_easiness: float
    after_interval: int
    after_due_day: date | None = None
    after_repeat_day: date | None = None

    undone_at: datetime | None = None  # set by undo
    # Milliseconds from showing the question to answering it (FSRS's review duration);
    # None for reviews logged before migration 0002 or sent without a showing time.
    duration_ms: int | None = None


class RunStatus(str, Enum):
    """Where a lab run stands (studyapp.lab_runs.queue moves it). The members are the strings
    stored in LabRun.status; each name equals its value, so any driver stores the same string."""

    queued = "queued"
    running = "running"
    done = "done"  # the lab's JSON came back, whether or not its claim held
    failed = "failed"  # timeout, crash, no JSON: the run's error says which

    def __str__(self) -> str:
        return self.value


class LabRun(SQLModel, table=True):
    """One run of a lab, queued from a lab page or `studyapp labs run-all`."""

    id: int | None = Field(default=None, primary_key=True)
    lab_id: str = Field(index=True)
    params: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    status: str = RunStatus.queued.value  # a RunStatus
    result: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    error: str | None = None
    created_at: datetime  # UTC
    started_at: datetime | None = None
    finished_at: datetime | None = None

