"""The review flow's edges through Flask's test client: a stale answer form, and a same-day
repeat graded after the study day rolled over."""

from __future__ import annotations

import re
from datetime import date, datetime, timezone

from sqlmodel import Session
from test_app_study import card, logs, shown_card, submit, text

from studyapp.db import get_engine
from studyapp.models import Card


def flashes(page: str) -> list[str]:
    return re.findall(r'<p class="flash" role="status"[^>]*>([^<]*)</p>', page)


def test_a_stale_answer_form_shows_its_card_again_when_it_is_still_up(client, app, csrf_token):
    shown = shown_card(client)
    c = card(app, shown["card_id"])
    submit(client, csrf_token, shown, (c.answer + 1) % len(c.choices), 1)  # another tab: wrong, so a repeat today
    response = submit(client, csrf_token, shown, c.answer)  # this tab answers the old showing
    assert response.status_code == 302
    page = text(client.get(response.location))
    assert flashes(page) == ["That card changed since it was shown (another tab?), so here it is as it is now."]
    assert shown_card(client, response.location)["card_id"] == shown["card_id"]
    assert "repeat: grade 4 or 5" in page


def test_a_stale_answer_form_for_a_card_done_today_says_so_and_goes_on(client, app, csrf_token):
    shown = shown_card(client)
    c = card(app, shown["card_id"])
    submit(client, csrf_token, shown, c.answer, 5)  # another tab: done until tomorrow
    response = submit(client, csrf_token, shown, c.answer)
    page = text(client.get(response.location))
    assert flashes(page) == [
        "That card changed since it was shown (another tab?) and is not up again today; here is the next one."]
    assert shown_card(client, response.location)["card_id"] != shown["card_id"]  # not "the current one"
    assert len(logs(app)) == 1


def test_a_repeat_graded_after_the_day_rolled_over_is_not_a_bad_request(client, app, csrf_token, clock):
    clock.now = datetime(2026, 3, 3, 3, 50, tzinfo=timezone.utc)  # 03:50: still the study day of 2 March
    with Session(get_engine(app)) as session:  # a learned card due that day (n=2, I=6)
        due = session.get(Card, int(shown_card(client)["card_id"]))
        due.repetitions, due.easiness, due.interval, due.due_day = 2, 2.7, 6, date(2026, 3, 2)
        session.add(due)
        session.commit()
    app.config["NEW_CARDS_PER_DAY"] = 0
    shown = shown_card(client)
    c = card(app, shown["card_id"])
    submit(client, csrf_token, shown, c.answer, 3)  # below 4: due in 17 days, and again today
    repeat = shown_card(client)
    assert repeat["card_id"] == shown["card_id"] and "repeat: grade 4 or 5" in repeat["page"]
    assert "changes no interval" in text(submit(client, csrf_token, repeat, c.answer))
    clock.advance(minutes=15)  # 04:05: the study day rolled over while the answer page was open
    response = submit(client, csrf_token, repeat, c.answer, 5)
    assert response.status_code == 302, text(response)  # was a 400 "is not due until 2026-03-19"
    assert flashes(text(client.get(response.location))) == [
        "The study day rolled over while that card was open, so its same-day repeat ended with the day; "
        "nothing was recorded."]
    assert len(logs(app)) == 1  # the first pass only
    after = card(app, c.id)
    assert (after.interval, after.due_day, after.repeat_day) == (17, date(2026, 3, 19), date(2026, 3, 2))
