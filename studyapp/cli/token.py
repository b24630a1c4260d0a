"""`studyapp token [--rotate] [--port N]`: the login URL for serving beyond loopback; a new token.

Rotating writes a new token to the instance folder: every session that logged in with the old
one ends at its next request, in a running server too.
"""

from __future__ import annotations

import click
from flask import current_app
from flask.cli import with_appcontext

from studyapp import auth


@click.command("token")
@click.option("--rotate", is_flag=True, help="Make a new token and end every session.")
@click.option("--port", type=click.IntRange(1, 65535), default=None,
              help="The port the server runs on, as given to `serve --port` (default PORT, 5000).")
@with_appcontext
def token_command(rotate: bool, port: int | None) -> None:
    """Print the login URL that carries the token (made if there is none yet)."""
    app = current_app._get_current_object()
    store = auth.token_store(app)
    if rotate:
        token = store.rotate()
        click.echo("new token written; every session has ended")
    else:
        token, _ = store.ensure()
    host = app.config["HOST"]
    addresses = auth.lan_addresses("0.0.0.0" if auth.is_loopback(host) else host) or ["THIS-MACHINE"]
    for address in addresses:
        click.echo(auth.login_url(address, port or app.config["PORT"], token))
