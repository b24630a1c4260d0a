"""The review pages through Flask's test client: question, answer view, grading, undo, CSRF, bad input."""

from __future__ import annotations

import html
import re

import pytest
from conftest import csrf_token_of, write_bank
from sqlmodel import Session, select

from studyapp import sm2
from studyapp.db import get_engine
from studyapp.models import Card, ReviewLog
from studyapp.sync import sync_bank


def text(response) -> str:
    return html.unescape(response.get_data(as_text=True))


def shown_card(client, url: str = "/study") -> dict:
    """The card on the question page: id, version and the choices' bank indices in display order."""
    page = client.get(url).get_data(as_text=True)
    return {
        "card_id": re.search(r'name="card_id" value="(\d+)"', page).group(1),
        "version": re.search(r'name="version" value="(\d+)"', page).group(1),
        "order": [int(i) for i in re.findall(r'name="choice" value="(\d+)"', page)],
        "page": page,
    }


def card(app, card_id) -> Card:
    with Session(get_engine(app)) as session:
        return session.get(Card, int(card_id))


def logs(app) -> list[ReviewLog]:
    with Session(get_engine(app)) as session:
        return session.exec(select(ReviewLog).order_by(ReviewLog.id)).all()


def submit(client, token, shown, choice, quality=None, **extra):
    data = {"csrf_token": token, "card_id": shown["card_id"], "version": shown["version"], "choice": str(choice), **extra}
    if quality is None:
        return client.post("/study/answer", data=data)
    return client.post("/study/grade", data={**data, "quality": str(quality)})


def test_the_question_page_shows_the_prompt_shuffled_choices_and_shortcuts(client, app):
    shown = shown_card(client)
    first = card(app, shown["card_id"])
    assert first.question_id == "alpha-shards"
    page = html.unescape(shown["page"])
    assert first.prompt in page
    assert sorted(shown["order"]) == [0, 1, 2, 3]
    for choice in first.choices:
        assert choice in page
    assert shown_card(client)["order"] == shown["order"]  # a reload shows the same order
    for key in ('data-key="1"', 'data-key="4"', "data-enter-submits", ">Enter</kbd>"):
        assert key in shown["page"]
    assert 'data-key="u"' not in shown["page"] and "<kbd>u</kbd>" not in shown["page"]  # nothing to undo yet


def test_the_order_changes_with_the_study_day(client, clock):
    orders = set()
    for _ in range(6):
        orders.add(tuple(shown_card(client)["order"]))
        clock.advance(days=1)
    assert len(orders) > 1


def test_a_wrong_answer_shows_the_right_one_the_reasons_the_lab_and_only_grades_0_to_2(client, app, csrf_token):
    shown = shown_card(client)
    c = card(app, shown["card_id"])
    wrong = next(i for i in range(len(c.choices)) if i != c.answer)
    page = text(submit(client, csrf_token, shown, wrong))
    assert "Wrong" in page
    assert f"Answer: {c.choices[c.answer]}" in re.sub(r"<[^>]+>", "", page)
    assert c.explanation in page
    assert c.why_wrong[wrong] in page
    assert "What FSDP shards that DDP replicates" in page  # the lab's title
    assert "sharding-lab run what-fsdp-shards" in page
    assert 'href="/labs/what-fsdp-shards"' in page
    assert re.findall(r'name="quality" value="(\d)"', page) == ["0", "1", "2"]
    for q in (0, 1, 2):
        assert sm2.QUALITY_WORDING[q] in page
    assert "next in 1 day · again today" in page


def test_a_right_answer_offers_3_to_5_with_their_intervals(client, app, csrf_token):
    shown = shown_card(client)
    c = card(app, shown["card_id"])
    page = text(submit(client, csrf_token, shown, c.answer))
    assert "Right" in page
    assert re.findall(r'name="quality" value="(\d)"', page) == ["3", "4", "5"]
    assert page.count("next in 1 day") == 3


