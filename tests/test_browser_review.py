"""A whole daily review in a real Chromium, by keyboard only (Playwright)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect
from sqlmodel import Session, select

from studyapp.db import get_engine
from studyapp.models import Card, ReviewLog

pytestmark = pytest.mark.browser


def correct_text(app, prompt: str) -> str:
    with Session(get_engine(app)) as session:
        card = session.exec(select(Card).where(Card.prompt == prompt)).one()
        return card.choices[card.answer]


def press_and_wait(page: Page, key: str) -> None:
    with page.expect_navigation():
        page.keyboard.press(key)


def answer_by_keyboard(page: Page, app, *, right: bool, grade: str) -> str:
    """On a question page: pick a choice with its number key, Enter, then grade with a digit."""
    prompt = page.locator("h1.prompt").inner_text()
    choices = page.locator("ol.choices .choice-text").all_inner_texts()
    target = choices.index(correct_text(app, prompt))
    if not right:
        target = (target + 1) % len(choices)
    page.keyboard.press(str(target + 1))
    expect(page.locator("input[name=choice]").nth(target)).to_be_checked()
    press_and_wait(page, "Enter")
    expect(page.locator(".verdict")).to_have_text("Right" if right else "Wrong")
    press_and_wait(page, grade)
    return prompt


def test_a_whole_daily_review_by_keyboard(page: Page, live_server: str, app):
    page.goto(live_server + "/")
    expect(page.locator("tr[data-deck=alpha] .new")).to_have_text("3")
    press_and_wait(page, "s")  # study all decks
    assert page.url.endswith("/study")

    # First pass: miss the first card (step 7 brings it back), get the other four right.
    missed = answer_by_keyboard(page, app, right=False, grade="1")
    for _ in range(4):
        assert page.locator("h1.prompt").inner_text() != missed
        answer_by_keyboard(page, app, right=True, grade="5")

    # The step-7 repeat of the missed card, marked as such.
    expect(page.locator("h1.prompt")).to_have_text(missed)
    expect(page.locator(".context")).to_contain_text("repeat")
    answer_by_keyboard(page, app, right=True, grade="3")  # below 4: once more
    expect(page.locator("h1.prompt")).to_have_text(missed)
    answer_by_keyboard(page, app, right=True, grade="4")
    expect(page.locator("h1")).to_have_text("Done for today")

    # Undo the last grade with `u`: the card is back; grade it again.
    press_and_wait(page, "u")
    expect(page.locator(".flash")).to_contain_text("Undid your grade 4")
    expect(page.locator("h1.prompt")).to_have_text(missed)
    answer_by_keyboard(page, app, right=True, grade="5")
    expect(page.locator("h1")).to_have_text("Done for today")
    expect(page.locator(".progress")).to_contain_text("0 / 200 reviews, 5 / 20 new cards, 2 repeats")

    press_and_wait(page, "h")  # home: everything learned, nothing due today
    expect(page.locator("tr[data-deck=alpha] .learned")).to_have_text("3")
    expect(page.locator("tr[data-deck=alpha] .new")).to_have_text("0")

    with Session(get_engine(app)) as session:
        logs = session.exec(select(ReviewLog).order_by(ReviewLog.id)).all()
    assert [(log.quality, log.is_repeat, log.undone_at is not None) for log in logs] == [
        (1, False, False), (5, False, False), (5, False, False), (5, False, False), (5, False, False),
        (3, True, False), (4, True, True), (5, True, False),
    ]


def test_a_second_grade_key_before_the_page_leaves_sends_nothing(page: Page, live_server: str, app):
    page.goto(live_server + "/study")
    prompt = page.locator("h1.prompt").inner_text()
    page.keyboard.press(str(page.locator("ol.choices .choice-text").all_inner_texts().index(correct_text(app, prompt)) + 1))
    press_and_wait(page, "Enter")
    # Count the page's submits where they survive the navigation (capture: before any handler runs).
    page.evaluate("window.addEventListener('submit', () => { sessionStorage.submits = (+sessionStorage.submits || 0) + 1 }, true)")
    with page.expect_navigation():
        page.keyboard.press("5")
        page.keyboard.press("4")  # at once, while the first grade is on its way
    assert page.evaluate("sessionStorage.submits") == "1"
    with Session(get_engine(app)) as session:
        assert [log.quality for log in session.exec(select(ReviewLog)).all()] == [5]


def test_u_on_the_answer_page_undoes_the_review_before_it(page: Page, live_server: str, app):
    page.goto(live_server + "/study")
    expect(page.locator(".keys")).not_to_contain_text("undo")  # nothing to undo before the first grade
    graded = answer_by_keyboard(page, app, right=True, grade="5")
    prompt = page.locator("h1.prompt").inner_text()
    page.keyboard.press(str(page.locator("ol.choices .choice-text").all_inner_texts().index(correct_text(app, prompt)) + 1))
    press_and_wait(page, "Enter")  # the second card's answer page, not yet graded
    expect(page.locator(".keys")).to_contain_text("undo the last review")
    press_and_wait(page, "u")
    expect(page.locator(".flash")).to_contain_text("Undid your grade 5")
    expect(page.locator("h1.prompt")).to_have_text(graded)
    with Session(get_engine(app)) as session:
        [log] = session.exec(select(ReviewLog)).all()
    assert log.undone_at is not None


def test_on_home_a_digit_past_the_last_deck_does_nothing(page: Page, live_server: str):
    page.goto(live_server + "/")
    expect(page.locator(".keys")).to_have_text("Keys: 1–2 study a deck, s study all, h home.")  # two decks
    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    for key in "3456789":
        page.keyboard.press(key)
    press_and_wait(page, "2")  # keys are handled in order: a page that 3–9 asked for would come first
    assert requested[0] == live_server + "/study?deck=beta"
    expect(page.locator("h1.prompt")).to_have_text("Why is Adam's optimizer state large?")


def test_u_in_a_deck_session_undoes_that_decks_review_not_a_newer_one_elsewhere(page: Page, live_server: str, app):
    page.goto(live_server + "/study?deck=beta")
    graded = answer_by_keyboard(page, app, right=True, grade="5")
    page.goto(live_server + "/study?deck=alpha")
    answer_by_keyboard(page, app, right=True, grade="5")  # the latest review overall, in another deck
    page.goto(live_server + "/study?deck=beta")
    page.keyboard.press("1")
    press_and_wait(page, "Enter")  # beta's second card, answered, not graded
    expect(page.locator("form.undo button")).to_contain_text("Undo last review in Beta deck")
    press_and_wait(page, "u")
    expect(page.locator(".flash")).to_contain_text(f"Undid your grade 5 for “{graded}”")
    expect(page.locator("h1.prompt")).to_have_text(graded)
    expect(page.locator(".context")).to_contain_text("Beta deck")
    with Session(get_engine(app)) as session:
        logs = session.exec(select(ReviewLog).order_by(ReviewLog.id)).all()
    assert [log.undone_at is not None for log in logs] == [True, False]


@pytest.mark.parametrize("ci, outcome", [("", "1 skipped"), ("true", "1 error")])
def test_without_chromium_a_browser_test_skips_but_fails_under_ci(ci, outcome):
    env = {**os.environ, "STUDYAPP_CHROMIUM": "/nonexistent/chromium", "CI": ci}
    env.pop("STUDYAPP_TEST_POSTGRES_URL", None)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "whole_daily_review", __file__],
        capture_output=True, text=True, env=env, cwd=Path(__file__).resolve().parent.parent, timeout=300,
    )
    assert outcome in result.stdout, result.stdout[-2000:]
    assert (result.returncode == 0) == (ci != "true")
