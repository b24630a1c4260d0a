"""`studyapp serve`: sync the bank, start the lab worker, serve the app.

It serves on waitress, a production WSGI server in pure Python (any platform), and prints one line:
where it listens. `--debug` serves on Flask's development server instead, in debug mode (its warning
included): for working on the app, never for a phone on the network.

Bound to loopback (the default, 127.0.0.1) the app has no login. Bound to any other address
(`--host 0.0.0.0` to study from a phone), or behind a trusted proxy, every route needs a login
(studyapp.auth): the first such start makes the token and prints the one line with the URL that
carries it; later starts print the URL without it (`studyapp token` shows it again). The access
log (stderr, a line per request) never shows the token.
"""

from __future__ import annotations

import errno
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from urllib.parse import quote

import click
from flask import Flask, current_app
from flask.cli import with_appcontext
from werkzeug import serving

from studyapp import auth
from studyapp.cli.bank import sync_configured_bank
from studyapp.lab_runs import start_worker

THREADS = 8  # requests served at once; a page is milliseconds, a slow client holds only its own thread


class RedactingRequestHandler(serving.WSGIRequestHandler):
    """werkzeug's handler (`--debug`), with the login token cut out of every line it logs."""

    def log(self, type: str, message: str, *args) -> None:
        super().log(type, auth.redact(message), *(auth.redact(a) if isinstance(a, str) else a for a in args))


class AccessLog:
    """WSGI middleware: one line per request on stderr, werkzeug's format, the login token redacted."""

    def __init__(self, app: Callable, stream=None):
        self.app = app
        self.stream = stream
        self._lock = threading.Lock()

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        status = ["-"]

        def recording_start_response(status_line: str, headers, exc_info=None):
            status[0] = status_line.split(" ", 1)[0]
            return start_response(status_line, headers, exc_info)

        try:
            return self.app(environ, recording_start_response)
        finally:
            target = quote(environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", ""))
            if environ.get("QUERY_STRING"):
                target += "?" + environ["QUERY_STRING"]
            request_line = f"{environ.get('REQUEST_METHOD')} {target} {environ.get('SERVER_PROTOCOL')}"
            when = time.strftime("%d/%b/%Y %H:%M:%S")
            line = f'{environ.get("REMOTE_ADDR", "-")} - - [{when}] "{auth.redact(request_line)}" {status[0]} -'
            stream = self.stream or sys.stderr
            with self._lock:  # print() writes the line and its newline apart: threads' lines ran together
                stream.write(line + "\n")
                stream.flush()


@dataclass
class Server:
    """A bound server: the port it got (port 0 asks for a free one) and the call that serves."""

    port: int
    serve_forever: Callable[[], None]


def make_server(app: Flask, host: str, port: int, *, debug: bool = False, access_log: bool = True) -> Server:
    """Bind `host:port` (waitress, or Flask's development server when `debug`); nothing served yet."""
    if debug:
        # Bound here, not by werkzeug: its own bind prints two lines of its own and exits on a taken port,
        # where the caller says it in serve's one `Error:` line.
        listening = _listening_socket(host, port)
        try:
            dev = serving.make_server(host, port, app, threaded=True, request_handler=RedactingRequestHandler,
                                      fd=listening.fileno())
        finally:
            listening.close()  # werkzeug serves on a duplicate of it
        app.debug = True
        dev.log_startup()
        return Server(dev.socket.getsockname()[1], dev.serve_forever)
    import waitress.server

    wsgi = AccessLog(app) if access_log else app
    server = waitress.server.create_server(
        wsgi, host=host, port=port, threads=THREADS, ident="studyapp",
        # X-Forwarded-* headers are the app's call (auth.init_app's ProxyFix, only for a trusted proxy);
        # waitress would otherwise drop them before the app sees them.
        clear_untrusted_proxy_headers=False,
    )
    bound = server.effective_port if hasattr(server, "effective_port") else server.effective_listen[0][1]

    def serve_forever() -> None:
        try:
            server.run()
        except KeyboardInterrupt:
            pass
        finally:
            server.close()

    return Server(bound, serve_forever)


def _listening_socket(host: str, port: int) -> socket.socket:
    """A socket listening on `host:port` as werkzeug's own bind makes it; OSError if it cannot be bound."""
    family = serving.select_address_family(host, port)
    listening = socket.socket(family, socket.SOCK_STREAM)
    try:
        listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as werkzeug's (socketserver's allow_reuse_address)
        listening.bind(serving.get_sockaddr(host, port, family))
        listening.listen(serving.LISTEN_QUEUE)
    except BaseException:
        listening.close()
        raise
    return listening


@click.command("serve")
@click.option("--host", default=None, help="Interface to listen on (default 127.0.0.1: this machine only; "
              "any other address requires a token login).")
@click.option("--port", type=click.IntRange(0, 65535), default=None, help="Port (default 5000; 0 for any free one).")
@click.option("--debug", is_flag=True, help="Flask's development server in debug mode, instead of waitress.")
@with_appcontext
def serve_command(host: str | None, port: int | None, debug: bool) -> None:
    """Sync the bank into the database, then serve the app."""
    app = current_app._get_current_object()
    host = host or app.config["HOST"]
    port = app.config["PORT"] if port is None else port
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise click.ClickException(f"PORT must be a whole number from 0 to 65535, got {port!r}")
    try:  # bound before anything starts: a taken port or a bad address ends here, with nothing changed
        server = make_server(app, host, port, debug=debug)
    except OSError as error:
        raise click.ClickException(
            f"cannot serve on {host}:{port}: {error.strerror or error}"
            + (" (another server, perhaps studyapp itself, is using it; choose another with --port)"
               if error.errno == errno.EADDRINUSE else "")
        ) from None
    except ValueError as error:  # waitress, for an address it cannot resolve or parse
        raise click.ClickException(f"cannot serve on {host}:{port}: {error} (--host takes an IP address or a "
                                   "name this machine resolves, such as 127.0.0.1 or 0.0.0.0)") from None
    click.echo(f"bank synced: {sync_configured_bank(app).summary()}")
    token, made = None, False
    if not auth.is_loopback(host) or auth.login_required(app):  # the address bound decides, not a client's
        token, made = auth.require_login(app)
    start_worker(app)  # fails runs a restart cut off, resumes queued ones
    # A service stop (SIGTERM) exits like Ctrl-C, so atexit kills a running lab's processes too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    if not debug:
        shown = f"[{host}]" if ":" in host else host
        click.echo(f"serving on http://{shown}:{server.port}/ (Ctrl-C to stop)")
    if token is not None:
        addresses = auth.lan_addresses(host)
        if made:
            click.echo(auth.login_line(host, server.port, token, addresses))
        else:
            where = ", ".join(auth.login_url(a, server.port) for a in addresses) or f"port {server.port}"
            # `token` builds its URL on PORT: on any other port the hint must say which, or its link fails.
            hint = "studyapp token" + (f" --port {server.port}" if server.port != app.config["PORT"] else "")
            click.echo(f"login required: {where} (`{hint}` prints the URL with the token)")
    server.serve_forever()
