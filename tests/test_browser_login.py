"""Studying from a phone: a real `studyapp serve` bound to 0.0.0.0 (Chromium talks to it on
127.0.0.1 only), a phone-sized touch screen, the login page, the printed token URL, then a whole
review by taps, under the app's Content-Security-Policy: no violation, no token in a Referer."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import write_bank
from live_server import ServerProcess
from playwright.sync_api import Browser, expect
from sqlmodel import Session, select

from studyapp import auth
from studyapp.db import make_engine
from studyapp.models import Card, ReviewLog

pytestmark = [pytest.mark.browser, pytest.mark.slow]
PHONE = {"viewport": {"width": 390, "height": 844}, "is_mobile": True, "has_touch": True, "device_scale_factor": 3}


@pytest.fixture
def served(tmp_path: Path):
    database_url = f"sqlite:///{tmp_path / 'study.sqlite3'}"
    server = ServerProcess(tmp_path, database_url, write_bank(tmp_path / "bank"), host="0.0.0.0")
    server.start()
    yield server
    server.stop()


def right_choice(database_url: str, prompt: str) -> str:
    engine = make_engine(database_url)
    try:
        with Session(engine) as session:
            card = session.exec(select(Card).where(Card.prompt == prompt)).one()
            return card.choices[card.answer]
    finally:
        engine.dispose()


def test_a_review_on_a_phone_after_logging_in(browser: Browser, served: ServerProcess):
    token = (served.folder / "instance" / auth.TOKEN_FILE).read_text().strip()
    printed = re.search(r"login required: open http://\S+?(/login\?token=[0-9a-f]+)", served.log()).group(1)
    assert printed == f"/login?token={token}"
    context = browser.new_context(**PHONE)
    page = context.new_page()
    problems: list[str] = []
    # A CSP violation is a console error ("Refused to ... Content Security Policy"); a 401 (the
    # wrong token) or a 404 (the favicon) is an expected "Failed to load resource".
    page.on("console", lambda message: problems.append(message.text)
            if message.type == "error" and not message.text.startswith("Failed to load resource") else None)
    page.on("pageerror", lambda error: problems.append(str(error)))
    referers: list[str] = []
    page.on("request", lambda request: referers.append(request.headers.get("referer", "")))

    # Not logged in: the page asked for sends to the login page; a wrong token is refused.
    page.goto(served.url + "/study")
    assert page.url.startswith(served.url + "/login?next=")
    expect(page.locator("h1")).to_have_text("Log in")
    page.locator("input[name=token]").fill("0" * 48)
    page.locator("form.login button").tap()
    expect(page.locator(".login-error")).to_contain_text("attempt 1 of 10")

    # The URL `serve` printed (its host a LAN address; here 127.0.0.1) logs in and leaves the address bar.
    page.goto(served.url + printed)
    assert page.url == served.url + "/", page.url
    expect(page.locator("tr[data-deck=alpha]")).to_be_visible()
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth"), "no sideways scrolling"

    # A review by taps: study, pick the right choice, check, grade 5.
    page.locator("a.button[href='/study']").tap()
    prompt = page.locator("h1.prompt").inner_text()
    right = right_choice(served.config["DATABASE_URL"], prompt)
    page.locator("ol.choices label", has_text=right).tap()
    page.locator("form.question button[type=submit]").tap()
    expect(page.locator(".verdict")).to_have_text("Right")
    page.locator("button.grade[value='5']").tap()
    expect(page.locator("h1.prompt")).not_to_have_text(prompt)

    # The policy is in force: an inline script is refused and reported (so the check below can fail).
    try:
        page.add_script_tag(content="window.inlineRan = true")
    except Exception:  # noqa: BLE001 - Playwright may report the refused script as an error
        pass
    assert page.evaluate("window.inlineRan === undefined")
    for _ in range(100):  # up to 5 s for the console report; events arrive while Playwright runs
        if any("Content Security Policy" in problem for problem in problems):
            break
        page.wait_for_timeout(50)
    assert any("Content Security Policy" in problem for problem in problems), problems
    problems.clear()

    # Typing the token works too, in a second phone; logging out ends that session.
    other = browser.new_context(**PHONE).new_page()
    other.goto(served.url + "/stats")
    other.locator("input[name=token]").fill(token)
    other.locator("form.login button").tap()
    expect(other).to_have_url(served.url + "/stats")
    other.locator("nav form.logout button").tap()
    expect(other.locator("h1")).to_have_text("Log in")
    other.context.close()
    context.close()

    engine = make_engine(served.config["DATABASE_URL"])
    with Session(engine) as session:
        logs = session.exec(select(ReviewLog)).all()
    engine.dispose()
    assert [(log.quality, log.undone_at) for log in logs] == [(5, None)]
    assert problems == [], f"console errors or CSP violations: {problems}"
    assert not [r for r in referers if token in r or "token=" in r], "the token went out in a Referer"