def test_grading_records_the_review_and_moves_on(client, app, csrf_token):
    shown = shown_card(client)
    c = card(app, shown["card_id"])
    response = submit(client, csrf_token, shown, c.answer, 5)
    assert response.status_code == 302 and response.location.endswith("/study")
    [log] = logs(app)
    assert (log.card_id, log.quality, log.choice, log.correct) == (c.id, 5, c.answer, True)
    assert card(app, c.id).state == sm2.SM2State(repetitions=1, easiness=2.6, interval=1)
    assert shown_card(client)["card_id"] != shown["card_id"]


def test_the_server_refuses_a_grade_that_contradicts_the_answer(client, app, csrf_token):
    shown = shown_card(client)
    c = card(app, shown["card_id"])
    wrong = (c.answer + 1) % len(c.choices)
    response = submit(client, csrf_token, shown, wrong, 5)
    assert response.status_code == 400
    assert "a wrong answer is graded 0 to 2, got 5" in text(response)
    response = submit(client, csrf_token, shown, c.answer, 1)
    assert response.status_code == 400 and "a right answer is graded 3 to 5" in text(response)
    assert logs(app) == []


def test_the_same_submission_twice_counts_once(client, app, csrf_token):
    shown = shown_card(client)
    c = card(app, shown["card_id"])
    assert submit(client, csrf_token, shown, c.answer, 4).status_code == 302
    again = submit(client, csrf_token, shown, c.answer, 4)  # a retry, or the second tab
    assert again.status_code == 302
    assert len(logs(app)) == 1
    assert "already recorded" in text(client.get("/study"))


def test_a_stale_tab_grading_a_recorded_answer_is_told_which_grade_counted(client, app, csrf_token):
    shown = shown_card(client)
    c = card(app, shown["card_id"])
    submit(client, csrf_token, shown, c.answer, 5)
    stale = submit(client, csrf_token, shown, c.answer, 3)  # the other tab, answering the same showing
    assert stale.status_code == 302
    assert "That answer was already recorded (grade 5); it counts once." in text(client.get(stale.location))
    assert [log.quality for log in logs(app)] == [5]


def test_undo_restores_the_card_and_shows_it_again(client, app, csrf_token):
    shown = shown_card(client)
    before = card(app, shown["card_id"])
    submit(client, csrf_token, shown, before.answer, 3)
    response = client.post("/study/undo", data={"csrf_token": csrf_token})
    assert response.status_code == 302 and f"card={before.id}" in response.location
    after = card(app, before.id)
    assert (after.state, after.due_day, after.repeat_day, after.last_reviewed_at) == (
        before.state, before.due_day, before.repeat_day, before.last_reviewed_at)
    [log] = logs(app)
    assert log.undone_at is not None
    page = text(client.get(response.location))
    assert "Undid your grade 3" in page and before.prompt in page
    assert "no review to undo" in text(client.get(client.post("/study/undo", data={"csrf_token": csrf_token}).location))


def test_a_deck_session_stays_in_its_deck(client, app, csrf_token):
    shown = shown_card(client, "/study?deck=beta")
    c = card(app, shown["card_id"])
    assert c.deck_id == "beta"
    response = submit(client, csrf_token, shown, c.answer, 5, deck="beta")
    assert response.location.endswith("/study?deck=beta")
    assert client.get("/study?deck=nope").status_code == 404


def test_the_done_page_after_the_day(client, app, csrf_token, clock):
    for _ in range(5):
        shown = shown_card(client)
        submit(client, csrf_token, shown, card(app, shown["card_id"]).answer, 5)
    page = text(client.get("/study"))
    assert "Done for today" in page and "5 / 20 new cards" in page
    clock.advance(days=1)
    assert "Done for today" not in text(client.get("/study"))


def test_a_step7_repeat_is_marked_on_the_page(client, app, csrf_token):
    app.config["NEW_CARDS_PER_DAY"] = 1
    shown = shown_card(client)
    c = card(app, shown["card_id"])
    submit(client, csrf_token, shown, (c.answer + 1) % len(c.choices), 0)
    again = shown_card(client)
    assert again["card_id"] == shown["card_id"]
    assert "repeat: grade 4 or 5" in again["page"]
    page = text(submit(client, csrf_token, again, c.answer))
    assert "changes no interval" in page
    submit(client, csrf_token, again, c.answer, 4)
    assert "1 / 1 new cards, 1 repeat." in text(client.get("/study"))  # in the singular: it said "1 repeats"


