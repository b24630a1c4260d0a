"""The token login (studyapp.auth) through Flask's test client: with REQUIRE_LOGIN every route
refuses without a login, the token URL and the form log in, rotation ends every session, failed
logins and lab runs are rate-limited (on a clock the test moves), and the security headers
(studyapp.headers) are on every response. Loopback-only serving keeps no login. The same
against a real server bound to 0.0.0.0: test_auth_server.py."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import require_git_checkout

from studyapp import auth, create_app
from studyapp.headers import HEADERS

REPO = Path(__file__).resolve().parent.parent
FAKE_LAB = Path(__file__).parent / "data" / "fake_sharding_lab.py"
SAMPLE_ARGS = {"lab_id": "what-fsdp-shards", "deck_id": "alpha", "question_id": "alpha-shards", "run_id": "1",
               "name": "alpha.apkg", "filename": "style.css"}


class Seconds:
    """The limiters' monotonic clock, moved by the test."""

    def __init__(self):
        self.now = 5000.0

    def __call__(self) -> float:
        return self.now


class Random:
    """TOKEN_RANDOM: distinct, known bytes on each call."""

    def __init__(self):
        self.calls = 0

    def __call__(self, n: int) -> bytes:
        self.calls += 1
        return bytes([self.calls]) * n


@pytest.fixture
def seconds() -> Seconds:
    return Seconds()


@pytest.fixture
def app_config(app_config: dict, seconds: Seconds) -> dict:
    return {**app_config, "REQUIRE_LOGIN": True, "RATE_LIMIT_CLOCK": seconds, "TOKEN_RANDOM": Random(),
            "LOGIN_ATTEMPTS": 3, "LOGIN_WINDOW_S": 600, "LAB_RUNS_PER_SESSION": 2, "LAB_RUNS_WINDOW_S": 300,
            "LAB_COMMAND": [sys.executable, str(FAKE_LAB)]}


def token_of(app) -> str:
    return Path(app.instance_path, auth.TOKEN_FILE).read_text().strip()


def logged_in_client(app, address: str = "127.0.0.1"):
    client = app.test_client()
    client.environ_base["REMOTE_ADDR"] = address
    response = client.get(f"/login?token={token_of(app)}")
    assert response.status_code == 303, response.status_code
    return client


def csrf_of(client, path: str = "/") -> str:
    return re.search(r'name="csrf_token" value="([^"]+)"|name="csrf-token" content="([^"]+)"',
                     client.get(path).get_data(as_text=True)).group(0).split('"')[-2]


def url_of(rule) -> str:
    path = rule.rule
    for arg in rule.arguments:
        path = re.sub(rf"<(?:[^:>]+:)?{arg}>", SAMPLE_ARGS.get(arg, "1"), path)
    return path


# --- Every route refuses without a login -----------------------------------------------------


def test_every_route_refuses_without_a_login(app, client):
    checked = 0
    for rule in app.url_map.iter_rules():
        if rule.endpoint == "auth.login":
            continue
        for method in sorted(rule.methods - {"OPTIONS"}):
            path = url_of(rule)
            page = client.open(path, method=method)
            if rule.endpoint in auth.JSON_ENDPOINTS:  # JSON APIs whatever the Accept header
                assert page.status_code == 401, (method, path, page.status_code)
            else:
                assert page.status_code in (302, 303), (method, path, page.status_code)
                assert page.headers["Location"].startswith("/login"), (method, path)
            data = client.open(path, method=method, headers={"Accept": "application/json"})
            assert data.status_code == 401, (method, path, data.status_code)
            if method != "HEAD":
                assert data.get_json()["status"] == 401
            checked += 1
    assert checked >= 15
    assert client.get("/no/such/page").status_code == 302, "an unknown URL says nothing before a login"
    assert client.get("/static/login.css").status_code == 200, "the login page's own stylesheet is open"
    assert client.get("/static/favicon.svg").status_code == 200, "and its icon"
    assert client.get("/static/style.css").status_code == 302, "but no other static file"
    assert client.get("/login").status_code == 200


