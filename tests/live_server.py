"""The app as a real server process for load and crash tests: `studyapp serve` (the real CLI
command, on waitress) in a subprocess on 127.0.0.1, binding port 0 and reporting
the port it got, on a clock the test injects; HTTP clients that count what they send, a bank big
enough to spread load, and a place to record figures."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from urllib.parse import urlencode

# Noon UTC on a Monday: eight hours from the 04:00 rollover either way, so a test's study day
# never changes under it whatever the machine's clock says.
CLOCK_START = datetime(2026, 3, 2, 12, 0, tzinfo=timezone.utc)

# Builds the app with the test's instance folder, database and clock, then runs the real `serve`
# command on port 0; the port the socket got is written to PORT_FILE once it is bound.
SERVE = """
import json, os, sys, time
from datetime import datetime, timedelta
from flask.cli import ScriptInfo
from studyapp.cli import serve
from studyapp import create_app
from studyapp.cli import main
config, instance, port_file, clock_start = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
start, started = datetime.fromisoformat(clock_start), time.monotonic()
config["CLOCK"] = lambda: start + timedelta(seconds=time.monotonic() - started)  # the test's time, real pace
config["PORT"] = 0
make_server = serve.make_server

def make_server_reporting_its_port(*args, **kwargs):
    server = make_server(*args, **kwargs)
    with open(port_file + ".part", "w") as out:
        out.write(str(server.port))
    os.replace(port_file + ".part", port_file)
    return server

serve.make_server = make_server_reporting_its_port
app = create_app(config, instance_path=instance)
main(["serve"], obj=ScriptInfo(create_app=lambda: app), standalone_mode=True)
"""


def wait_for(condition: Callable[[], object], timeout: float, what: str, interval: float = 0.05):
    """Poll `condition` until it returns something truthy (returned), or fail after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(interval)


class ServerProcess:
    """One `studyapp serve` process at a time on the same database and instance folder. Its clock
    starts at CLOCK_START and runs on across restarts at the wall clock's pace."""

    def __init__(self, folder: Path, database_url: str, bank_dir: Path, host: str = "127.0.0.1"):
        """`host` is the address the server binds; the tests' traffic goes to 127.0.0.1 whatever it
        is (bound to 0.0.0.0 the server requires a login, and the first request gets a redirect)."""
        self.folder = folder
        self.config = {"DATABASE_URL": database_url, "BANK_PATH": str(bank_dir), "TIMEZONE": "UTC", "HOST": host}
        self.process: subprocess.Popen | None = None
        self.starts = 0
        self.created = time.monotonic()

    def now(self) -> datetime:
        """The server's clock, as the test sees it."""
        return CLOCK_START + timedelta(seconds=time.monotonic() - self.created)

    def start(self, timeout: float = 30) -> str:
        self.starts += 1
        port_file = self.folder / f"server-{self.starts}.port"
        log = open(self.folder / f"server-{self.starts}.log", "wb")  # a file, never a pipe that can fill up
        env = {k: v for k, v in os.environ.items() if k != "STUDYAPP_DATABASE_URL"}
        self.process = subprocess.Popen(
            [sys.executable, "-c", SERVE, json.dumps(self.config), str(self.folder / "instance"), str(port_file),
             self.now().isoformat()],
            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.folder,
        )
        log.close()

        def bound_port() -> int | None:
            if self.process.poll() is not None:
                raise AssertionError(f"the server exited with {self.process.returncode}:\n{self.log()}")
            return int(port_file.read_text()) if port_file.exists() else None

        try:
            port = wait_for(bound_port, timeout, "the server reporting its port")
        except AssertionError as error:
            raise AssertionError(f"{error}:\n{self.log()}") from None
        self.url = f"http://127.0.0.1:{port}"
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)  # the socket listens already
        try:
            connection.request("GET", "/")
            status = connection.getresponse().status
        finally:
            connection.close()
        expected = 200 if self.config["HOST"] == "127.0.0.1" else 302  # 302: to the login page
        assert status == expected, f"the server answered {status}:\n{self.log()}"
        return self.url

    def log(self) -> str:
        return (self.folder / f"server-{self.starts}.log").read_text(errors="replace")[-3000:]

    def kill(self) -> None:
        """kill -9: no chance to finish a request, flush or close anything."""
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()