# --- CSRF and bad input -----------------------------------------------------------------


@pytest.mark.parametrize("url", ["/study/answer", "/study/grade", "/study/undo"])
def test_every_post_needs_the_csrf_token(client, app, url):
    shown = shown_card(client)
    data = {"card_id": shown["card_id"], "version": shown["version"], "choice": "0", "quality": "1"}
    for token in (None, "forged"):
        sent = data if token is None else {**data, "csrf_token": token}
        response = client.post(url, data=sent)
        assert response.status_code == 400 and "CSRF token" in text(response)
    assert logs(app) == []


def test_the_csrf_token_may_come_in_a_header(client, app, csrf_token):
    response = client.post("/study/undo", headers={"X-CSRF-Token": csrf_token})
    assert response.status_code == 302


def test_a_client_error_is_json_for_json_clients(client):
    response = client.post("/study/undo", json={})
    assert response.status_code == 400 and "CSRF" in response.get_json()["error"]


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("card_id", None, "'card_id' is missing"),
        ("card_id", "abc", "'card_id' must be a whole number"),
        ("card_id", "-1", "'card_id' must be from 0 to 2147483647, got -1."),
        ("card_id", "-", "'card_id' must be a whole number"),
        ("choice", "-1", "'choice' must be from 0 to 99, got -1."),
        ("duration_ms", "-1", "'duration_ms' must be from 0 to 86400000, got -1."),
        # A whole number too long to read is out of range, not "not a whole number" (it said that).
        ("card_id", "9" * 5000, "'card_id' must be from 0 to 2147483647, got 99999999999999999999… (5000 digits)."),
        ("version", "9999999999999999999", "'version' must be from 0 to 2147483647, got 9999999999999999999."),
        ("card_id", "99999999999", "'card_id' must be from 0 to 2147483647"),
        ("version", "", "'version' is missing"),
        ("choice", "7", "choice must be from 0 to 3"),
        ("choice", "1.5", "'choice' must be a whole number"),
        ("quality", "6", "'quality' must be from 0 to 5"),
        ("quality", "٣", "'quality' must be a whole number"),
    ],
)
def test_bad_form_input_is_a_400_that_names_the_field(client, app, csrf_token, field, value, message):
    shown = shown_card(client)
    c = card(app, shown["card_id"])
    data = {"csrf_token": csrf_token, "card_id": shown["card_id"], "version": shown["version"], "choice": str(c.answer),
            "quality": "5"}
    if value is None:
        del data[field]
    else:
        data[field] = value
    response = client.post("/study/grade", data=data)
    assert response.status_code == 400, text(response)
    assert message in text(response)
    assert logs(app) == []


@pytest.mark.parametrize("field", ["quality", "card_id"])
def test_a_field_sent_twice_with_different_values_is_refused(client, app, csrf_token, field):
    # `quality=1&quality=5` recorded grade 1: the first value won, whatever the sender meant.
    shown = shown_card(client)
    c = card(app, shown["card_id"])
    data = {"csrf_token": csrf_token, "card_id": shown["card_id"], "version": shown["version"], "choice": str(c.answer),
            "quality": "5"}
    data[field] = [str(data[field]), "4" if field == "quality" else "999"]
    response = client.post("/study/grade", data=data)
    assert response.status_code == 400, text(response)
    assert f"The form field '{field}' was sent 2 different ways" in text(response) and "send it once" in text(response)
    assert logs(app) == []
    data[field] = [data[field][0]] * 2  # the same value twice says one thing: taken
    assert client.post("/study/grade", data=data).status_code == 302
    assert len(logs(app)) == 1


def test_a_negative_whole_number_is_told_the_fields_range(client, app, csrf_token):
    shown = shown_card(client)
    for choice, shown_at, message in [("-1", "1", "'choice' must be from 0 to 3, got -1."),
                                      ("0", "-5", "'shown_at' must be from 0 to 9007199254740992, got -5.")]:
        response = submit(client, csrf_token, shown, choice, shown_at=shown_at)  # the answer page
        assert response.status_code == 400 and message in text(response), message


