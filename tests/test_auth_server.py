"""The token login on a real `studyapp serve` process bound to 0.0.0.0, with every request sent
to 127.0.0.1 (never to another address): what counts is the address bound, so loopback clients
must log in too. Every route refuses without a session (pages redirect to the login, JSON gets
401); the URL printed at the first start logs in; rotation logs everyone out; failed logins and
lab runs hit their limits; every response carries the security headers; the token shows up in
the server's output only in that one first-start line. The figures go to reliability-auth.json
(see live_server.record_figures) for the README's reliability and security section."""

from __future__ import annotations

import http.client
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from urllib.parse import urlencode, urlsplit

import pytest
from conftest import write_bank
from live_server import ServerProcess, record_figures
from test_auth import url_of

from studyapp import auth, create_app
from studyapp.headers import HEADERS

pytestmark = pytest.mark.slow  # real server processes

FAKE_LAB = Path(__file__).parent / "data" / "fake_sharding_lab.py"
LOGIN_ATTEMPTS = 5
LAB_RUNS_PER_SESSION = 2
ROTATE = """
import sys
from flask.cli import ScriptInfo
from studyapp import create_app
from studyapp.cli import main
app = create_app({"DATABASE_URL": sys.argv[1]}, instance_path=sys.argv[2])
main(["token", "--rotate"], obj=ScriptInfo(create_app=lambda: app), standalone_mode=True)
"""


class Seen:
    """Every response the module's clients got: statuses and whether the security headers were on it."""

    def __init__(self):
        self.responses = 0
        self.missing_headers: list[str] = []
        self.statuses: Counter = Counter()


SEEN = Seen()
FIGURES: dict[str, dict] = {}


class Browser:
    """One client of the server: a session cookie, requests to 127.0.0.1 only."""

    def __init__(self, base_url: str):
        parts = urlsplit(base_url)
        assert parts.hostname == "127.0.0.1", "traffic goes to loopback only"
        self.port = parts.port
        self.cookie = ""

    def request(self, method: str, path: str, *, headers: dict | None = None, form: dict | None = None,
                json_body: dict | None = None) -> tuple[int, dict[str, str], str]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        sent = {"Cookie": self.cookie, **(headers or {})}
        body = None
        if form is not None:
            body = urlencode(form)
            sent["Content-Type"] = "application/x-www-form-urlencoded"
        elif json_body is not None:
            body = json.dumps(json_body)
            sent["Content-Type"] = "application/json"
        try:
            connection.request(method, path, body, sent)
            response = connection.getresponse()
            text = response.read().decode(errors="replace")
            got = {name: value for name, value in response.getheaders()}
        finally:
            connection.close()
        if cookie := got.get("Set-Cookie"):
            self.cookie = cookie.split(";")[0] if cookie.split(";")[0] != "session=" else ""
        SEEN.responses += 1
        SEEN.statuses[response.status] += 1
        SEEN.missing_headers += [f"{method} {path}: {name}" for name, value in HEADERS.items() if got.get(name) != value]
        return response.status, got, text

    def csrf(self) -> str:
        page = self.request("GET", "/")[2]
        return re.search(r'name="csrf-token" content="([^"]+)"', page).group(1)


def start_beyond_loopback(folder: Path, **config) -> ServerProcess:
    server = ServerProcess(folder, f"sqlite:///{folder / 'study.sqlite3'}", write_bank(folder / "bank"), host="0.0.0.0")
    server.config.update({"LAB_COMMAND": [sys.executable, str(FAKE_LAB)], "LOGIN_ATTEMPTS": LOGIN_ATTEMPTS,
                          "LAB_RUNS_PER_SESSION": LAB_RUNS_PER_SESSION, **config})
    server.start()
    return server


def printed_login_path(server: ServerProcess) -> tuple[str, str]:
    """(the token, the path and query of the URL the first start printed). Its host is a LAN
    address; the test sends it to 127.0.0.1 instead."""
    lines = [line for line in server.log().splitlines() if line.startswith("login required: open ")]
    assert len(lines) == 1, server.log()
    url = urlsplit(lines[0].split()[3])
    assert url.path == "/login" and url.hostname != "127.0.0.1"
    token = re.fullmatch(r"token=([0-9a-f]{48})", url.query).group(1)
    return token, f"{url.path}?{url.query}"


