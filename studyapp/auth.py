"""Token login when the app is served beyond this machine, as Jupyter does.

`studyapp serve` on an address that is not loopback calls `require_login(app)`: REQUIRE_LOGIN
becomes true, the session cookie SameSite=Strict, and a random token is made once in the
instance folder (TOKEN_FILE, owner-only; instance/ is git-ignored). From then on every request
needs a session that logged in with the current token, except the login page and its own
stylesheet: pages (and form posts) redirect to /login, JSON gets 401. What counts is the address
the server bound, passed in through config, never the client's address. Loopback-only serving
has no login.

    GET  /login[?token=T][&next=/path]   auth.login    the form; with a token, log in and go on
    POST /login                          auth.login    the typed token (CSRF-checked like every POST)
    POST /logout                         auth.logout

A login stores in the (signed, HttpOnly) session cookie a fingerprint of the token it used;
`studyapp token --rotate` writes a new token, and every session's fingerprint stops matching,
which ends them all, in a running server too (the file is re-read when it changes).

Brute force: failed logins are limited per client address (LOGIN_ATTEMPTS in LOGIN_WINDOW_S; the
response says which attempt it was; past the limit a 429 with Retry-After, even for the right
token), the link (GET ?token=) and the typed form (POST) each on its own count: another site can
make a visitor's browser open links, never post the CSRF-checked form, so a page full of
`<img src=".../login?token=x">` locks the owner out of links only, and typing the token still works. Tokens are compared in constant time, and a wrong token gets the same answer whatever
session the request carries. Lab runs are limited per session (LAB_RUNS_PER_SESSION in
LAB_RUNS_WINDOW_S) when login is required.

Settings: REQUIRE_LOGIN (False; serve sets it), TRUST_PROXY (False: honour X-Forwarded-For and
X-Forwarded-Proto from one reverse proxy in front; it also requires login), the limits above,
RATE_LIMIT_CLOCK (monotonic seconds; tests pass their own) and TOKEN_RANDOM (n -> n random bytes).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import ipaddress
import os
import re
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flask import (
    Blueprint,
    Flask,
    current_app,
    jsonify,
    redirect,
    render_template,
    request,
    session,
    url_for,
)
from werkzeug.exceptions import TooManyRequests
from werkzeug.middleware.proxy_fix import ProxyFix

from sharding_lab import atomic_write
from studyapp.rate_limit import RateLimiter

TOKEN_FILE = "login_token"
TOKEN_BYTES = 24  # 192 random bits, as Jupyter's token
LOGIN_CSS = "login.css"
PUBLIC_STATIC = frozenset({LOGIN_CSS, "favicon.svg"})  # the login page's own files, served without a session
_LOGIN_KEY = "login"  # session: the fingerprint of the token this session logged in with
_SESSION_ID_KEY = "sid"  # session: a random id, the key of the per-session lab-run limit

DEFAULTS: dict[str, Any] = {
    "REQUIRE_LOGIN": False,  # serve sets it when bound beyond loopback
    "TRUST_PROXY": False,  # only behind a reverse proxy you run: else clients could fake their address
    "LOGIN_ATTEMPTS": 10,  # failed logins per client address per window: a 192-bit token is not guessed
    "LOGIN_WINDOW_S": 15 * 60,
    "LAB_RUNS_PER_SESSION": 6,  # a lab run takes the CPUs for up to a minute
    "LAB_RUNS_WINDOW_S": 10 * 60,
    "RATE_LIMIT_CLOCK": time.monotonic,
    "TOKEN_RANDOM": secrets.token_bytes,
}

bp = Blueprint("auth", __name__)


# --- The token --------------------------------------------------------------------------


def make_token(random_bytes: Callable[[int], bytes] = secrets.token_bytes) -> str:
    return random_bytes(TOKEN_BYTES).hex()


class TokenFileError(ValueError):
    """The token file holds something no token can be (tokens are hex digits): says which file, and how to
    get a new one."""


class TokenStore:
    """The token file in the instance folder, re-read only when it changes (a rotation by
    another process is seen at the next request)."""

    def __init__(self, path: str, random_bytes: Callable[[int], bytes]):
        self.path = path
        self.random_bytes = random_bytes
        self._cached: tuple[tuple[int, int], str | None] | None = None

    def ensure(self) -> tuple[str, bool]:
        """(the token, whether it was just made). Made once, owner-only, never overwritten here but when empty."""
        if not os.path.exists(self.path):  # (so an existing token takes no randomness)
            token = make_token(self.random_bytes)
            if atomic_write.create_text(Path(self.path), token + "\n", mode=0o600):
                return token, True  # (False: another process made it a moment ago)
        os.chmod(self.path, 0o600)  # tighten a copy restored with looser permissions
        existing = self.current()
        if existing is not None:
            return existing, False
        # Empty: emptied by hand, or left by a version that created the file before writing it.
        return self.rotate(), True

    def rotate(self) -> str:
        """A new token, swapped in atomically (a reader sees the old file or the new one)."""
        token = make_token(self.random_bytes)
        atomic_write.write_text(Path(self.path), token + "\n", mode=0o600)
        return token

    def current(self) -> str | None:
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            return None
        key = (stat.st_ino, stat.st_mtime_ns)
        if self._cached is None or self._cached[0] != key:
            self._cached = (key, self._read() or None)  # empty is no token, never the token ""
        return self._cached[1]

    def _read(self) -> str:
        try:
            return read_ascii(self.path)
        except NotAscii as error:
            raise TokenFileError(
                f"{self.path}: the login token file is not ASCII ({error.where}), and a token is hex digits: "
                "delete the file, and `studyapp token` makes a new one"
            ) from None


class NotAscii(ValueError):
    """A kept file (the login token, the secret key) that is not ASCII: `where` names its first such byte."""

    def __init__(self, where: str):
        super().__init__(where)
        self.where = where


def read_ascii(path: str) -> str:
    """A kept file's text, stripped; NotAscii, naming the first byte that is not ASCII, if edited by hand."""
    with open(path, "rb") as existing:
        raw = existing.read()
    try:
        return raw.decode("ascii").strip()
    except UnicodeDecodeError as error:
        raise NotAscii(f"byte {raw[error.start]:#04x} at offset {error.start}") from None


