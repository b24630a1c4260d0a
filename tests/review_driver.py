"""A learner driving the real review pages through a Flask test client: show, answer, grade,
sometimes undo, day after day. Tests use it to fill databases with a realistic review log.

Only the pages' HTML is read (no app imports), so the same driver also runs against an older
checkout of the app (the migration test fills a pre-migrations database with it)."""

from __future__ import annotations

import random
import re
from datetime import timedelta


def _field(page: str, name: str) -> str | None:
    found = re.search(rf'name="{name}" value="([^"]*)"', page)
    return found.group(1) if found else None


def drive_reviews(client, clock, *, days: int, seed: int = 7, undo_every: int = 5, think_seconds: int = 3) -> int:
    """Study every card up today for `days` days, with seeded random answers and grades, undoing
    every `undo_every`th grade. `clock` is the app's settable CLOCK (anything with `.now`).
    Returns how many grades were accepted."""
    rng = random.Random(seed)
    token = re.search(r'<meta name="csrf-token" content="([^"]+)">', client.get("/").get_data(as_text=True)).group(1)
    graded = 0
    for _ in range(days):
        for _ in range(200):  # a day's queue is short in the tests' banks; this only bounds a bug
            page = client.get("/study").get_data(as_text=True)
            card_id = _field(page, "card_id")
            if card_id is None:
                break
            choices = re.findall(r'name="choice" value="(\d+)"', page)
            form = {"csrf_token": token, "card_id": card_id, "version": _field(page, "version"), "choice": rng.choice(choices)}
            if shown_at := _field(page, "shown_at"):
                form["shown_at"] = shown_at
            clock.now += timedelta(seconds=think_seconds)
            answered = client.post("/study/answer", data=form)
            assert answered.status_code == 200, answered.get_data(as_text=True)
            answer = answered.get_data(as_text=True)
            qualities = re.findall(r'name="quality" value="(\d)"', answer)
            form.pop("shown_at", None)
            if duration := _field(answer, "duration_ms"):
                form["duration_ms"] = duration
            response = client.post("/study/grade", data={**form, "quality": rng.choice(qualities)})
            assert response.status_code == 302, response.get_data(as_text=True)
            graded += 1
            if undo_every and graded % undo_every == 0:
                assert client.post("/study/undo", data={"csrf_token": token}).status_code == 302
        clock.now += timedelta(days=1)
    return graded