def test_a_page_asked_for_comes_back_after_the_login(app, client):
    response = client.get("/decks/alpha?x=1")
    assert response.headers["Location"] == "/login?next=/decks/alpha?x%3D1"
    login = client.get(f"/login?token={token_of(app)}&next=/decks/alpha?x%3D1")
    assert login.headers["Location"] == "/decks/alpha?x=1"
    for elsewhere in ("//evil.example/", "https://evil.example/", "/\\evil.example", "/\t/evil.example",
                      "/\n/evil.example", "/\r\n/x", "/\x7f/evil.example"):
        login = app.test_client().get("/login", query_string={"token": token_of(app), "next": elsewhere})
        assert login.headers["Location"] == "/", elsewhere


# --- Logging in ------------------------------------------------------------------------------


def test_the_token_url_sets_a_strict_httponly_cookie_and_leaves_the_address_bar(app, client):
    token = token_of(app)
    assert re.fullmatch(r"[0-9a-f]{48}", token), "192 random bits, hex"
    assert token == (bytes([1]) * auth.TOKEN_BYTES).hex(), "from the injected randomness"
    response = client.get(f"/login?token={token}")
    assert response.status_code == 303 and response.headers["Location"] == "/"
    assert token not in response.headers["Location"]
    cookie = response.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert token not in cookie, "the session keeps a fingerprint, never the token"
    assert response.headers["Referrer-Policy"] == "no-referrer"
    assert client.get("/").status_code == 200
    assert "Log out" in client.get("/stats").get_data(as_text=True)


def test_typing_the_token_on_the_login_page_logs_in(app, client):
    page = client.get("/login").get_data(as_text=True)
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)
    assert client.post("/login", data={"token": "nope", "csrf_token": csrf}).status_code == 401
    assert client.post("/login", data={"token": token_of(app)}).status_code == 400, "CSRF as on every POST"
    response = client.post("/login", data={"token": f" {token_of(app)} ", "csrf_token": csrf, "next": "/stats"})
    assert response.status_code == 303 and response.headers["Location"] == "/stats"
    assert client.get("/stats").status_code == 200
    assert client.post("/logout", data={"csrf_token": csrf_of(client)}).status_code == 303
    assert client.get("/stats").status_code == 302, "logged out"


def test_the_token_file_is_owner_only_and_git_ignored(app):
    path = Path(app.instance_path, auth.TOKEN_FILE)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    path.chmod(0o644)
    assert auth.token_store(app).ensure() == (token_of(app), False), "made once, kept"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600, "a looser copy is tightened"
    require_git_checkout()
    ignored = subprocess.run(["git", "check-ignore", "-q", f"instance/{auth.TOKEN_FILE}"], cwd=REPO)
    assert ignored.returncode == 0, "instance/login_token must be git-ignored"


def test_an_empty_token_file_is_replaced_never_taken_as_the_empty_token(app_config, tmp_path):
    # A first start cut off (or a full disk) between creating the file and writing the token.
    instance = tmp_path / "cut-off"
    instance.mkdir()
    (instance / auth.TOKEN_FILE).write_text("")
    app = create_app(app_config, instance_path=str(instance))
    client = app.test_client()
    assert client.get("/login?token=").status_code == 401, "the empty token logs nobody in"
    assert client.get("/").status_code == 302
    assert token_of(app) == "01" * auth.TOKEN_BYTES, "a new token, from the first injected randomness"
    assert client.get(f"/login?token={'01' * auth.TOKEN_BYTES}").status_code == 303
    assert client.get("/static/keys.js").status_code == 200


def test_a_token_file_that_is_not_ascii_is_refused_naming_it_and_deleting_it_mends_it(app_config, tmp_path):
    # It was a UnicodeDecodeError traceback from building the app with the login on.
    instance = tmp_path / "edited"
    instance.mkdir()
    token_file = instance / auth.TOKEN_FILE
    token_file.write_bytes("  café\n".encode())
    with pytest.raises(auth.TokenFileError) as refused:
        create_app(app_config, instance_path=str(instance))
    assert str(refused.value) == (f"{token_file}: the login token file is not ASCII (byte 0xc3 at offset 5), and a "
                                  "token is hex digits: delete the file, and `studyapp token` makes a new one")
    token_file.unlink()
    app = create_app(app_config, instance_path=str(instance))
    assert token_of(app) == "01" * auth.TOKEN_BYTES