def fingerprint(token: str, secret_key: str | bytes) -> str:
    """What a session keeps of the token it logged in with: not the token, and useless without it."""
    key = secret_key.encode() if isinstance(secret_key, str) else secret_key  # Flask takes either, os.urandom's too
    return hmac.new(key, b"login:" + token.encode(), hashlib.sha256).hexdigest()


# --- Addresses --------------------------------------------------------------------------


def is_loopback(host: str) -> bool:
    """Whether binding `host` keeps the server on this machine. A name counts as loopback only
    when every address it resolves to is."""
    name = host.strip("[]")
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        pass
    try:
        resolved = {info[4][0] for info in socket.getaddrinfo(name, None)}
    except OSError:
        return False
    return bool(resolved) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in resolved)


def lan_addresses(host: str, resolve: Callable[[], list[str]] | None = None) -> list[str]:
    """The addresses another device can reach a server bound to `host` at: `host` itself when it
    is one address, else this machine's non-loopback addresses (read locally, no traffic sent)."""
    name = host.strip("[]")
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return [name]  # a host name: the name is how others reach it
    if not address.is_unspecified:
        return [str(address)]
    found = (resolve or _local_addresses)()
    wanted = [a for a in found if not ipaddress.ip_address(a).is_loopback and not ipaddress.ip_address(a).is_link_local]
    if address.version == 4:
        wanted = [a for a in wanted if ipaddress.ip_address(a).version == 4]
    return list(dict.fromkeys(wanted))


def _local_addresses() -> list[str]:
    """This machine's addresses: each interface's IPv4 address (Linux), then what its host name
    resolves to. Local calls only: nothing is sent anywhere."""
    found: list[str] = []
    try:
        import fcntl  # POSIX only
        import struct

        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            for _, name in socket.if_nameindex():
                try:
                    packed = fcntl.ioctl(probe.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))  # SIOCGIFADDR
                except OSError:
                    continue  # an interface without an IPv4 address
                found.append(socket.inet_ntoa(packed[20:24]))
    except (ImportError, OSError):
        pass
    try:
        found += [info[4][0].split("%")[0] for info in socket.getaddrinfo(socket.gethostname(), None)]
    except OSError:
        pass
    return found


