"""Security: CSRF on every state-changing request in the URL map, GETs that never write, a
secret key per install that stays out of the repository, user and bank text always escaped
(flashes and error messages included), downloads only by exact name from the exports folder,
and the lab runner running only registered labs."""

from __future__ import annotations

import re
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import urlencode

import pytest
from conftest import ALPHA_DECK, BETA_DECK, csrf_token_of, require_git_checkout, write_bank
from sqlmodel import Session, select
from test_fuzz_endpoints import STATE_CHANGING, fingerprint, state_changing_rules

from sharding_lab.labs.registry import LABS
from studyapp import SECRET_KEY_FILE, create_app, lab_runs
from studyapp.db import get_engine
from studyapp.models import Card, LabRun
from studyapp.sync import sync_bank

REPO = Path(__file__).resolve().parent.parent
SAMPLE_ARGS = {"lab_id": "what-fsdp-shards", "deck_id": "alpha", "question_id": "alpha-shards", "run_id": "1",
               "name": "alpha.apkg"}


def url_of(rule) -> str:
    path = rule.rule
    for arg in rule.arguments:
        path = re.sub(rf"<(?:[^:>]+:)?{arg}>", SAMPLE_ARGS.get(arg, "1"), path)  # "1": fits int and string
    return path


def valid_form(app, rule) -> dict[str, str]:
    """A form each endpoint would accept (apart from the token)."""
    if rule.rule in ("/study/answer", "/study/grade"):
        with Session(get_engine(app)) as session:
            card = session.exec(select(Card).order_by(Card.position)).first()
        return {"card_id": str(card.id), "version": str(card.version), "choice": str(card.answer), "quality": "4"}
    if rule.rule == "/labs/<lab_id>/runs":
        return {"world_size": "2"}
    return {}


# --- CSRF -------------------------------------------------------------------------------


def test_every_state_changing_request_needs_this_sessions_csrf_token(app, client, csrf_token):
    rules = state_changing_rules(app)
    assert {"/study/answer", "/study/grade", "/study/undo"} <= {r.rule for r in rules}
    other_session_token = csrf_token_of(app.test_client())
    assert other_session_token != csrf_token
    refused = 0
    for rule in rules:
        path, form = url_of(rule), valid_form(app, rule)
        for method in sorted(rule.methods & STATE_CHANGING):
            before = fingerprint(app)
            attempts = [
                ("no token", {"data": form}),
                ("a wrong token", {"data": {**form, "csrf_token": "x" * 43}}),
                ("another session's token", {"data": {**form, "csrf_token": other_session_token}}),
                ("a wrong header", {"data": form, "headers": {"X-CSRF-Token": other_session_token}}),
                ("JSON without the header", {"json": {"world_size": 2}}),
            ]
            for what, kwargs in attempts:
                response = client.open(path, method=method, **kwargs)
                assert response.status_code == 400, (method, path, what, response.status_code)
                assert "CSRF token is missing or out of date" in response.get_data(as_text=True), (path, what)
                refused += 1
            assert fingerprint(app) == before, f"{method} {path} wrote without a valid token"
            # The same request with this session's token gets past the check (so the test can fail).
            response = client.open(path, method=method, data={**form, "csrf_token": csrf_token})
            assert "CSRF token" not in response.get_data(as_text=True), (method, path, response.status_code)
    assert refused >= 5 * 4


def test_a_form_that_is_not_utf8_is_refused_as_such_not_blamed_on_the_token(app, client, csrf_token):
    # Werkzeug drops a whole form whose body is not UTF-8, token and all: it was "CSRF token is missing".
    grade_rule = next(rule for rule in state_changing_rules(app) if rule.rule == "/study/grade")
    form = urlencode({**valid_form(app, grade_rule), "csrf_token": csrf_token}).encode()
    before = fingerprint(app)
    refused = client.post("/study/grade", data=form + b"&note=caf\xe9", content_type="application/x-www-form-urlencoded",
                          headers={"Accept": "application/json"})
    assert (refused.status_code, refused.get_json()) == (400, {
        "error": "The form is not valid UTF-8: byte 0xe9 cannot start or continue a character. "
                 "Send it from the app's page, which sends UTF-8.",
        "status": 400,
    })
    assert fingerprint(app) == before
    without_token = client.post("/study/grade", data=b"note=caf\xe9", content_type="application/x-www-form-urlencoded")
    assert without_token.status_code == 400 and fingerprint(app) == before  # refused all the same
    # The same form in UTF-8 passes both checks and is graded: the body read for the check is still the form.
    graded = client.post("/study/grade", data=form + "&note=café".encode(), content_type="application/x-www-form-urlencoded")
    assert graded.status_code < 400, graded.get_data(as_text=True)
    assert fingerprint(app) != before