def test_a_token_file_damaged_while_serving_is_a_503_that_says_what_to_do_and_the_log_names_it(app, caplog):
    phone = logged_in_client(app, "10.0.0.2")
    assert phone.get("/").status_code == 200
    token_file = Path(app.instance_path, auth.TOKEN_FILE)
    token_file.write_bytes("caf\u00e9\n".encode())  # edited by hand while the server runs
    page = phone.get("/")
    assert page.status_code == 503
    assert ("The server&#39;s login token file is damaged, so no one can log in: its owner must delete "
            "instance/login_token") in page.get_data(as_text=True)
    assert str(token_file) not in page.get_data(as_text=True)  # the instance's path stays in the log
    assert f"{token_file}: the login token file is not ASCII (byte 0xc3 at offset 3)" in caplog.text
    status = phone.get("/labs/runs/1")  # a JSON route answers in JSON
    assert status.status_code == 503 and status.get_json()["error"].startswith("The server's login token file is damaged")
    token_file.unlink()
    assert phone.get("/").status_code == 302  # no token: logged out, not an error


def test_rotation_ends_every_session_and_only_the_new_token_logs_in(app, runner):
    old = token_of(app)
    phone, desk = logged_in_client(app, "10.0.0.2"), logged_in_client(app, "10.0.0.3")
    assert phone.get("/").status_code == desk.get("/").status_code == 200
    result = runner.invoke(args=["token", "--rotate"])
    assert result.exit_code == 0, result.output
    new = token_of(app)
    assert new != old and f"token={new}" in result.output
    assert stat.S_IMODE(Path(app.instance_path, auth.TOKEN_FILE).stat().st_mode) == 0o600
    assert phone.get("/").status_code == desk.get("/").status_code == 302, "every session ended"
    assert phone.get("/labs/runs/1", headers={"Accept": "application/json"}).status_code == 401
    assert phone.get(f"/login?token={old}").status_code == 401
    assert phone.get(f"/login?token={new}").status_code == 303 and phone.get("/").status_code == 200
    assert f"token={new}" in runner.invoke(args=["token"]).output, "`token` prints the current URL"
    assert f":{app.config['PORT']}/login?token={new}" in runner.invoke(args=["token"]).output
    assert f":8123/login?token={new}" in runner.invoke(args=["token", "--port", "8123"]).output, "as `serve --port`"


def test_a_session_from_another_install_is_not_logged_in(app, tmp_path, app_config):
    other = create_app({**app_config, "SECRET_KEY": "another-secret"}, instance_path=app.instance_path)
    client = other.test_client()
    client.get(f"/login?token={token_of(app)}")
    stolen = client.get_cookie("session").value
    visitor = app.test_client()
    visitor.set_cookie("session", stolen)
    assert visitor.get("/").status_code == 302


def test_a_bytes_secret_key_logs_in_as_a_text_one_does(app_config, tmp_path):
    # Flask takes SECRET_KEY = os.urandom(24) in instance/config.py; the login fingerprint must too.
    app = create_app({**app_config, "SECRET_KEY": bytes(range(24))}, instance_path=str(tmp_path / "bytes-key"))
    client = app.test_client()
    assert client.get(f"/login?token={token_of(app)}").status_code == 303
    assert client.get("/static/keys.js").status_code == 200, "logged in"


# --- Brute force -------------------------------------------------------------------------------


def test_failed_logins_are_limited_per_client_with_the_count_in_each_answer(app, seconds):
    guesser = app.test_client()
    guesser.environ_base["REMOTE_ADDR"] = "10.0.0.66"
    for attempt in (1, 2, 3):
        response = guesser.get(f"/login?token={'0' * 48}")
        assert response.status_code == 401
        assert response.headers["X-Login-Attempts"] == str(attempt)
        assert f"attempt {attempt} of 3" in response.get_data(as_text=True)
    refused = guesser.get(f"/login?token={token_of(app)}")
    assert refused.status_code == 429, "past the limit even the right token is not compared"
    assert refused.headers["Retry-After"] == "600"
    assert "Try again in 600 s" in refused.get_data(as_text=True)
    assert refused.headers["X-Login-Attempts"] == "3"
    assert logged_in_client(app, "10.0.0.7").get("/").status_code == 200, "another client is not locked out"
    seconds.now += 599
    assert guesser.get(f"/login?token={token_of(app)}").headers["Retry-After"] == "1"
    seconds.now += 1
    assert guesser.get(f"/login?token={token_of(app)}").status_code == 303, "the window has passed"


