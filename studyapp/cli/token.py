"""`studyapp token [--rotate]`: the login URL for serving beyond loopback; a new token.

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
@with_appcontext
def token_command(rotate: bool) -> None:
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
        click.echo(auth.login_url(address, app.config["PORT"], token))