class Traffic:
    """What all clients of one test sent and got back."""

    def __init__(self):
        self.sent = 0
        self.statuses: Counter = Counter()
        self.lock = threading.Lock()

    def count(self, status: int | None = None) -> None:
        with self.lock:
            if status is None:
                self.sent += 1
            else:
                self.statuses[status] += 1


class Client:
    """One browser: a session cookie and its CSRF token; counts go to a shared Traffic."""

    def __init__(self, base_url: str, traffic: Traffic):
        self.host, self.port = re.match(r"http://([^:]+):(\d+)", base_url).groups()
        self.traffic = traffic
        self.cookie = ""
        page = self.request("GET", "/")[2]
        self.token = re.search(r'name="csrf-token" content="([^"]+)"', page).group(1)

    def request(self, method: str, path: str, form: dict | None = None) -> tuple[int, str, str]:
        """(status, Location header, body). Raises OSError if the server is gone."""
        self.traffic.count()
        connection = http.client.HTTPConnection(self.host, int(self.port), timeout=30)
        try:
            headers = {"Cookie": self.cookie}
            body = None
            if form is not None:
                body = urlencode({**form, "csrf_token": self.token})
                headers["Content-Type"] = "application/x-www-form-urlencoded"
            connection.request(method, path, body, headers)
            response = connection.getresponse()
            text = response.read().decode()
        finally:
            connection.close()
        if cookie := response.getheader("Set-Cookie"):
            self.cookie = cookie.split(";")[0]
        self.traffic.count(response.status)
        return response.status, response.getheader("Location") or "", text


def shown_form(page: str) -> dict[str, str] | None:
    """The question form's hidden fields (card_id, version, shown_at), or None if no card is shown."""
    fields = dict(re.findall(r'<input type="hidden" name="(card_id|version|shown_at)" value="(\d+)">', page))
    return fields if "card_id" in fields else None


def write_load_bank(folder: Path, decks: int = 2, per_deck: int = 10) -> Path:
    """Decks of simple two-choice questions (the first choice is right), enough cards to spread load."""
    folder.mkdir(parents=True, exist_ok=True)
    for d in range(decks):
        lines = [f"id: load{d}", f"title: Load deck {d}", "questions:"]
        for q in range(per_deck):
            lines += [
                f"  - id: load{d}-q{q}",
                f"    prompt: Question {q} of load deck {d}?",
                "    choices:",
                "      - text: Right",
                "        correct: true",
                "      - text: Wrong",
                "        why_wrong: It is not right.",
                "    explanation: The first choice is right.",
                "    lab: what-fsdp-shards",
                "    tags: [load]",
            ]
        (folder / f"load{d}.yaml").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


COMMITTED_FIGURES = Path(__file__).resolve().parent / "data" / "reliability.json"


def record_figures(basetemp: Path, name: str, figures: dict) -> None:
    """Print the test's figures and keep them in reliability-NAME.json under pytest's temp folder.
    They must have the keys of the committed run's (tests/data/reliability.json), which the
    README's table is rendered from: a figure added, renamed or dropped fails the test until that
    file is refreshed (scripts/reliability-table --collect)."""
    line = json.dumps(figures, sort_keys=True)
    print(f"RELIABILITY {name}: {line}")
    (basetemp / f"reliability-{name}.json").write_text(line + "\n")
    committed = json.loads(COMMITTED_FIGURES.read_text())
    assert name in committed, f"{name}: no such figures in {COMMITTED_FIGURES}"
    assert sorted(figures) == sorted(committed[name]), (
        f"{name}: the figures' keys differ from {COMMITTED_FIGURES}'s: refresh it from this run "
        f"(scripts/reliability-table --collect {basetemp}) and run `make reliability-table`"
    )


def at_once(*jobs) -> list:
    """Run the jobs in threads started together; their results in order."""
    results: list = [None] * len(jobs)
    barrier = threading.Barrier(len(jobs))

    def run(index, job):
        barrier.wait()
        results[index] = job()

    threads = [threading.Thread(target=run, args=(i, job)) for i, job in enumerate(jobs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not [t for t in threads if t.is_alive()], "a request hung"
    return results