def test_get_requests_never_write(app, client):
    before = fingerprint(app)
    for rule in app.url_map.iter_rules():
        if "GET" in rule.methods and rule.endpoint != "static":
            assert client.get(url_of(rule)).status_code < 500, rule.rule
    assert fingerprint(app) == before


# --- The secret key ---------------------------------------------------------------------


def test_the_secret_key_lives_in_the_instance_folder_which_git_ignores(tmp_path):
    app = create_app({"DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}"}, instance_path=str(tmp_path / "instance"))
    key = app.config["SECRET_KEY"]
    assert (tmp_path / "instance" / SECRET_KEY_FILE).read_text() == key
    for path in ("/instance/secret_key", "/static/../instance/secret_key", "/static/%2e%2e/instance/secret_key"):
        assert key not in app.test_client().get(path).get_data(as_text=True)
    get_engine(app).dispose()
    require_git_checkout()  # the rest asks git what the repository tracks and ignores
    ignored = subprocess.run(["git", "check-ignore", "-q", f"instance/{SECRET_KEY_FILE}"], cwd=REPO)
    assert ignored.returncode == 0, "instance/ must be git-ignored: the key would be one `git add` from the repo"
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    assert tracked and not [p for p in tracked if Path(p).name == SECRET_KEY_FILE or p.startswith("instance/")]
    literal = subprocess.run(["git", "grep", "-nE", r"SECRET_KEY\s*=\s*['\"][0-9a-f]{32,}"], cwd=REPO, capture_output=True,
                             text=True)
    assert literal.stdout == "", f"a secret key is committed:\n{literal.stdout}"


def test_a_session_from_another_install_is_not_trusted(tmp_path, bank_dir):
    """Each install signs its sessions with its own key: a cookie (and its CSRF token) from
    another install is worthless here."""
    def install(name: str):
        app = create_app({"DATABASE_URL": f"sqlite:///{tmp_path / name}.sqlite3", "BANK_PATH": str(bank_dir)},
                         instance_path=str(tmp_path / name))
        sync_bank(get_engine(app), bank_dir)
        return app

    first, second = install("first"), install("second")
    assert first.config["SECRET_KEY"] != second.config["SECRET_KEY"]
    client = first.test_client()
    token = csrf_token_of(client)
    cookie = client.get_cookie("session")
    stranger = second.test_client()
    stranger.set_cookie("session", cookie.value, domain="localhost")
    response = stranger.post("/study/undo", data={"csrf_token": token})
    assert response.status_code == 400 and "CSRF" in response.get_data(as_text=True)
    assert client.post("/study/undo", data={"csrf_token": token}).status_code == 302  # at home it works
    for app in (first, second):
        get_engine(app).dispose()


# --- Escaping ---------------------------------------------------------------------------

SCRIPT = "<script>alert(1)</script>"


def no_live_markup(page: str) -> bool:
    return "<script>alert" not in page and "<img src=x" not in page


def test_bank_text_in_flash_messages_is_escaped(app, client, bank_dir, csrf_token):
    """Undo flashes the card's prompt back: it must arrive as text, not markup."""
    write_bank(bank_dir, {"alpha": ALPHA_DECK.replace("What does FSDP shard that DDP replicates?", f"{SCRIPT} shards?"),
                          "beta": BETA_DECK})
    sync_bank(get_engine(app), bank_dir)
    page = client.get("/study").get_data(as_text=True)
    form = dict(re.findall(r'name="(card_id|version)" value="(\d+)"', page))
    with Session(get_engine(app)) as session:
        answer = session.get(Card, int(form["card_id"])).answer
    graded = client.post("/study/grade", data={**form, "choice": answer, "quality": 4, "csrf_token": csrf_token})
    assert graded.status_code == 302
    undone = client.post("/study/undo", data={"csrf_token": csrf_token}, follow_redirects=True).get_data(as_text=True)
    assert "Undid your grade 4" in undone and "&lt;script&gt;alert(1)&lt;/script&gt; shards?" in undone
    assert no_live_markup(undone)


ECHOED = [
    ("GET", f"/study?deck={SCRIPT}", None),
    ("GET", "/decks/%3Cscript%3Ealert(1)%3C%2Fscript%3E", None),
    ("GET", "/questions/%3Cimg%20src=x%20onerror=alert(1)%3E", None),
    ("GET", "/labs/%3Cscript%3Ealert(1)%3C%2Fscript%3E", None),
    ("POST", "/labs/%3Cscript%3Ealert(1)%3C%2Fscript%3E/runs", {"world_size": "2"}),
    ("POST", "/labs/what-fsdp-shards/runs", {"world_size": SCRIPT}),
    ("POST", "/labs/what-fsdp-shards/runs", {SCRIPT: "2"}),
    ("POST", "/study/grade", {"card_id": SCRIPT, "version": "0"}),
    ("POST", "/study/answer", {"card_id": "1", "version": "0", "choice": "<img src=x onerror=alert(1)>"}),
    ("POST", "/study/undo", {"deck": SCRIPT}),
]


