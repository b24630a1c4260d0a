"""`studyapp serve`: sync the bank, start the lab worker, serve the app.

Bound to loopback (the default, 127.0.0.1) the app has no login. Bound to any other address
(`--host 0.0.0.0` to study from a phone), or behind a trusted proxy, every route needs a login
(studyapp.auth): the first such start makes the token and prints the one line with the URL that
carries it; later starts print the URL without it (`studyapp token` shows it again). The access
log never shows the token.
"""

from __future__ import annotations

import signal
import sys

import click
from flask import current_app
from flask.cli import with_appcontext
from werkzeug import serving

from studyapp import auth
from studyapp.cli.bank import sync_configured_bank
from studyapp.lab_runs import start_worker


class RedactingRequestHandler(serving.WSGIRequestHandler):
    """werkzeug's handler, with the login token cut out of every line it logs."""

    def log(self, type: str, message: str, *args) -> None:
        super().log(type, auth.redact(message), *(auth.redact(a) if isinstance(a, str) else a for a in args))


@click.command("serve")
@click.option("--host", default=None, help="Interface to listen on (default 127.0.0.1: this machine only; "
              "any other address requires a token login).")
@click.option("--port", type=int, default=None, help="Port (default 5000).")
@with_appcontext
def serve_command(host: str | None, port: int | None) -> None:
    """Sync the bank into the database, then serve the app."""
    app = current_app._get_current_object()
    host = host or app.config["HOST"]
    port = app.config["PORT"] if port is None else port
    click.echo(f"bank synced: {sync_configured_bank(app).summary()}")
    token, made = None, False
    if not auth.is_loopback(host) or auth.login_required(app):  # the address bound decides, not a client's
        token, made = auth.require_login(app)
    start_worker(app)  # fails runs a restart cut off, resumes queued ones
    # A service stop (SIGTERM) exits like Ctrl-C, so atexit kills a running lab's processes too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    # Flask's app.run() refuses to run inside a `flask`-style CLI command: serve with werkzeug directly.
    server = serving.make_server(host, port, app, threaded=True, request_handler=RedactingRequestHandler)
    server.log_startup()
    if token is not None:
        bound = server.socket.getsockname()[1]
        addresses = auth.lan_addresses(host)
        if made:
            click.echo(auth.login_line(host, bound, token, addresses))
        else:
            where = ", ".join(auth.login_url(a, bound) for a in addresses) or f"port {bound}"
            click.echo(f"login required: {where} (`studyapp token` prints the URL with the token)")
    server.serve_forever()