def test_an_unknown_card_is_a_404(client, csrf_token):
    response = client.post("/study/grade", data={"csrf_token": csrf_token, "card_id": "4242", "version": "0",
                                                  "choice": "0", "quality": "0"})
    assert response.status_code == 404 and "no card 4242" in text(response)


def test_a_grade_for_a_card_shown_before_an_undo_is_a_409(client, app, csrf_token):
    shown = shown_card(client)
    c = card(app, shown["card_id"])
    submit(client, csrf_token, shown, c.answer, 3)
    repeat = {**shown, "version": str(int(shown["version"]) + 1)}
    client.post("/study/undo", data={"csrf_token": csrf_token})
    response = submit(client, csrf_token, repeat, c.answer, 4)
    assert response.status_code == 409 and "changed since it was shown" in text(response)


def test_a_card_not_due_is_refused(client, app, csrf_token, clock):
    shown = shown_card(client)
    c = card(app, shown["card_id"])
    submit(client, csrf_token, shown, c.answer, 5)
    clock.advance(minutes=1)
    fresh = {**shown, "version": str(int(shown["version"]) + 1)}
    response = submit(client, csrf_token, fresh, c.answer, 5)
    assert response.status_code == 400 and "is not due until" in text(response)
    assert len(logs(app)) == 1


def test_an_oversized_body_is_refused_with_a_413(client, app, csrf_token):
    response = client.post("/study/answer", data={"csrf_token": csrf_token, "card_id": "1", "version": "0",
                                                   "choice": "0", "padding": "x" * (2 * 1024 * 1024)})
    assert response.status_code == 413
    assert logs(app) == []


def test_a_get_on_a_post_endpoint_is_a_405(client):
    assert client.get("/study/grade").status_code == 405


@pytest.mark.parametrize(("method", "url", "status"), [("PUT", "/study", 405), ("DELETE", "/", 405),
                                                       ("POST", "/stats", 405), ("POST", "/no/such/page", 404)])
def test_a_wrong_method_or_route_says_so_before_the_csrf_check(client, method, url, status):
    # Without a token: a CSRF 400 here would hide what is really wrong.
    response = client.open(url, method=method)
    assert response.status_code == status and "CSRF" not in text(response)


def undo_form(page: str) -> dict:
    """The undo form's fields on a page: the review it offers to undo."""
    form = re.search(r'<form method="post" action="/study/undo" class="undo">(.*?)</form>', page, re.S).group(1)
    return dict(re.findall(r'name="(\w+)" value="([^"]*)"', form))


def test_every_review_page_offers_undo_of_the_review_it_names(client, app, csrf_token):
    shown = shown_card(client)
    first = card(app, shown["card_id"])
    submit(client, csrf_token, shown, first.answer, 5)
    [log] = logs(app)
    question = shown_card(client)
    answer_page = submit(client, csrf_token, question, 0).get_data(as_text=True)  # the answer page, ungraded
    for page in (question["page"], answer_page):
        assert undo_form(page)["review_id"] == str(log.id)
        assert 'data-key="u"' in page and "<kbd>u</kbd> undo the last review" in page


def test_an_undo_form_posted_twice_undoes_one_review(client, app, csrf_token):
    for _ in range(2):
        shown = shown_card(client)
        submit(client, csrf_token, shown, card(app, shown["card_id"]).answer, 5)
    older, newer = logs(app)
    form = undo_form(shown_card(client)["page"])
    assert form["review_id"] == str(newer.id)
    assert client.post("/study/undo", data=form).status_code == 302
    again = client.post("/study/undo", data=form)  # a retried or resubmitted form
    assert again.status_code == 302 and f"card={newer.card_id}" in again.location
    assert "That review was already undone; nothing changed." in text(client.get(again.location))
    older, newer = logs(app)
    assert older.undone_at is None and newer.undone_at is not None