def test_input_echoed_in_error_messages_is_escaped(client, csrf_token):
    for method, url, data in ECHOED:
        if data is not None:
            data = {**data, "csrf_token": csrf_token}
        response = client.open(url, method=method, data=data)
        assert 400 <= response.status_code < 500, url
        page = response.get_data(as_text=True)
        assert 'class="error-message"' in page and no_live_markup(page), url
        json_response = client.open(url, method=method, json=None if data is None else data,
                                    headers={"X-CSRF-Token": csrf_token, "Accept": "application/json"})
        assert json_response.status_code < 500, url
        assert json_response.is_json or no_live_markup(json_response.get_data(as_text=True)), url  # JSON is never rendered


# --- Downloads --------------------------------------------------------------------------


OUTSIDE = b"bytes that live outside the exports folder"


@pytest.fixture
def exports(app, tmp_path):
    folder = tmp_path / "exports"
    folder.mkdir()
    (folder / "alpha.apkg").write_bytes(b"PK-alpha")
    (tmp_path / "outside.apkg").write_bytes(OUTSIDE)
    (tmp_path / "instance").mkdir(exist_ok=True)
    (tmp_path / "instance" / "secret_key").write_bytes(OUTSIDE)
    (folder / "linked.apkg").symlink_to(tmp_path / "outside.apkg")  # a link out of the folder
    return folder


TRAVERSALS = [
    "..%2foutside.apkg", "%2e%2e%2foutside.apkg", "%252e%252e%252foutside.apkg", "..%5coutside.apkg",
    "%2e%2e%5coutside.apkg", "..%2f..%2finstance%2fsecret_key", "..%2finstance%2fsecret_key", "%2fetc%2fpasswd",
    "alpha.apkg%2f..%2f..%2foutside.apkg", "%c0%ae%c0%ae%2foutside.apkg", "%uff0e%uff0e%2foutside.apkg",
    "linked.apkg", ".%2falpha.apkg", "alpha.apkg%20", "alpha.apkg.", "alpha.APKG",
]


def test_downloads_come_only_by_exact_name_from_the_exports_folder(client, exports):
    for name in TRAVERSALS:
        response = client.get(f"/exports/{name}")
        assert response.status_code == 404, name
        assert OUTSIDE not in response.data, name
    assert client.get("/exports/alpha.apkg").data == b"PK-alpha"  # the real one still downloads


# --- Lab runs ---------------------------------------------------------------------------


def test_only_registered_labs_can_be_queued(app, client, csrf_token):
    for lab_id in ("--help", "-c", "run", "not-a-lab", "what-fsdp-shards%20--world-size%2099", "what-fsdp-shards%3Brm",
                   "..%2F..%2Fbin%2Fsh", "%00", "WHAT-FSDP-SHARDS"):
        response = client.post(f"/labs/{lab_id}/runs", json={"world_size": 2}, headers={"X-CSRF-Token": csrf_token})
        assert response.status_code == 404, lab_id
    with Session(get_engine(app)) as session:
        assert session.exec(select(LabRun)).all() == []


def test_the_runner_never_starts_an_unregistered_lab_even_from_the_queue(app, tmp_path):
    """A row naming an unknown lab (a hand-edited or old database) fails without starting anything."""
    marker = tmp_path / "started"
    command = [sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    assert "--help" not in LABS
    engine = get_engine(app)
    for lab_id in ("--help", "not-a-lab", "what-fsdp-shards; touch x"):
        with pytest.raises(ValueError, match="unknown lab"):
            lab_runs.enqueue(engine, lab_id, 2)  # the queue refuses it...
        with Session(engine) as session:  # ...so put it there by hand
            run = LabRun(lab_id=lab_id, params={"world_size": 2}, created_at=datetime.now(timezone.utc))
            session.add(run)
            session.commit()
            session.refresh(run)
        claimed = lab_runs.claim_next(engine)
        assert claimed.id == run.id
        outcome = lab_runs.execute(engine, claimed, command, timeout_s=10)
        assert outcome.status == "failed" and "unknown lab" in outcome.error
    assert not marker.exists()
    with Session(engine) as session:
        assert {r.status for r in session.exec(select(LabRun)).all()} == {"failed"}
