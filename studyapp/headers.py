"""Security headers on every response (pages, JSON, static files, errors, the login page).

The Content-Security-Policy allows only the app's own scripts and styles (no inline script,
style or event handler anywhere: templates load static/*.js and *.css), no plugins, no framing,
and forms that post only back here. HSTS is sent only on a request that came over HTTPS (behind
a TLS proxy the app is told to trust: auth's TRUST_PROXY).
"""

from __future__ import annotations

from flask import Flask, Response, request

CONTENT_SECURITY_POLICY = "; ".join([
    "default-src 'self'",
    "script-src 'self'",
    "style-src 'self'",
    "img-src 'self' data:",
    "connect-src 'self'",
    "object-src 'none'",
    "base-uri 'none'",
    "form-action 'self'",
    "frame-ancestors 'none'",
])

HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "Referrer-Policy": "no-referrer",  # a URL (the login token's included) never leaves in a Referer
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",  # frame-ancestors for browsers that predate it
}


def add_security_headers(response: Response) -> Response:
    for name, value in HEADERS.items():
        response.headers.setdefault(name, value)
    if request.is_secure:
        response.headers.setdefault("Strict-Transport-Security", "max-age=31536000")
    return response


def init_app(app: Flask) -> None:
    app.after_request(add_security_headers)
