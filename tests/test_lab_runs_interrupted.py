"""Runs cut short: a lab server killed mid-run (the run's error is one clear line, not the interpreter's
warnings), and `studyapp labs run-all` stopped by Ctrl-C or SIGTERM (its lab stopped and failed, the labs
it queued cancelled, one line said, exit 128 + the signal, nothing left running).

Both run fakes as real processes: FAKE_SERVER below for `sharding-lab serve-labs`, tests/data/fake_sharding_lab.py
for LAB_COMMAND; run-all itself runs in a process of its own, so the signals are real ones."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from sqlmodel import Session, select
from test_lab_runs import FAKE_LAB, finished, post_run, process_gone, wait_for

from sharding_lab.labs.registry import LABS
from studyapp.db import get_engine
from studyapp.lab_runs import start_worker
from studyapp.lab_runs import worker as worker_module
from studyapp.models import LabRun

pytestmark = pytest.mark.slow  # starts processes

FIRST, SECOND = list(LABS)[:2]

# Stands in for `sharding-lab serve-labs`: a "rank" child in its group, one JSON answer per request line.
# --die-once: on the first request (while MARKER is absent), print --stderr lines (then wait, so the app has
# read them) and SIGKILL itself, as `kill -9` does; --hang-on: never answer that lab.
FAKE_SERVER = """
import argparse, json, os, signal, subprocess, sys, time
parser = argparse.ArgumentParser()
parser.add_argument("--log")
parser.add_argument("--die-once")
parser.add_argument("--stderr", action="append", default=[])
parser.add_argument("--hang-on")
args = parser.parse_args()
def note(line):
    with open(args.log, "a") as out:
        out.write(line + "\\n")
rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], stdout=subprocess.DEVNULL)
note(f"server {os.getpid()}")
note(f"rank {rank.pid}")
for line in sys.stdin:
    lab = json.loads(line)["lab"]
    note(f"request {lab}")
    if args.die_once and not os.path.exists(args.die_once):
        open(args.die_once, "w").close()
        print("\\n".join(args.stderr), file=sys.stderr, flush=True)
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)
    if lab == args.hang_on:
        time.sleep(120)
    result = {"lab": lab, "title": "Fake", "claim": "A fake claim.", "holds": True, "finding": f"served by {os.getpid()}",
              "reasons": [], "table": {"columns": [], "rows": []}, "charts": {}, "measurements": {}, "config": {}}
    print(json.dumps({"result": result}), flush=True)