def login_url(address: str, port: int, token: str | None = None) -> str:
    host = f"[{address}]" if ":" in address else address
    return f"http://{host}:{port}/login" + (f"?token={token}" if token else "")


def login_line(host: str, port: int, token: str, addresses: list[str]) -> str:
    """The one line `serve` prints on the first start beyond loopback."""
    first = addresses[0] if addresses else "THIS-MACHINE"
    listed = ", ".join(addresses) if addresses else "none found: use this machine's address"
    return f"login required: open {login_url(first, port, token)} on your phone (LAN addresses: {listed})"


# --- Wiring -----------------------------------------------------------------------------


@dataclass
class AuthState:
    tokens: TokenStore
    logins: RateLimiter  # failed logins, by client address and link or form (`_login_key`)
    lab_runs: RateLimiter  # lab runs, by session


def _state(app: Flask | None = None) -> AuthState:
    return (app or current_app).extensions["studyapp.auth"]


def token_store(app: Flask) -> TokenStore:
    return _state(app).tokens


def require_login(app: Flask) -> tuple[str, bool]:
    """What `serve` calls when it binds beyond loopback: login from now on. (token, just made)."""
    app.config["REQUIRE_LOGIN"] = True
    app.config["SESSION_COOKIE_SAMESITE"] = "Strict"  # never sent on a request another site starts
    return token_store(app).ensure()


def login_required(app: Flask | None = None) -> bool:
    config = (app or current_app).config
    return bool(config["REQUIRE_LOGIN"] or config["TRUST_PROXY"])


def logged_in() -> bool:
    token = _state().tokens.current()
    kept = session.get(_LOGIN_KEY)
    if token is None or not isinstance(kept, str):
        return False
    return hmac.compare_digest(kept.encode(), fingerprint(token, current_app.secret_key).encode())


JSON_ENDPOINTS = frozenset({"labs.run_status", "plan.simulation_status"})  # JSON APIs whatever the Accept header


def wants_json() -> bool:
    """Whether to answer JSON: a JSON request, one that asks for JSON, or one of the JSON APIs (any Accept)."""
    return request.is_json or request.accept_mimetypes.best == "application/json" or request.endpoint in JSON_ENDPOINTS


def _safe_next(target: str | None) -> str:
    """A local path to go on to after logging in; anything else (another site) is home. Control
    characters are refused too: browsers drop a tab or newline from a URL, so `/\t/evil.example` would
    go to `//evil.example`, and a newline cannot be sent in a Location header at all."""
    local = target and target.startswith("/") and not target.startswith("//") and "\\" not in target
    if not local or any(ord(c) < 0x20 or ord(c) == 0x7F for c in target):
        return "/"
    return target


def check_login():
    """Before every request: let it through, or send it to log in."""
    if not login_required():
        return None
    if request.endpoint == "auth.login":
        return None
    if request.endpoint == "static" and (request.view_args or {}).get("filename") in PUBLIC_STATIC:
        return None
    if logged_in():
        return None
    if wants_json():
        return jsonify(error="Log in first: open the login URL that `studyapp serve` or `studyapp token` prints.", status=401), 401
    target = request.full_path.rstrip("?") if request.method in ("GET", "HEAD") else "/"
    return redirect(url_for("auth.login", next=target), code=302 if request.method in ("GET", "HEAD") else 303)


def _client() -> str:
    return request.remote_addr or "unknown"


def _login_key(method: str) -> str:
    """The limiter's key for a login attempt: the client's address and how the token came."""
    return f"{_client()} {'form' if method == 'POST' else 'link'}"