def test_links_another_site_opens_never_lock_out_the_typed_form(app, seconds):
    # Another site can make the owner's browser GET /login?token=x (an <img>), never POST the
    # CSRF-checked form: the links' limit locks links only.
    owner = app.test_client()
    owner.environ_base["REMOTE_ADDR"] = "10.0.0.8"
    for _ in range(3):
        assert owner.get(f"/login?token={'0' * 48}").status_code == 401
    link = owner.get(f"/login?token={token_of(app)}")
    assert link.status_code == 429, "links past their limit"
    assert "Typing the token below is counted apart, and still works." in link.get_data(as_text=True)
    typed = owner.post("/login", data={"token": token_of(app), "csrf_token": csrf_of(owner, "/login")})
    assert typed.status_code == 303 and owner.get("/").status_code == 200, "the typed token logs in"


def test_typed_tokens_have_their_own_limit_and_a_login_clears_both(app, seconds):
    guesser = app.test_client()
    guesser.environ_base["REMOTE_ADDR"] = "10.0.0.9"
    csrf = csrf_of(guesser, "/login")
    answers = [guesser.post("/login", data={"token": "0" * 48, "csrf_token": csrf}) for _ in range(4)]
    assert [a.status_code for a in answers] == [401, 401, 401, 429]
    assert "attempt 3 of 3 typed" in answers[2].get_data(as_text=True)
    assert "Too many failed typed tokens" in answers[3].get_data(as_text=True)
    wrong_link = guesser.get(f"/login?token={'0' * 48}")
    assert wrong_link.status_code == 401 and wrong_link.headers["X-Login-Attempts"] == "1", "links count apart"
    assert guesser.get(f"/login?token={token_of(app)}").status_code == 303
    guesser.post("/logout", data={"csrf_token": csrf_of(guesser, "/")})
    csrf = csrf_of(guesser, "/login")
    after = guesser.post("/login", data={"token": "0" * 48, "csrf_token": csrf})
    assert after.status_code == 401 and after.headers["X-Login-Attempts"] == "1", "the login cleared the form's count"


def test_a_wrong_token_gets_the_same_answer_whatever_session_it_carries(app, runner):
    def wrong_token_answer(client, address: str):
        client.environ_base["REMOTE_ADDR"] = address  # each its first attempt
        response = client.get("/login?token=" + "f" * 48)
        body = re.sub(r'value="[^"]+"', 'value="CSRF"', response.get_data(as_text=True))
        headers = {k: v for k, v in response.headers if k not in ("Set-Cookie", "Vary", "Content-Length")}
        return response.status_code, headers, body

    anonymous = app.test_client()
    fresh = app.test_client()
    fresh.get("/login")  # a session with a CSRF token only
    logged = logged_in_client(app, "10.0.1.1")
    ended = logged_in_client(app, "10.0.1.2")
    runner.invoke(args=["token", "--rotate"])
    still = logged_in_client(app, "10.0.1.3")
    answers = [wrong_token_answer(c, f"10.0.2.{i}") for i, c in enumerate([anonymous, fresh, logged, ended, still])]
    assert answers[0][0] == 401
    assert all(answer == answers[0] for answer in answers), "the answer differs with the session sent"


def test_the_proxys_forwarded_headers_count_only_when_it_is_trusted(app_config, tmp_path):
    forwarded = {"X-Forwarded-Proto": "https", "X-Forwarded-For": "203.0.113.9"}
    plain = create_app({**app_config, "REQUIRE_LOGIN": False}, instance_path=str(tmp_path / "plain"))
    response = plain.test_client().get("/", headers=forwarded)
    assert response.status_code == 200 and "Strict-Transport-Security" not in response.headers

    proxied = create_app({**app_config, "REQUIRE_LOGIN": False, "TRUST_PROXY": True},
                         instance_path=str(tmp_path / "proxied"))
    client = proxied.test_client()
    response = client.get("/", headers=forwarded)
    assert response.status_code == 302, "behind a proxy clients are remote: login required"
    assert response.headers["Strict-Transport-Security"] == "max-age=31536000"
    assert response.headers["Location"].startswith("/login")
    for _ in range(3):
        client.get("/login?token=x", headers=forwarded)
    assert client.get("/login?token=x", headers=forwarded).status_code == 429, "limited by the forwarded address"
    other = {**forwarded, "X-Forwarded-For": "203.0.113.10"}
    assert client.get("/login?token=x", headers=other).status_code == 401