def test_a_stale_undo_form_lands_on_the_study_page_naming_the_latest_review_and_undoes_nothing(client, app, csrf_token):
    # It was a 409 page whose advice, "reload and try again", posted the same stale form again: another 409.
    shown = shown_card(client, "/study?deck=alpha")
    submit(client, csrf_token, shown, card(app, shown["card_id"]).answer, 5, deck="alpha")
    shown = shown_card(client, "/study?deck=alpha")
    second = card(app, shown["card_id"])
    stale = undo_form(text(submit(client, csrf_token, shown, second.answer, deck="alpha")))  # offers the first review
    submit(client, csrf_token, shown, second.answer, 4, deck="alpha")
    older, newer = logs(app)
    assert stale["review_id"] == str(older.id)
    for _ in range(2):  # sent again (a reload of a page that posted it) it is the same harmless redirect
        response = client.post("/study/undo", data=stale)
        assert response.status_code == 302 and response.location == "/study?deck=alpha"
        page = text(client.get(response.location))
        assert ('<p class="flash" role="alert" tabindex="-1">This page was out of date: a newer review came after the '
                "one it offered to undo, so nothing was undone. The latest review in Alpha deck is your grade 4 for "
                f"“{second.prompt}”; u here undoes it.</p>") in page
        assert undo_form(page)["review_id"] == str(newer.id)
    as_json = client.post("/study/undo", data=stale, headers={"Accept": "application/json"})  # an API client
    assert as_json.status_code == 409 and "a newer review came after" in as_json.get_json()["error"]
    assert [log.undone_at for log in logs(app)] == [None, None]
    assert client.post("/study/undo", data={**stale, "review_id": "x"}).status_code == 400


def test_a_stale_undo_form_with_no_review_left_to_undo_says_so(client, app, csrf_token):
    shown = shown_card(client, "/study?deck=alpha")
    submit(client, csrf_token, shown, card(app, shown["card_id"]).answer, 5, deck="alpha")
    [log] = logs(app)
    # An alpha review named by a beta session's form: beta has no review to undo.
    response = client.post("/study/undo", data={"csrf_token": csrf_token, "review_id": str(log.id), "deck": "beta"})
    assert response.status_code == 302 and response.location == "/study?deck=beta"
    assert ("This page was out of date: a newer review came after the one it offered to undo, so nothing was undone. "
            "There is no review in Beta deck to undo.") in text(client.get(response.location))
    assert logs(app)[0].undone_at is None


def test_a_grade_resubmitted_after_its_undo_says_so(client, app, csrf_token):
    shown = shown_card(client)
    right = card(app, shown["card_id"]).answer
    submit(client, csrf_token, shown, right, 5)
    client.post("/study/undo", data={"csrf_token": csrf_token})
    again = submit(client, csrf_token, shown, right, 5)  # Back, then the old grade form again
    assert again.status_code == 409 and "that answer was undone" in text(again)
    [log] = logs(app)
    assert log.undone_at is not None


def test_undo_in_a_deck_session_undoes_that_decks_latest_review(client, app, csrf_token):
    beta = shown_card(client, "/study?deck=beta")
    beta_card = card(app, beta["card_id"])
    submit(client, csrf_token, beta, beta_card.answer, 5, deck="beta")
    alpha = shown_card(client, "/study?deck=alpha")
    submit(client, csrf_token, alpha, card(app, alpha["card_id"]).answer, 5, deck="alpha")  # the latest overall
    beta_log, alpha_log = logs(app)
    assert undo_form(shown_card(client)["page"])["review_id"] == str(alpha_log.id)  # all decks: the latest overall
    question = shown_card(client, "/study?deck=beta")  # beta's second card
    answer_page = submit(client, csrf_token, question, 0, deck="beta").get_data(as_text=True)
    for page in (question["page"], answer_page):
        assert undo_form(page)["review_id"] == str(beta_log.id) and "<kbd>u</kbd> undo the last review" in page
    response = client.post("/study/undo", data=undo_form(answer_page))
    assert response.status_code == 302 and response.location.endswith(f"/study?deck=beta&card={beta_card.id}")
    again = shown_card(client, response.location)
    assert again["card_id"] == str(beta_card.id)  # shown again in this session
    assert f"Undid your grade 5 for “{beta_card.prompt}”" in html.unescape(again["page"])
    assert [log.undone_at is not None for log in logs(app)] == [True, False]
    # Beta has nothing left to undo: none is offered, and an undo sent anyway leaves alpha's review alone.
    assert 'action="/study/undo"' not in shown_card(client, "/study?deck=beta")["page"]
    bare = client.post("/study/undo", data={"csrf_token": csrf_token, "deck": "beta"})
    assert "There is no review to undo." in text(client.get(bare.location))
    assert [log.undone_at is not None for log in logs(app)] == [True, False]