"""

# What Python 3.11's multiprocessing printed on the app's page when an operator ran `kill -9` on the lab server.
LEAKED_SEMAPHORES = [
    "/root/.pyenv/versions/3.11.7/lib/python3.11/multiprocessing/resource_tracker.py:254: UserWarning: "
    "resource_tracker: There appear to be 18 leaked semaphore objects to clean up at shutdown",
    "  warnings.warn('resource_tracker: There appear to be %d '",
]


def fake_server(*options: str) -> list[str]:
    return [sys.executable, "-c", FAKE_SERVER, *options]


def logged_pids(log: Path) -> list[int]:
    """The processes the fakes started: "server PID", "rank PID" (FAKE_SERVER), "start LAB PID TIME" and
    "child PID" (fake_sharding_lab.py)."""
    pids = []
    for line in log.read_text().splitlines():
        kind, *rest = line.split()
        if kind in ("server", "rank", "child"):
            pids.append(int(rest[0]))
        elif kind == "start":
            pids.append(int(rest[1]))
    return pids


def rows(app) -> list[LabRun]:
    with Session(get_engine(app)) as session:
        return list(session.exec(select(LabRun).order_by(LabRun.id)).all())


# --- a lab server killed mid-run ----------------------------------------------------------------


@pytest.mark.parametrize("stderr, why", [
    (LEAKED_SEMAPHORES, ""),  # only Python's warnings: nothing of stderr is worth showing
    (["RuntimeError: rank 1 ran out of shared memory", *LEAKED_SEMAPHORES],
     "\nstderr:\nRuntimeError: rank 1 ran out of shared memory"),  # a real error line still is
])
def test_a_lab_server_killed_mid_run_fails_it_in_one_clear_line_and_the_next_run_gets_a_fresh_one(
        client, csrf_token, app, monkeypatch, tmp_path, stderr, why):
    log = tmp_path / "server.log"
    argv = fake_server("--log", str(log), "--die-once", str(tmp_path / "died"), *(f"--stderr={line}" for line in stderr))
    monkeypatch.setattr(worker_module, "server_argv", lambda idle_s, timeout_s: argv)
    app.config.update(LAB_COMMAND=None, LAB_TIMEOUT_S=30)
    killed = post_run(client, csrf_token, FIRST, world_size=2).get_json()["run_id"]
    after = post_run(client, csrf_token, SECOND, world_size=2).get_json()["run_id"]
    worker = start_worker(app)
    try:
        body = finished(client, killed)
        assert body["status"] == "failed"
        assert body["error"] == ("the lab server stopped by signal 9 (killed) before answering; the run did not "
                                 "finish; run it again." + why)
        assert finished(client, after)["status"] == "done", "the next queued lab ran on a fresh lab server"
        first_server, first_rank = logged_pids(log)[:2]
        wait_for(lambda: process_gone(first_server) and process_gone(first_rank), 15, "the killed server's rank gone")
    finally:
        worker.stop()


# --- `studyapp labs run-all` interrupted ----------------------------------------------------------

RUN_ALL = """
import json, sys
from flask.cli import ScriptInfo
from studyapp import create_app
from studyapp.lab_runs import worker
config, instance, server = json.loads(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
if server:
    worker.server_argv = lambda idle_s, timeout_s: server
app = create_app(config, instance_path=instance)
app.cli.main(args=["labs", "run-all"], prog_name="studyapp", obj=ScriptInfo(create_app=lambda: app))
"""

# LAB_COMMAND's prefix: the fake lab CLI, which answers at once except for one lab, which it never finishes.
# The one it never finishes spawns a grandchild too, as a lab's ranks are.
HANG_ONE = ("import os, sys; fake, log, hang, rest = *sys.argv[1:4], sys.argv[4:]; os.execv(sys.executable, "
            "[sys.executable, fake, '--log', log, *(['--sleep', '120', '--child'] if rest[1] == hang else []), *rest])")


def start_run_all(config: dict, instance: Path, server: list[str] | None = None) -> subprocess.Popen:
    """`studyapp labs run-all` in a process (and a process group, as a terminal's command is) of its own."""
    return subprocess.Popen(
        [sys.executable, "-c", RUN_ALL, json.dumps(config), str(instance), json.dumps(server or [])],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        env={k: v for k, v in os.environ.items() if k != "STUDYAPP_DATABASE_URL"})


@pytest.mark.parametrize("signum, lab_runner", [
    (signal.SIGINT, "server"), (signal.SIGTERM, "server"), (signal.SIGINT, "process"), (signal.SIGTERM, "process"),
])
def test_an_interrupted_run_all_stops_its_lab_cancels_the_rest_and_says_so(app, app_config, tmp_path, signum, lab_runner):
    log = tmp_path / "labs.log"
    log.touch()
    config = {"DATABASE_URL": app_config["DATABASE_URL"], "SECRET_KEY": "x", "BANK_PATH": app_config["BANK_PATH"],
              "LAB_TIMEOUT_S": 300}
    server = []
    if lab_runner == "server":
        server = fake_server("--log", str(log), "--hang-on", SECOND)
    else:
        config["LAB_COMMAND"] = [sys.executable, "-c", HANG_ONE, str(FAKE_LAB), str(log), SECOND]
    run_all = start_run_all(config, tmp_path / "instance", server)
    try:
        # The first lab done, the second under way (sent to the server, or its process and grandchild up).
        under_way = f"request {SECOND}" if lab_runner == "server" else f"start {SECOND} "

        def second_under_way() -> bool:
            text = log.read_text()
            return ([run.status for run in rows(app)[:2]] == ["done", "running"] and under_way in text
                    and (lab_runner == "server" or "child" in text.split(under_way, 1)[1]))

        wait_for(second_under_way, 60, "the second lab under way")
        if signum == signal.SIGINT:
            os.killpg(run_all.pid, signal.SIGINT)  # Ctrl-C signals the terminal's whole foreground group
        else:
            run_all.send_signal(signal.SIGTERM)  # `kill`, a service stop
        output, _ = run_all.communicate(timeout=60)
    finally:
        if run_all.poll() is None:
            run_all.kill()
            run_all.wait()
    how = "Ctrl-C" if signum == signal.SIGINT else "SIGTERM"
    assert run_all.returncode == 128 + signum, output
    assert output.splitlines()[-1] == (f"interrupted ({how}): of {len(LABS)} labs, 1 done, 1 stopped, {len(LABS) - 2} "
                                       "cancelled; the done results are stored"), output
    assert "Traceback" not in output and "Aborted!" not in output
    stored = rows(app)
    assert [run.lab_id for run in stored] == list(LABS)
    assert [run.status for run in stored] == ["done"] + ["failed"] * (len(LABS) - 1)
    assert stored[1].error == f"interrupted ({how}): `studyapp labs run-all` was stopped while this lab ran"
    assert {run.error for run in stored[2:]} == {f"cancelled: `studyapp labs run-all` was interrupted ({how}) "
                                                 "before this lab started"}
    assert all(run.finished_at for run in stored)
    pids = logged_pids(log)
    assert len(pids) >= 2
    wait_for(lambda: all(process_gone(pid) for pid in pids), 3, "every lab process gone with run-all")


def test_run_all_interrupted_while_another_runner_holds_the_lock_cancels_its_own_runs_only(app, app_config, tmp_path):
    # The server runs a lab (it holds the lock), and a run of FIRST was queued from the app: run-all takes that
    # run as its own FIRST, and waits. Ctrl-C then cancels the 22 runs it queued and leaves the app's queued.
    from studyapp.lab_runs import enqueue, runner_lock

    queued_in_app = enqueue(get_engine(app), FIRST, 2)
    config = {"DATABASE_URL": app_config["DATABASE_URL"], "SECRET_KEY": "x", "BANK_PATH": app_config["BANK_PATH"],
              "LAB_COMMAND": [sys.executable, str(FAKE_LAB)]}
    (tmp_path / "instance").mkdir(exist_ok=True)
    with runner_lock(str(tmp_path / "instance" / worker_module.LOCK_FILE)):  # run-all's instance folder
        run_all = start_run_all(config, tmp_path / "instance")
        try:
            wait_for(lambda: len(rows(app)) == len(LABS), 60, "run-all's runs queued")
            wait_for(lambda: run_all.stdout.readline().startswith("a lab is running"), 30, "run-all waiting")
            os.killpg(run_all.pid, signal.SIGINT)
            output, _ = run_all.communicate(timeout=30)
        finally:
            if run_all.poll() is None:
                run_all.kill()
                run_all.wait()
    assert run_all.returncode == 130, output
    assert output.splitlines()[-1] == (f"interrupted (Ctrl-C): of {len(LABS)} labs, 0 done, 0 stopped, {len(LABS) - 1} "
                                       "cancelled, 1 left queued (queued from the app before); the done results are stored")
    stored = rows(app)
    assert (stored[0].id, stored[0].status, stored[0].error) == (queued_in_app.id, "queued", None)
    assert {(run.status, run.error) for run in stored[1:]} == {
        ("failed", "cancelled: `studyapp labs run-all` was interrupted (Ctrl-C) before this lab started")}
