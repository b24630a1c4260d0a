"""`studyapp serve`: sync the bank, start the lab worker, serve the app."""

from __future__ import annotations

import signal
import sys

import click
from flask import current_app
from flask.cli import with_appcontext
from werkzeug.serving import run_simple

from studyapp.cli.bank import sync_configured_bank
from studyapp.lab_runs import start_worker


@click.command("serve")
@click.option("--host", default=None, help="Interface to listen on (default 127.0.0.1: this machine only).")
@click.option("--port", type=int, default=None, help="Port (default 5000).")
@with_appcontext
def serve_command(host: str | None, port: int | None) -> None:
    """Sync the bank into the database, then serve the app."""
    app = current_app._get_current_object()
    click.echo(f"bank synced: {sync_configured_bank(app).summary()}")
    start_worker(app)  # fails runs a restart cut off, resumes queued ones
    # A service stop (SIGTERM) exits like Ctrl-C, so atexit kills a running lab's processes too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    # Flask's app.run() refuses to run inside a `flask`-style CLI command: serve with werkzeug directly.
    run_simple(host or app.config["HOST"], port or app.config["PORT"], app, threaded=True)
