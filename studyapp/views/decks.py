"""A deck's card list and each question's own page."""

from __future__ import annotations

from flask import Blueprint, abort, render_template
from sqlmodel import func, select

from sharding_lab.catalog import lab_info
from studyapp.db import get_session
from studyapp.models import Card, Deck, ReviewLog
from studyapp.views import clock
from studyapp.views.exports import available_exports
from studyapp.views.forms import known_slug
from studyapp.views.labs import card_lab
from studyapp.views.paging import requested_page

bp = Blueprint("decks", __name__)


@bp.get("/decks/<deck_id>")
def deck(deck_id: str):
    session = get_session()
    found = session.get(Deck, known_slug(deck_id, "deck"))
    if found is None:
        abort(404, description=f"There is no deck '{deck_id[:60]}'.")
    in_deck = Card.deck_id == deck_id
    page = requested_page(session.exec(select(func.count()).select_from(Card).where(in_deck)).one())
    cards = session.exec(
        select(Card).where(in_deck).order_by(Card.retired, Card.position).offset(page.offset).limit(page.size)
    ).all()
    return render_template(
        "decks/deck.html",
        deck=found,
        cards=cards,
        page=page,
        today=clock.today(),
        lab_info=lab_info,
        exports=available_exports(),
    )


@bp.get("/questions/<question_id>")
def question(question_id: str):
    session = get_session()
    card = session.exec(select(Card).where(Card.question_id == known_slug(question_id, "question"))).first()
    if card is None:
        abort(404, description=f"There is no question '{question_id[:60]}'.")
    history = session.exec(select(ReviewLog).where(ReviewLog.card_id == card.id).order_by(ReviewLog.id.desc())).all()
    today = clock.today()
    return render_template(
        "decks/question.html",
        card=card,
        deck=session.get(Deck, card.deck_id),
        history=history,
        today=today,
        # Graded below 4 earlier today: its step-7 repeat waits (the home page's Repeats count).
        repeat_today=not card.retired and card.repeat_day == today,
        **card_lab(card.lab),
    )