@bp.route("/login", methods=["GET", "POST"])
def login():
    if not login_required():
        return redirect("/")
    state = _state()
    next_path = _safe_next(request.values.get("next"))
    sent = request.form.get("token") if request.method == "POST" else request.args.get("token")
    if sent is None:
        return render_template("auth/login.html", next_path=next_path, message=None)
    # Past the limit nothing is compared, the right token included: guessing gets no answer.
    key = _login_key(request.method)
    verdict = state.logins.check(key)
    if not verdict.allowed:
        by = "typed tokens" if request.method == "POST" else "login links"
        message = (f"Too many failed {by} from your address: {verdict.count} in the last "
                   f"{_minutes(state.logins.window_s)}. Try again in {verdict.retry_after_s} s.")
        if request.method != "POST":
            message += " Typing the token below is counted apart, and still works."  # a cross-site flood locks links only
        response = render_template("auth/login.html", next_path=next_path, message=message)
        return response, 429, _attempt_headers(verdict) | {"Retry-After": str(verdict.retry_after_s)}
    token = state.tokens.current()
    if token is not None and hmac.compare_digest(sent.strip().encode(), token.encode()):
        for method in ("GET", "POST"):
            state.logins.reset(_login_key(method))
        session.clear()  # a new session: nothing carried over from before the login
        session.permanent = True
        session[_LOGIN_KEY] = fingerprint(token, current_app.secret_key)
        session[_SESSION_ID_KEY] = secrets.token_urlsafe(16)
        return redirect(next_path, code=303)  # the token leaves the address bar
    verdict = state.logins.record(key)
    by = "typed" if request.method == "POST" else "by link"
    message = (f"That token is wrong: attempt {verdict.count} of {verdict.limit} {by} from your address in "
               f"{_minutes(state.logins.window_s)}.")
    return render_template("auth/login.html", next_path=next_path, message=message), 401, _attempt_headers(verdict)


def _attempt_headers(verdict) -> dict[str, str]:
    return {"X-Login-Attempts": str(verdict.count), "X-Login-Attempts-Limit": str(verdict.limit)}


def _minutes(seconds: float) -> str:
    minutes = round(seconds / 60)
    return f"{minutes} minute{'s' if minutes != 1 else ''}"


@bp.post("/logout")
def logout():
    if not login_required():
        return redirect("/")  # nothing to log out of; the session (its CSRF token) stays
    session.clear()
    return redirect(url_for("auth.login"), code=303)


def limit_lab_runs(view):
    """On the view that queues a lab run: when login is required, at most LAB_RUNS_PER_SESSION
    runs per session in LAB_RUNS_WINDOW_S, then a 429 that says when to retry."""

    @functools.wraps(view)
    def limited(*args, **kwargs):
        if login_required():
            limiter = _state().lab_runs
            verdict = limiter.hit(str(session.get(_SESSION_ID_KEY, "")))
            if not verdict.allowed:
                raise TooManyRequests(
                    description=f"Too many lab runs from this session: {verdict.limit} in "
                    f"{_minutes(limiter.window_s)}. Try again in {verdict.retry_after_s} s.",
                    retry_after=verdict.retry_after_s,
                )
        return view(*args, **kwargs)

    return limited


def init_app(app: Flask) -> None:
    for key, value in DEFAULTS.items():
        app.config.setdefault(key, value)
    clock, config = app.config["RATE_LIMIT_CLOCK"], app.config
    app.extensions["studyapp.auth"] = AuthState(
        tokens=TokenStore(os.path.join(app.instance_path, TOKEN_FILE), config["TOKEN_RANDOM"]),
        logins=RateLimiter(config["LOGIN_ATTEMPTS"], config["LOGIN_WINDOW_S"], clock),
        lab_runs=RateLimiter(config["LAB_RUNS_PER_SESSION"], config["LAB_RUNS_WINDOW_S"], clock),
    )
    if login_required(app):
        require_login(app)
    if config["TRUST_PROXY"]:  # one proxy in front: its X-Forwarded-For / -Proto, nobody else's
        app.wsgi_app = ProxyFix(app.wsgi_app, x_for=1, x_proto=1, x_host=1)
    app.register_blueprint(bp)
    app.before_request(check_login)
    app.context_processor(lambda: {"login_required": login_required()})


# The field werkzeug reads as `token` however it is spelled (`%74oken=` logs in too), in any case
# (`Token=` does not log in, but it is still the token), and inside an encoded `next` (`token%3D`).
_TOKEN_NAME = "".join(f"(?:{c}|%{ord(c):x}|%{ord(c.upper()):x})" for c in "token")
REDACT = re.compile(rf"({_TOKEN_NAME}(?:=|%3d))[^&\s\"]*", re.IGNORECASE)


def redact(text: str) -> str:
    """A request line for the log, without the login token."""
    return REDACT.sub(r"\1[redacted]", text)