# --- Lab runs --------------------------------------------------------------------------------


def test_lab_runs_are_limited_per_session_with_a_429_that_says_when(app, seconds):
    phone = logged_in_client(app)
    csrf = csrf_of(phone)
    headers = {"X-CSRF-Token": csrf, "Accept": "application/json"}
    statuses = [phone.post("/labs/what-fsdp-shards/runs", json={"world_size": 2}, headers=headers).status_code
                for _ in range(2)]
    assert statuses == [202, 202]
    refused = phone.post("/labs/what-fsdp-shards/runs", json={"world_size": 2}, headers=headers)
    assert refused.status_code == 429
    assert refused.headers["Retry-After"] == "300"
    body = refused.get_json()
    assert body["retry_after_s"] == 300 and "Try again in 300 s" in body["error"]
    form = phone.post("/labs/what-fsdp-shards/runs", data={"world_size": "2", "csrf_token": csrf})
    assert form.status_code == 429 and "Try again in 300 s" in form.get_data(as_text=True)
    desk = logged_in_client(app)
    assert desk.post("/labs/what-fsdp-shards/runs", json={"world_size": 2},
                     headers={"X-CSRF-Token": csrf_of(desk)}).status_code == 202, "each session its own limit"
    seconds.now += 300
    assert phone.post("/labs/what-fsdp-shards/runs", json={"world_size": 2}, headers=headers).status_code == 202


def test_serving_on_loopback_has_no_login_and_no_lab_limit(app_config, tmp_path):
    app = create_app({**app_config, "REQUIRE_LOGIN": False}, instance_path=str(tmp_path / "loopback"))
    client = app.test_client()
    assert client.get("/").status_code == 200
    assert client.get("/login").status_code == 302
    assert not Path(app.instance_path, auth.TOKEN_FILE).exists(), "no token without a login"
    assert "Log out" not in client.get("/").get_data(as_text=True)
    csrf = csrf_of(client)
    statuses = {client.post("/labs/what-fsdp-shards/runs", json={"world_size": 2},
                            headers={"X-CSRF-Token": csrf}).status_code for _ in range(4)}
    assert statuses == {202}


# --- Headers ---------------------------------------------------------------------------------