def test_a_requested_card_outside_the_sessions_deck_is_not_shown_under_it(client, app):
    alpha = card(app, shown_card(client, "/study?deck=alpha")["card_id"])
    shown = shown_card(client, f"/study?deck=beta&card={alpha.id}")  # an alpha card asked for in beta's session
    assert card(app, shown["card_id"]).deck_id == "beta" and "Beta deck" in shown["page"]
    assert shown_card(client, f"/study?deck=alpha&card={alpha.id}")["card_id"] == str(alpha.id)


@pytest.fixture
def locked_app(app_config, tmp_path, bank_dir, monkeypatch):
    """The app on SQLite with a 0.2 s busy timeout, and a way to hold the database's write lock from
    another connection (what a long `bank sync` or another process's write does)."""
    import sqlite3
    from contextlib import contextmanager

    from studyapp import create_app, db
    from studyapp.sync import sync_bank

    monkeypatch.setattr(db, "SQLITE_BUSY_TIMEOUT_S", 0.2)
    path = tmp_path / "locked.sqlite3"
    app = create_app({**app_config, "DATABASE_URL": f"sqlite:///{path}"}, instance_path=str(tmp_path / "locked-instance"))
    sync_bank(get_engine(app), bank_dir)

    @contextmanager
    def write_lock_held():
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            holder.execute("ROLLBACK")
            holder.close()

    yield app, write_lock_held
    get_engine(app).dispose()


def test_a_grade_the_database_refuses_is_a_503_that_changes_nothing_not_an_edit_conflict(locked_app, caplog):
    # It was a 409 "this card changed since it was shown (another tab?)": the card had not changed.
    app, write_lock_held = locked_app
    client = app.test_client()
    token = csrf_token_of(client)
    shown = shown_card(client)
    before = card(app, shown["card_id"])
    with write_lock_held():
        refused = client.post("/study/grade", data={"csrf_token": token, "card_id": shown["card_id"],
                                                     "version": shown["version"], "choice": before.answer, "quality": 4})
    assert refused.status_code == 503
    assert ("could not be read or written (database is locked), so nothing was changed: another writer held the "
            "database past its busy timeout: try again in a moment") in text(refused)
    assert "changed since it was shown" not in text(refused)
    assert "database is locked" in caplog.text  # and the server's log has it
    assert logs(app) == [] and card(app, before.id).version == before.version
    # The same showing, sent again once the lock is gone, is recorded once.
    assert submit(client, token, shown, before.answer, 4).status_code == 302
    assert [log.card_id for log in logs(app)] == [before.id]


def test_an_undo_the_database_refuses_is_a_503_that_changes_nothing(locked_app):
    app, write_lock_held = locked_app
    client = app.test_client()
    token = csrf_token_of(client)
    shown = shown_card(client)
    answer = card(app, shown["card_id"]).answer
    assert submit(client, token, shown, answer, 4).status_code == 302
    graded = card(app, shown["card_id"])
    with write_lock_held():
        refused = client.post("/study/undo", data={"csrf_token": token}, headers={"Accept": "application/json"})
    assert refused.status_code == 503 and "database is locked" in refused.get_json()["error"]
    [log] = logs(app)
    assert log.undone_at is None and card(app, graded.id).version == graded.version
    assert client.post("/study/undo", data={"csrf_token": token}).status_code == 302
    assert logs(app)[0].undone_at is not None