def every_route(folder: Path) -> list[tuple[str, str, str]]:
    """(endpoint, method, sample path) for every rule and method of the app's URL map but the login."""
    app = create_app({"DATABASE_URL": f"sqlite:///{folder / 'map.sqlite3'}", "SECRET_KEY": "map"},
                     instance_path=str(folder / "map-instance"))
    return [(rule.endpoint, method, url_of(rule)) for rule in app.url_map.iter_rules()
            if rule.endpoint != "auth.login" for method in sorted(rule.methods - {"OPTIONS"})]


def test_bound_to_all_addresses_every_route_needs_the_printed_token(tmp_path):
    server = start_beyond_loopback(tmp_path)
    try:
        token, login_path = printed_login_path(server)
        instance_token = tmp_path / "instance" / auth.TOKEN_FILE
        assert instance_token.read_text().strip() == token
        assert instance_token.stat().st_mode & 0o077 == 0, "owner-only"

        # Without a session every route refuses: pages to the login page, JSON with 401.
        stranger = Browser(server.url)
        routes = every_route(tmp_path)
        redirected = answered_401 = 0
        for endpoint, method, path in routes:
            status, headers, _ = stranger.request(method, path)
            if endpoint in auth.JSON_ENDPOINTS:  # JSON APIs whatever the Accept header
                assert status == 401, (method, path, status)
                answered_401 += 1
            else:
                assert status in (302, 303) and headers["Location"].startswith("/login"), (method, path, status)
                redirected += 1
            status, _, body = stranger.request(method, path, headers={"Accept": "application/json"})
            assert status == 401, (method, path, status)
            if method != "HEAD":
                assert json.loads(body)["status"] == 401
            answered_401 += 1
        assert stranger.request("GET", "/static/login.css")[0] == 200, "the login page's own stylesheet"
        assert stranger.request("GET", "/login")[0] == 200

        # The printed URL logs in; the token leaves the address bar; the cookie is strict.
        phone = Browser(server.url)
        status, headers, _ = phone.request("GET", login_path)
        assert status == 303 and headers["Location"] == "/" and token not in headers["Location"]
        assert "HttpOnly" in headers["Set-Cookie"] and "SameSite=Strict" in headers["Set-Cookie"]
        assert headers["Referrer-Policy"] == "no-referrer"
        opened = {path: phone.request(method, path)[0] for _, method, path in routes if method == "GET"}
        assert not {path: s for path, s in opened.items() if s in (302, 303, 401)}, "past the login now"
        assert opened["/"] == opened["/stats"] == opened["/static/style.css"] == 200

        # Lab runs: LAB_RUNS_PER_SESSION, then a 429 that says when to retry.
        csrf = {"X-CSRF-Token": phone.csrf(), "Accept": "application/json"}
        started = [phone.request("POST", "/labs/what-fsdp-shards/runs", headers=csrf, json_body={"world_size": 2})
                   for _ in range(LAB_RUNS_PER_SESSION + 2)]
        assert [status for status, _, _ in started] == [202] * LAB_RUNS_PER_SESSION + [429, 429]
        status, headers, body = started[-1]
        assert int(headers["Retry-After"]) > 0
        assert json.loads(body)["retry_after_s"] == int(headers["Retry-After"])
        assert f"Try again in {headers['Retry-After']} s" in json.loads(body)["error"]
        lab_runs_limited = sum(status == 429 for status, _, _ in started)

        # Rotation (the CLI, in its own process) ends every session in the running server.
        desk = Browser(server.url)
        desk.request("GET", login_path)
        assert phone.request("GET", "/")[0] == desk.request("GET", "/")[0] == 200
        rotated = subprocess.run([sys.executable, "-c", ROTATE, server.config["DATABASE_URL"], str(tmp_path / "instance")],
                                 capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert rotated.returncode == 0, rotated.stderr
        new_token = instance_token.read_text().strip()
        assert new_token != token and f"token={new_token}" in rotated.stdout
        ended = [browser.request("GET", "/")[0] for browser in (phone, desk)]
        assert ended == [302, 302], "every session ended"
        assert phone.request("GET", "/labs/runs/1")[0] == 401
        assert phone.request("GET", login_path)[0] == 401, "the old token no longer logs in"
        status, _, _ = phone.request("GET", f"/login?token={new_token}")
        assert status == 303 and phone.request("GET", "/")[0] == 200

        # A restart prints where to log in, without the token; no request line ever shows a token.
        server.stop()
        phone.port = urlsplit(server.start()).port  # a new port
        assert "login required: http://" in server.log() and token not in server.log() and new_token not in server.log()
        # On a port other than PORT the hint names it: `studyapp token` alone printed a 5000 URL.
        assert f"(`studyapp token --port {phone.port}` prints the URL with the token)" in server.log()
        assert phone.request("GET", "/")[0] == 200, "sessions outlive a restart"
    finally:
        server.stop()
    first_log = (tmp_path / "server-1.log").read_text()
    token_lines = [line for line in first_log.splitlines() if token in line]
    assert token_lines == [line for line in first_log.splitlines() if line.startswith("login required: open ")]
    assert new_token not in first_log
    assert "/login?token=[redacted]" in first_log, "the request lines were logged, redacted"
    FIGURES["routes"] = {
        "routes_checked": len({(method, path) for _, method, path in routes}),
        "refused_redirected_to_login": redirected,
        "refused_json_401": answered_401,
        "lab_runs_accepted": LAB_RUNS_PER_SESSION,
        "lab_runs_rate_limited_429": lab_runs_limited,
        "sessions_ended_by_rotation": ended.count(302),
    }


def test_failed_logins_are_rate_limited_per_client(tmp_path):
    server = start_beyond_loopback(tmp_path)
    try:
        token, login_path = printed_login_path(server)
        before = Browser(server.url)
        before.request("GET", login_path)
        guesser = Browser(server.url)
        wrong = []
        for attempt in range(1, LOGIN_ATTEMPTS + 1):
            status, headers, body = guesser.request("GET", f"/login?token={'0' * 48}")
            assert status == 401 and headers["X-Login-Attempts"] == str(attempt), (attempt, status)
            assert f"attempt {attempt} of {LOGIN_ATTEMPTS}" in body
            wrong.append(status)
        csrf = re.search(r'name="csrf_token" value="([^"]+)"', guesser.request("GET", "/login")[2]).group(1)
        limited = [
            guesser.request("GET", f"/login?token={'1' * 48}"),
            guesser.request("GET", login_path),  # the right token too: past the limit nothing is compared
        ]
        # The typed form counts apart (another site can open links, never post the form).
        for attempt in range(1, LOGIN_ATTEMPTS + 1):
            status, headers, body = guesser.request("POST", "/login", form={"token": "2" * 48, "csrf_token": csrf})
            assert status == 401 and f"attempt {attempt} of {LOGIN_ATTEMPTS} typed" in body, (attempt, status)
        limited.append(guesser.request("POST", "/login", form={"token": token, "csrf_token": csrf}))
        for status, headers, body in limited:
            assert status == 429 and int(headers["Retry-After"]) > 0
            assert f"Try again in {headers['Retry-After']} s" in body
        assert guesser.request("GET", "/")[0] == 302, "still not logged in"
        assert before.request("GET", "/")[0] == 200, "a session from before is not touched"
    finally:
        server.stop()
    FIGURES["logins"] = {
        "wrong_tokens_refused_401": len(wrong),
        "logins_rate_limited_429": len(limited),
    }


def test_every_response_had_the_security_headers_and_the_figures_are_recorded(tmp_path_factory):
    if set(FIGURES) != {"routes", "logins"}:
        pytest.skip("the figures come from the whole file: run it whole")
    assert SEEN.missing_headers == [], SEEN.missing_headers[:10]
    assert not [status for status in SEEN.statuses if status >= 500]
    record_figures(tmp_path_factory.getbasetemp(), "auth", {
        **FIGURES["routes"], **FIGURES["logins"],
        "responses_checked_for_headers": SEEN.responses,
        "responses_missing_headers": len(SEEN.missing_headers),
        "statuses": {str(status): count for status, count in sorted(SEEN.statuses.items())},
    })
