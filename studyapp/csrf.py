"""CSRF protection for every state-changing request.

One random token per browser session. Forms send it as the hidden field `csrf_token`
(templates call `csrf_token()`); JSON clients send it in the `X-CSRF-Token` header
(pages expose it in `<meta name="csrf-token">`).
"""

from __future__ import annotations

import hmac
import secrets

from flask import Flask, abort, request, session

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})
FORM_FIELD = "csrf_token"
HEADER = "X-CSRF-Token"
_SESSION_KEY = "csrf_token"


def csrf_token() -> str:
    """The session's token, created on first use."""
    token = session.get(_SESSION_KEY)
    if not isinstance(token, str) or not token:
        token = secrets.token_urlsafe(32)
        session[_SESSION_KEY] = token
    return token


def refuse_a_form_that_is_not_utf8() -> None:
    """Werkzeug drops a whole url-encoded form whose body is not UTF-8 (one Latin-1 byte will do), and
    the token with it: say what is wrong, not that the token is missing. The body is read once, as the
    form's parser would (MAX_CONTENT_LENGTH still applies), and the parser then reads that copy."""
    if request.mimetype != "application/x-www-form-urlencoded":
        return
    body = request.get_data(cache=True)
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as error:
        abort(400, description=f"The form is not valid UTF-8: byte {body[error.start]:#04x} cannot start or "
              "continue a character. Send it from the app's page, which sends UTF-8.")


def check_csrf() -> None:
    if request.method in SAFE_METHODS:
        return
    if request.routing_exception is not None:  # no such route, or not this method: its 404 or 405 says so
        return
    refuse_a_form_that_is_not_utf8()
    expected = session.get(_SESSION_KEY)
    sent = request.headers.get(HEADER) or request.form.get(FORM_FIELD)
    if not isinstance(expected, str) or not sent or not hmac.compare_digest(sent.encode(), expected.encode()):
        abort(400, description="The form's CSRF token is missing or out of date: reload the page and try again.")


def init_app(app: Flask) -> None:
    app.before_request(check_csrf)
    app.jinja_env.globals["csrf_token"] = csrf_token