def test_a_lab_run_the_database_refuses_is_a_503_not_a_bare_500(locked_app):
    app, write_lock_held = locked_app
    client = app.test_client()
    token = csrf_token_of(client)
    with write_lock_held():
        refused = client.post("/labs/what-fsdp-shards/runs", json={}, headers={"X-CSRF-Token": token})
    assert refused.status_code == 503 and "could not be read or written (database is locked)" in refused.get_json()["error"]


# --- What a screen reader and a keyboard meet -------------------------------------------


LONG_DECK = """\
id: long
title: Long deck
questions:
  - id: long-q
    prompt: {prompt}
    choices:
      - text: All three
        correct: true
      - text: None
        why_wrong: It shards them.
    explanation: All three.
    lab: what-fsdp-shards
    tags: [fsdp]
"""


def title_of(page: str) -> str:
    return html.unescape(re.search(r"<title>(.*?)</title>", page, re.S).group(1))


def test_the_answer_page_says_right_or_wrong_in_its_title_and_heading_and_focuses_the_grades(client, app, csrf_token):
    # Both said "Answer · Sharding study", and the verdict was a live region before the h1, present at load.
    shown = shown_card(client)
    c = card(app, shown["card_id"])
    wrong = next(i for i in range(len(c.choices)) if i != c.answer)
    for choice, verdict in ((c.answer, "Right"), (wrong, "Wrong")):
        page = submit(client, csrf_token, shown, choice).get_data(as_text=True)
        assert title_of(page) == f"{verdict} · Answer · Sharding study"
        heading = re.search(r"<h1[^>]*>(.*?)</h1>", page, re.S).group(1)
        assert " ".join(re.sub(r"<[^>]+>", "", html.unescape(heading)).split()) == f"{verdict}: {c.prompt}"
        assert 'role="status"' not in heading
        # The grades' group takes the focus, not a grade: Enter there would send the lowest grade offered.
        assert re.findall(r"<(\w+)[^>]*\bautofocus\b", page) == ["div"]
        assert re.search(r'<div role="group" aria-labelledby="verdict recall" tabindex="-1" autofocus', page)


def test_the_question_page_is_titled_by_its_prompt_shortened_at_a_word(client, app, tmp_path):
    assert title_of(shown_card(client)["page"]) == "What does FSDP shard that DDP replicates? · Sharding study"
    long_prompt = "Which memory categories does FSDP shard across the data-parallel ranks when it runs with full sharding?"
    sync_bank(get_engine(app), write_bank(tmp_path / "bank-long", {"long": LONG_DECK.format(prompt=long_prompt)}))
    page = shown_card(client, "/study?deck=long")["page"]
    assert title_of(page) == "Which memory categories does FSDP shard across the… · Sharding study"


@pytest.mark.parametrize("url, current", [
    ("/", "Decks"), ("/decks/alpha", "Decks"), ("/study", "Study all"), ("/study?deck=beta", "Study all"),
    ("/labs", "Labs"), ("/stats", "Stats"),
])
def test_the_nav_marks_the_current_section(client, url, current):
    nav = re.search(r'<nav class="top">(.*?)</nav>', client.get(url).get_data(as_text=True), re.S).group(1)
    marked = re.findall(r'<a [^>]*aria-current="page"[^>]*>([^<]*)', nav)
    assert [name.strip() for name in marked] == [current]


def test_a_shortcuts_kbd_is_hidden_from_its_controls_name_and_h_announces_its_key(client, app, csrf_token):
    shown = shown_card(client)
    first = card(app, shown["card_id"])
    submit(client, csrf_token, shown, first.answer, 5)
    question = shown_card(client)
    answer = submit(client, csrf_token, question, card(app, question["card_id"]).answer).get_data(as_text=True)
    for page in (question["page"], answer):
        controls = re.findall(r"<(?:button|label)\b.*?</(?:button|label)>", page, re.S)
        kbds = [kbd for control in controls for kbd in re.findall(r"<kbd[^>]*>", control)]
        assert kbds and set(kbds) == {'<kbd aria-hidden="true">'}
        assert re.search(r'<a href="/" data-key="h" aria-keyshortcuts="h"[^>]*>Decks <kbd aria-hidden="true">h</kbd></a>',
                         page)