def test_security_headers_on_every_response(app, client):
    logged = logged_in_client(app)
    responses = [
        client.get("/"), client.get("/login"), client.get("/static/login.css"), client.get("/labs/runs/1"),
        client.get("/login?token=bad"), logged.get("/"), logged.get("/stats"), logged.get("/static/keys.js"),
        logged.get("/no/such/page"), logged.get("/labs/runs/999"), logged.post("/study/grade"),
        logged.get("/labs/what-fsdp-shards"), logged.get("/exports/nothing.apkg"),
    ]
    for response in responses:
        for name, value in HEADERS.items():
            assert response.headers.get(name) == value, (response.request.path, name)
    csp = HEADERS["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "style-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert "unsafe-inline" not in csp
    assert "Strict-Transport-Security" not in responses[0].headers, "not over plain HTTP"


def test_no_template_has_inline_script_style_or_event_handlers():
    templates = Path(auth.__file__).parent / "templates"
    for path in templates.rglob("*.html"):
        text = path.read_text()
        assert not re.search(r"<script(?![^>]*\ssrc=)[^>]*>", text), f"{path}: an inline script"
        assert not re.search(r"<style\b|\sstyle=|\son[a-z]+=|javascript:", text, re.I), f"{path}: inline style or handler"


# --- Addresses and logs -------------------------------------------------------------------------


@pytest.mark.parametrize("host, loopback", [
    ("127.0.0.1", True), ("127.0.0.2", True), ("::1", True), ("[::1]", True), ("localhost", True),
    ("0.0.0.0", False), ("::", False), ("192.168.1.20", False), ("10.0.0.5", False),
])
def test_what_counts_is_the_address_bound(host, loopback):
    assert auth.is_loopback(host) is loopback


def test_the_login_line_carries_the_url_and_the_lan_addresses():
    found = ["127.0.0.1", "192.168.1.20", "169.254.3.3", "10.0.0.5", "192.168.1.20", "fe80::1", "2001:db8::5"]
    assert auth.lan_addresses("0.0.0.0", resolve=lambda: found) == ["192.168.1.20", "10.0.0.5"]
    assert auth.lan_addresses("::", resolve=lambda: found) == ["192.168.1.20", "10.0.0.5", "2001:db8::5"]
    assert auth.lan_addresses("10.0.0.5", resolve=lambda: found) == ["10.0.0.5"]
    line = auth.login_line("0.0.0.0", 5000, "ab" * 24, ["192.168.1.20", "10.0.0.5"])
    assert "\n" not in line
    assert f"http://192.168.1.20:5000/login?token={'ab' * 24}" in line and "192.168.1.20, 10.0.0.5" in line
    assert auth.login_url("2001:db8::5", 80) == "http://[2001:db8::5]:80/login"


def test_the_access_log_never_shows_the_token():
    line = '"GET /login?token=0123abcd&next=/stats HTTP/1.1" 303 -'
    assert auth.redact(line) == '"GET /login?token=[redacted]&next=/stats HTTP/1.1" 303 -'
    # Spellings werkzeug also reads as the token field, a case that does not log in, and the token
    # inside an encoded `next`: each keeps its key and loses its value.
    for key in ("%74oken", "tok%65n", "%54%4F%4b%45%6e", "Token", "TOKEN"):
        assert auth.redact(f"GET /login?{key}=0123abcd&next=/ HTTP/1.1") == f"GET /login?{key}=[redacted]&next=/ HTTP/1.1"
    assert auth.redact("GET /login?next=/stats?token%3D0123abcd HTTP/1.1") == "GET /login?next=/stats?token%3D[redacted] HTTP/1.1"
    assert os.path.basename(auth.TOKEN_FILE) == auth.TOKEN_FILE


def test_the_access_log_writes_each_request_on_its_own_line_however_many_threads_serve():
    # print() wrote each line and its newline in two writes, so lines from concurrent requests ran together.
    import threading
    import time as clock

    from studyapp.cli.serve import AccessLog

    class SlowStream:  # a write that gives up the GIL, as a terminal's or a pipe's can
        def __init__(self) -> None:
            self.writes: list[str] = []

        def write(self, text: str) -> None:
            clock.sleep(0.0005)
            self.writes.append(text)

        def flush(self) -> None:
            pass

    stream = SlowStream()
    logged = AccessLog(lambda environ, start_response: start_response("200 OK", []) or [b""], stream=stream)

    def serve(n: int) -> None:
        for i in range(25):
            logged({"REQUEST_METHOD": "GET", "PATH_INFO": f"/t{n}/{i}", "SERVER_PROTOCOL": "HTTP/1.1",
                    "REMOTE_ADDR": "127.0.0.1"}, lambda *args: None)

    threads = [threading.Thread(target=serve, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    lines = "".join(stream.writes).split("\n")
    assert lines[-1] == "" and len(lines) == 8 * 25 + 1
    assert all(line.count('"GET ') == 1 and line.endswith(" 200 -") for line in lines[:-1])


def test_an_encoded_token_field_logs_in_and_never_reaches_the_access_log(app, tmp_path):
    from studyapp.cli.serve import AccessLog  # the web app's serve command, no server started

    logged = tmp_path / "access.log"
    with logged.open("w") as stream:
        app.wsgi_app = AccessLog(app.wsgi_app, stream=stream)
        response = app.test_client().get(f"/login?%74oken={token_of(app)}&next=/stats")
    assert response.status_code == 303 and response.headers["Location"] == "/stats", "werkzeug decodes the key"
    line = logged.read_text()
    assert "%74oken=[redacted]&next=/stats" in line and token_of(app) not in line
