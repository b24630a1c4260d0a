"""The home page: every deck with its due, new and learned counts, and the weakest topic this week."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date

from flask import Blueprint, render_template
from sqlalchemy import and_, case, func
from sqlmodel import Session, select

from sharding_lab.catalog import lab_info
from studyapp import stats
from studyapp.db import get_session
from studyapp.models import Card, Deck
from studyapp.study import day_progress
from studyapp.views import clock
from studyapp.views.exports import available_exports

bp = Blueprint("home", __name__)
WEAKEST_DAYS = 7  # "this week": the home page's one line on the weakest topic


@dataclass(frozen=True)
class DeckCounts:
    deck: Deck
    due: int  # reviews due today or overdue
    repeats: int  # step-7 repeats waiting today (graded below 4 earlier today), not otherwise due
    new: int  # never reviewed
    learned: int  # reviewed at least once


def deck_counts(session: Session, today: date) -> list[DeckCounts]:
    rows = session.exec(
        select(
            Card.deck_id,
            func.sum(case((Card.due_day <= today, 1), else_=0)),
            func.sum(case((and_(Card.repeat_day == today, Card.due_day > today), 1), else_=0)),
            func.sum(case((Card.due_day.is_(None), 1), else_=0)),
            func.sum(case((Card.due_day.is_not(None), 1), else_=0)),
        )
        .where(Card.retired.is_(False))
        .group_by(Card.deck_id)
    ).all()
    counts = {deck_id: tuple(int(n or 0) for n in figures) for deck_id, *figures in rows}
    decks = session.exec(select(Deck).where(Deck.retired.is_(False)).order_by(Deck.position)).all()
    return [DeckCounts(deck, *counts.get(deck.id, (0, 0, 0, 0))) for deck in decks]


@bp.get("/")
def index():
    session = get_session()
    today = clock.today()
    return render_template(
        "home/index.html",
        decks=deck_counts(session, today),
        progress=day_progress(session, today),
        settings=clock.settings(),
        exports=available_exports(),
        weakest=stats.weakest(stats.mastery(session, today, WEAKEST_DAYS)),
        lab_info=lab_info,
    )
