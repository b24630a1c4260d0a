"""The daily review: show the next card, check the answer, grade it, undo."""

from __future__ import annotations

from flask import Blueprint, abort, flash, redirect, render_template, request, url_for

from studyapp.auth import wants_json
from studyapp.db import get_session
from studyapp.models import Card, Deck
from studyapp.study import (
    AlreadyUndone,
    RepeatEnded,
    ReviewConflict,
    ReviewRejected,
    choice_order,
    day_progress,
    grade,
    grade_options,
    is_up_today,
    last_live_review,
    next_card,
    undo_last,
)
from studyapp.views import clock
from studyapp.views.forms import form_int, known_slug, optional_form_int
from studyapp.views.labs import card_lab

bp = Blueprint("study", __name__, url_prefix="/study")

MAX_DURATION_MS = 24 * 3600 * 1000  # a question left open longer than a day says nothing of recall


def _now_ms() -> int:
    return int(clock.now().timestamp() * 1000)


def _answer_duration_ms() -> int | None:
    """Milliseconds since the question was shown (its form's `shown_at`), if it says."""
    shown_at = optional_form_int("shown_at", 0, 2**53)
    if shown_at is None:
        return None
    elapsed = _now_ms() - shown_at
    return elapsed if 0 <= elapsed <= MAX_DURATION_MS else None


def _deck_filter(raw: str | None) -> Deck | None:
    """The deck a session is limited to (`?deck=` or the form's `deck`), or None for all decks."""
    if not raw:
        return None
    deck = get_session().get(Deck, known_slug(raw, "deck"))
    if deck is None or deck.retired:
        abort(404, description=f"There is no deck '{raw[:60]}'.")
    return deck


def _study_url(deck: Deck | None, card_id: int | None = None) -> str:
    return url_for("study.show", deck=deck.id if deck else None, card=card_id)


def _requested_card(raw: str | None, deck: Deck | None) -> Card | None:
    """`?card=ID` (after an undo) shows that card again, if it is up today and in the session's deck."""
    if not raw or not raw.isascii() or not raw.isdigit() or len(raw) > 12:
        return None
    card = get_session().get(Card, int(raw))
    if card is None or (deck is not None and card.deck_id != deck.id):
        return None
    return card if is_up_today(card, clock.today()) else None


@bp.get("")
def show():
    deck = _deck_filter(request.args.get("deck"))
    session = get_session()
    settings, now = clock.settings(), clock.now()
    today = clock.today()
    card = _requested_card(request.args.get("card"), deck) or next_card(session, now, settings, deck.id if deck else None)
    progress = day_progress(session, today)
    undoable = last_live_review(session, deck.id if deck else None)  # a deck session undoes its own reviews
    if card is None:
        return render_template("study/done.html", deck=deck, progress=progress, settings=settings, undoable=undoable)
    order = choice_order(card.id, today, len(card.choices))
    return render_template(
        "study/question.html",
        deck=deck,
        card=card,
        choices=[(index, card.choices[index]) for index in order],
        is_repeat=card.repeat_day == today,
        progress=progress,
        settings=settings,
        undoable=undoable,
        shown_at=_now_ms(),
    )


def _shown_card() -> tuple[Card, int]:
    """The card the form answers and the version it was shown at."""
    card = get_session().get(Card, form_int("card_id"))
    if card is None:
        abort(404, description="That card does not exist.")
    return card, form_int("version")


@bp.post("/answer")
def answer():
    deck = _deck_filter(request.form.get("deck"))
    card, version = _shown_card()
    if card.version != version:
        # Show this card again as it is now if it is still up today; say so when it is not.
        if is_up_today(card, clock.today()):
            flash("That card changed since it was shown (another tab?), so here it is as it is now.")
            return redirect(_study_url(deck, card.id))
        flash("That card changed since it was shown (another tab?) and is not up again today; here is the next one.")
        return redirect(_study_url(deck))
    choice = form_int("choice", 0, len(card.choices) - 1)
    today = clock.today()
    correct = choice == card.answer
    order = choice_order(card.id, today, len(card.choices))
    return render_template(
        "study/answer.html",
        deck=deck,
        card=card,
        version=version,
        choice=choice,
        correct=correct,
        choices=[(index, card.choices[index]) for index in order],
        options=grade_options(card, correct, today),
        **card_lab(card.lab),
        is_repeat=card.repeat_day == today,
        duration_ms=_answer_duration_ms(),
        undoable=last_live_review(get_session(), deck.id if deck else None),
    )


@bp.post("/grade")
def submit_grade():
    deck = _deck_filter(request.form.get("deck"))
    card_id = form_int("card_id")
    try:
        result = grade(
            get_session(),
            card_id=card_id,
            version=form_int("version"),
            choice=form_int("choice", 0, 99),
            quality=form_int("quality", 0, 5),
            now=clock.now(),
            settings=clock.settings(),
            duration_ms=optional_form_int("duration_ms", 0, MAX_DURATION_MS),
        )
    except RepeatEnded:  # not bad input: the page was open across the day's rollover
        flash("The study day rolled over while that card was open, so its same-day repeat ended with the day; "
              "nothing was recorded.")
        return redirect(_study_url(deck))
    except ReviewRejected as rejected:
        abort(rejected.status, description=str(rejected))
    if result.duplicate:  # the stored row: the grade that counted, not the one just sent
        flash(f"That answer was already recorded (grade {result.row['quality']}); it counts once.")
    return redirect(_study_url(deck))


def _out_of_date_undo(conflict: ReviewConflict, deck: Deck | None) -> str:
    """What an undo that lost to a newer review is told: why nothing was undone, and what `u` undoes now."""
    where = f" in {deck.title}" if deck else ""
    latest = last_live_review(get_session(), deck.id if deck else None)
    if latest is None:
        now = f"There is no review{where} to undo."
    else:
        card = get_session().get(Card, latest.card_id)
        now = f"The latest review{where} is your grade {latest.quality} for “{card.prompt}”; u here undoes it."
    return f"This page was out of date: {conflict}. {now}"


@bp.post("/undo")
def undo():
    deck = _deck_filter(request.form.get("deck"))
    session = get_session()
    try:
        undone = undo_last(session, clock.now(), optional_form_int("review_id", 1), deck.id if deck else None)
    except AlreadyUndone as already:  # the same undo form again: it counts once, as a grade does
        flash("That review was already undone; nothing changed.")
        return redirect(_study_url(deck, already.log.card_id))
    except ReviewConflict as conflict:
        # A page from before the latest review (Back, another tab): undo_last undid nothing. A redirect
        # to the study page, whose undo form names the latest review, where a 409 page's reload would
        # only post the same stale form again. A JSON client keeps its 409.
        if wants_json():
            abort(409, description=str(conflict))
        flash(_out_of_date_undo(conflict, deck), "error")
        return redirect(_study_url(deck))
    except ReviewRejected as rejected:
        abort(rejected.status, description=str(rejected))
    if undone is None:
        flash("There is no review to undo.")
    else:
        card = session.get(Card, undone.card_id)
        flash(f"Undid your grade {undone.quality} for “{card.prompt}”: the card is back as it was.")
        return redirect(_study_url(deck, undone.card_id))
    return redirect(_study_url(deck))
