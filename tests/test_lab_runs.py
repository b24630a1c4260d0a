"""Labs in the app: the JSON API, the queue and its worker, timeouts, restart recovery, run-all.

Most tests run a fake lab CLI (tests/data/fake_sharding_lab.py) through the real subprocess path;
test_a_real_lab_runs_end_to_end_and_the_web_process_never_imports_torch runs the real one. The device
choice asks a fake detection command (LAB_DEVICES_COMMAND) for GPUs this machine may not have, and the
real one (studyapp.lab_runs.devices) for what this machine has.
"""

from __future__ import annotations

import html
import json
import os
import subprocess
import sys
import textwrap
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
from conftest import DatabaseOnSmallDisk, filling_first
from live_server import wait_for
from sqlmodel import Session, select
from test_sharding_launch import shared_semaphores

from sharding_lab.labs.registry import LABS
from studyapp import create_app, lab_runs
from studyapp.db import get_engine
from studyapp.lab_runs import INTERRUPTED, SHUTDOWN, devices, start_worker
from studyapp.lab_runs.process import lab_argv
from studyapp.models import LabRun
from studyapp.safe_svg import UnsafeSvg, clean_svg

FAKE_LAB = Path(__file__).parent / "data" / "fake_sharding_lab.py"
REPO = Path(__file__).resolve().parent.parent
LAB = "adam-optimizer-state"  # the fastest real lab: one DDP launch at 2 ranks
launches = pytest.mark.slow  # runs lab processes (the worker or run-all): left out of make test-fast


def fake_command(*options: str) -> list[str]:
    return [sys.executable, str(FAKE_LAB), *options]


@pytest.fixture
def app_config(app_config: dict) -> dict:
    return {**app_config, "LAB_COMMAND": fake_command(), "LAB_TIMEOUT_S": 30}


@pytest.fixture
def start(app):
    """Start the app's worker (tests run without autostart); stopped at teardown."""
    workers = []

    def start_it():
        workers.append(start_worker(app))
        return workers[-1]

    yield start_it
    for worker in workers:
        worker.stop()


def runs(app) -> list[LabRun]:
    with Session(get_engine(app)) as session:
        return list(session.exec(select(LabRun).order_by(LabRun.id)).all())


def status(client, run_id: int) -> dict:
    response = client.get(f"/labs/runs/{run_id}")
    assert response.status_code == 200
    return response.get_json()


def post_run(client, csrf_token: str, lab_id: str = LAB, **body):
    return client.post(f"/labs/{lab_id}/runs", json=body, headers={"X-CSRF-Token": csrf_token})


def finished(client, run_id: int, timeout_s: float = 30.0) -> dict:
    return wait_for(lambda: (s := status(client, run_id))["status"] in ("done", "failed") and s, timeout_s, "the run")


def process_gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"  # a zombie has stopped running
    except FileNotFoundError:
        return True


# --- the JSON API ----------------------------------------------------------------------------


def test_post_queues_a_run_202_and_its_status_reads_back(client, csrf_token, app):
    response = post_run(client, csrf_token, world_size=2)
    assert response.status_code == 202
    run_id = response.get_json()["run_id"]
    assert response.headers["Location"].endswith(f"/labs/runs/{run_id}")
    body = status(client, run_id)
    assert body["status"] == "queued" and body["result"] is None and body["queue_position"] == 0
    assert body["lab_id"] == LAB and body["params"] == {"world_size": 2, "device": "cpu"}
    # The same run asked for again (a double click) is the same run, not a second one.
    assert post_run(client, csrf_token, world_size=2).get_json()["run_id"] == run_id
    assert post_run(client, csrf_token, world_size=4).get_json()["run_id"] != run_id
    assert len(runs(app)) == 2


def test_an_empty_body_runs_at_the_smallest_world_size_on_cpu_and_text_digits_count(client, csrf_token, app):
    first = post_run(client, csrf_token).get_json()["run_id"]  # {}, as the README's API documents
    assert status(client, first)["params"] == {"world_size": 2, "device": "cpu"}
    second = post_run(client, csrf_token, world_size="4").get_json()["run_id"]  # as a form field arrives
    assert status(client, second)["params"] == {"world_size": 4, "device": "cpu"}


def test_unknown_labs_and_runs_are_404(client, csrf_token, app):
    for lab_id in ("not-a-lab", "ADAM-OPTIMIZER-STATE", "..%2F..", "x" * 300):
        response = post_run(client, csrf_token, lab_id, world_size=2)
        assert response.status_code == 404, lab_id
        assert response.get_json()["status"] == 404
    assert "no runnable lab 'not-a-lab'" in post_run(client, csrf_token, "not-a-lab").get_json()["error"]
    assert client.get("/labs/runs/999").status_code == 404
    assert client.get(f"/labs/runs/{2**40}").status_code == 404
    assert runs(app) == []


@pytest.mark.parametrize("accept", [None, "text/html", "*/*"])
@pytest.mark.parametrize("run_id", ["999", "abc", "-1", "1.5", "\u0661", str(2**40)])
def test_the_run_status_api_answers_json_whatever_the_accept_header(client, accept, run_id):
    # The login check treated the route as JSON, yet its 404 was an HTML page unless JSON was asked for;
    # and an id no integer converter took ("abc") matched no route: an HTML 404 whatever was asked.
    response = client.get(f"/labs/runs/{run_id}", headers={"Accept": accept} if accept else {})
    assert (response.status_code, response.mimetype) == (404, "application/json")
    assert response.get_json() == {"error": f"There is no lab run {run_id}.", "status": 404}


@pytest.mark.parametrize("world_size", [3, 1, 0, -2, 64, "two", "2; rm -rf /", 2.0, True, None, [2], "",
                                        " 4x"])
def test_a_world_size_outside_the_allowed_set_is_400_and_queues_nothing(client, csrf_token, app, world_size):
    response = post_run(client, csrf_token, world_size=world_size)
    assert response.status_code == 400
    assert "world_size must be one of 2, 4" in response.get_json()["error"]
    assert runs(app) == []


def test_a_form_field_sent_twice_with_different_values_is_refused(client, csrf_token, app):
    # `world_size=4&world_size=abc` queued a 4-rank run: the first value won.
    response = client.post(f"/labs/{LAB}/runs", data={"csrf_token": csrf_token, "world_size": ["4", "abc"]},
                           headers={"Accept": "application/json"})
    assert response.status_code == 400
    assert "The form field 'world_size' was sent 2 different ways ('4', 'abc')" in response.get_json()["error"]
    assert runs(app) == []


def test_free_form_arguments_are_refused(client, csrf_token, app):
    response = post_run(client, csrf_token, world_size=2, extra="--device cuda")
    assert response.status_code == 400 and "takes only world_size and device" in response.get_json()["error"]
    response = client.post(f"/labs/{LAB}/runs", data="[2]", content_type="application/json",
                           headers={"X-CSRF-Token": csrf_token})
    assert response.status_code == 400 and "JSON object" in response.get_json()["error"]
    response = client.post(f"/labs/{LAB}/runs", data={"csrf_token": csrf_token, "world_size": "2", "size": "70b"})
    assert response.status_code == 400
    assert runs(app) == []


def test_the_post_needs_the_csrf_token(client, csrf_token, app):
    assert client.post(f"/labs/{LAB}/runs", json={"world_size": 2}).status_code == 400
    assert post_run(client, "forged", world_size=2).status_code == 400
    assert client.post(f"/labs/{LAB}/runs", data={"world_size": "2"}).status_code == 400
    assert runs(app) == []


def test_the_form_post_queues_and_returns_to_the_lab_page(client, csrf_token, app):
    response = client.post(f"/labs/{LAB}/runs", data={"csrf_token": csrf_token, "world_size": "4"})
    assert response.status_code == 303 and response.headers["Location"].endswith(f"/labs/{LAB}")
    page = client.get(f"/labs/{LAB}").get_data(as_text=True)
    assert "Run #1 is queued" in page and 'data-active-run="/labs/runs/1"' in page
    assert [(run.status, run.params) for run in runs(app)] == [("queued", {"world_size": 4, "device": "cpu"})]


# --- the worker ------------------------------------------------------------------------------


@launches
def test_runs_go_one_at_a_time_in_order_and_store_the_lab_json(client, csrf_token, app, start, tmp_path):
    log = tmp_path / "fake.log"
    app.config["LAB_COMMAND"] = fake_command("--sleep", "0.4", "--log", str(log))
    lab_ids = list(LABS)[:3]
    run_ids = [post_run(client, csrf_token, lab_id, world_size=2).get_json()["run_id"] for lab_id in lab_ids]
    start()
    rival = lab_runs.LabWorker(app)  # a second worker (as in a second server process): the lock holds
    rival.start()
    seen_running = set()
    while True:  # watch the queue (one query: a consistent snapshot): never two running at once
        states = [run.status for run in runs(app)]
        assert states.count("running") <= 1, states
        seen_running |= {run_id for run_id, state in zip(run_ids, states, strict=True) if state == "running"}
        if all(state == "done" for state in states):
            break
        assert "failed" not in states, [status(client, run_id) for run_id in run_ids]
        time.sleep(0.02)
    assert seen_running  # the watch did see runs in progress
    rival.stop()

    events = [line.split() for line in log.read_text().splitlines()]
    assert [(kind, lab) for kind, lab, *_ in events] == [(k, lab) for lab in lab_ids for k in ("start", "end")]
    times = [float(event[3]) for event in events]
    assert times == sorted(times)  # each ended before the next started
    body = status(client, run_ids[0])
    assert body["result"]["finding"] == f"fake finding for {lab_ids[0]} at 2 ranks"
    assert body["result"]["holds"] is True and body["elapsed_s"] >= 0.4

    # A second run of a lab says how long the last one took, for the page's progress line.
    app.config["LAB_COMMAND"] = fake_command("--sleep", "5")
    again = post_run(client, csrf_token, lab_ids[0], world_size=2).get_json()["run_id"]
    running = wait_for(lambda: (s := status(client, again))["status"] == "running" and s, 10, "the run to start")
    assert 0.4 <= running["expected_s"] < 5 and running["elapsed_s"] < 5 and running["result"] is None
    assert status(client, run_ids[0]).get("expected_s") is None  # only while it waits or runs


@launches
def test_a_claim_that_does_not_hold_is_a_done_run_and_a_crash_is_a_failed_one(client, csrf_token, app, start):
    app.config["LAB_COMMAND"] = fake_command("--holds", "no")
    first = post_run(client, csrf_token, world_size=2).get_json()["run_id"]
    start()
    body = finished(client, first)
    assert body["status"] == "done" and body["result"]["holds"] is False

    app.config["LAB_COMMAND"] = fake_command("--fail", "3")
    second = post_run(client, csrf_token, world_size=2).get_json()["run_id"]
    body = finished(client, second)
    assert body["status"] == "failed"
    assert body["error"].startswith("exit status 3, no JSON result.")
    assert "RuntimeError: rank 1 exploded" in body["error"] and body["result"] == {"error": body["error"]}

    app.config["LAB_COMMAND"] = ["/nonexistent/sharding-lab"]
    third = post_run(client, csrf_token, world_size=2).get_json()["run_id"]
    assert finished(client, third)["error"].startswith("could not start the lab:")


@launches
def test_a_run_past_its_timeout_is_failed_and_its_processes_killed(client, csrf_token, app, start, tmp_path):
    log = tmp_path / "fake.log"
    app.config.update(LAB_TIMEOUT_S=3, LAB_COMMAND=fake_command("--sleep", "60", "--child", "--log", str(log)))
    run_id = post_run(client, csrf_token, world_size=2).get_json()["run_id"]
    started = time.monotonic()
    start()
    body = finished(client, run_id, timeout_s=20)
    assert time.monotonic() - started < 15
    assert body["status"] == "failed"
    assert body["error"].startswith("timed out after 3 s; the lab's processes were stopped.")
    assert "launching 2 ranks" in body["error"]  # the stderr tail says how far it got
    pids = [int(line.split()[2 if line.startswith("start") else 1]) for line in log.read_text().splitlines()]
    assert len(pids) == 2  # the fake and the grandchild it spawned, both in the run's process group
    wait_for(lambda: all(process_gone(pid) for pid in pids), 5, "the lab's processes to end")


@launches
def test_stopping_the_worker_kills_its_lab_and_fails_the_run(client, csrf_token, app, start, tmp_path):
    log = tmp_path / "fake.log"
    app.config["LAB_COMMAND"] = fake_command("--sleep", "60", "--child", "--log", str(log))
    run_id = post_run(client, csrf_token, world_size=2).get_json()["run_id"]
    worker = start()
    wait_for(lambda: log.is_file() and "child" in log.read_text(), 20, "the lab to start")
    worker.stop()
    assert not worker.alive
    body = status(client, run_id)
    assert body["status"] == "failed" and body["error"] == SHUTDOWN
    pids = [int(line.split()[-1]) for line in log.read_text().splitlines() if line.startswith("child")]
    wait_for(lambda: all(process_gone(pid) for pid in pids), 5, "the grandchild to end")


@launches
def test_a_restart_fails_the_run_it_cut_off_and_resumes_the_queued_ones(app, app_config, tmp_path):
    at = datetime(2026, 3, 2, 12, 0, tzinfo=timezone.utc)
    with Session(get_engine(app)) as session:
        session.add(LabRun(lab_id=LAB, params={"world_size": 2}, status="running", created_at=at, started_at=at))
        session.add(LabRun(lab_id="what-fsdp-shards", params={"world_size": 4}, status="queued", created_at=at))
        session.add(LabRun(lab_id=LAB, params={"world_size": 2}, status="done", result={"lab": LAB}, created_at=at))
        session.commit()
    get_engine(app).dispose()

    restarted = create_app(app_config, instance_path=str(tmp_path / "instance"))  # the same database
    worker = start_worker(restarted)
    try:
        wait_for(lambda: [run.status for run in runs(restarted)] == ["failed", "done", "done"], 20, "recovery")
    finally:
        worker.stop()
    cut_off, resumed, old = runs(restarted)
    assert cut_off.error == INTERRUPTED and "server restart" in cut_off.error and cut_off.finished_at
    assert resumed.result["finding"] == "fake finding for what-fsdp-shards at 4 ranks"
    assert old.result == {"lab": LAB}
    get_engine(restarted).dispose()


@launches
def test_a_running_row_is_left_alone_while_its_runner_holds_the_lock(app, csrf_token, client):
    # `studyapp labs run-all` in another process holds the lock while its row runs: a server
    # starting then must wait for it, not fail its run.
    with lab_runs.runner_lock(lab_runs.lock_path(app)):
        run = lab_runs.enqueue(get_engine(app), LAB, 2)
        lab_runs.claim_next(get_engine(app))
        worker = start_worker(app)
        time.sleep(0.5)
        assert status(client, run.id)["status"] == "running"
    wait_for(lambda: status(client, run.id)["status"] == "failed", 10, "recovery once the lock is free")
    worker.stop()


class TestAFullDisk(DatabaseOnSmallDisk):
    """The lab (a fake) fills the database's disk before it answers, so its result meets a full disk."""

    @pytest.fixture
    def app_config(self, app_config: dict, small_disk) -> dict:
        return {**app_config, "LAB_COMMAND": filling_first(app_config["LAB_COMMAND"], small_disk)}

    @launches
    def test_a_refused_result_is_stored_once_space_is_back(self, app, client, csrf_token, small_disk, caplog):
        run_id = post_run(client, csrf_token, world_size=2).get_json()["run_id"]
        worker = start_worker(app)
        try:
            wait_for(lambda: "could not be stored" in caplog.text, 30, "the refused write")
            assert (f"lab run {run_id} finished, but its result could not be stored (database or disk is full)"
                    in caplog.text)
            time.sleep(2 * lab_runs.worker.POLL_S)  # asked again, and refused again
            waiting = status(client, run_id)
            assert waiting["status"] == "running" and worker.alive and waiting["result"] is None
            assert waiting["unstored"] == ("database or disk is full: the disk that holds the database is full: free "
                                           "space on it, then try again")
            (small_disk / "filler").unlink()
            body = finished(client, run_id, timeout_s=20)
        finally:
            worker.stop()
        assert body["status"] == "done" and body["result"]["finding"] == f"fake finding for {LAB} at 2 ranks"
        assert "unstored" not in body and "its result is stored" in caplog.text

    @launches
    def test_a_stop_while_it_waits_says_so_and_the_next_start_marks_it_interrupted(self, app, client, csrf_token,
                                                                                   small_disk, caplog):
        run_id = post_run(client, csrf_token, world_size=2).get_json()["run_id"]
        worker = start_worker(app)
        wait_for(lambda: "could not be stored" in caplog.text, 30, "the refused write")
        worker.stop()
        assert not worker.alive and "lab worker: run failed" not in caplog.text
        assert f"lab run {run_id}: stopped before the database took its result (database or disk is full)" in caplog.text
        assert status(client, run_id)["status"] == "running"
        (small_disk / "filler").unlink()
        restarted = start_worker(app)
        body = finished(client, run_id, timeout_s=20)
        restarted.stop()
        assert body["status"] == "failed" and body["error"] == INTERRUPTED


# --- the pages -------------------------------------------------------------------------------


@launches
def test_the_lab_page_shows_the_latest_result_and_past_runs(client, csrf_token, app, start):
    app.config["LAB_COMMAND"] = fake_command("--finding", "<script>alert(1)</script> 2.00x per rank")
    run_id = post_run(client, csrf_token, world_size=2).get_json()["run_id"]
    start()
    finished(client, run_id)
    app.config["LAB_COMMAND"] = fake_command("--fail", "1")
    failed_id = post_run(client, csrf_token, world_size=4).get_json()["run_id"]
    finished(client, failed_id)

    page = client.get(f"/labs/{LAB}").get_data(as_text=True)
    assert "The claim held." in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt; 2.00x per rank" in page and "<script>alert" not in page
    assert "<td>240,384</td>" in page  # the lab's table
    assert "<svg viewBox=" in page and "<title>fake &lt;chart&gt;</title>" in page  # its chart, inline
    assert f"<td>#{run_id}</td>" in page and f"<td>#{failed_id}</td>" in page  # both past runs
    assert page.count("<td>2</td>") == 1 and page.count("<td>4</td>") == 1  # the ranks each ran (this lab: N)
    assert "rank 1 exploded" in page and "did not hold" not in page
    assert client.get(f"/labs/{LAB}/results").get_data(as_text=True).strip().startswith('<section class="lab-result"')

    # The card's lab box (question page, answer view) carries the measured finding and the link.
    question = client.get("/questions/beta-adam").get_data(as_text=True)
    assert "Measured: the claim held." in question and f'href="/labs/{LAB}"' in question


def test_past_runs_name_the_ranks_a_scaling_lab_ran_not_the_n_it_was_asked(client, csrf_token):
    asked = post_run(client, csrf_token, lab_id="ring-all-reduce", world_size=4).get_json()["run_id"]
    page = client.get("/labs/ring-all-reduce").get_data(as_text=True)
    assert f"<td>#{asked}</td>" in page and "<td>4, 8</td>" in page  # N and 2N


@launches
def test_a_chart_with_anything_but_drawing_is_not_shown(client, csrf_token, app, start):
    app.config["LAB_COMMAND"] = fake_command("--chart", "<svg><rect onload='alert(1)'/></svg>")
    run_id = post_run(client, csrf_token, world_size=2).get_json()["run_id"]
    start()
    assert finished(client, run_id)["status"] == "done"
    page = client.get(f"/labs/{LAB}").get_data(as_text=True)
    assert "onload" not in page and "Chart “memory” not shown" in page


@pytest.mark.parametrize("svg", [
    "<svg><script>alert(1)</script></svg>",
    "<svg><a href='javascript:alert(1)'><text>x</text></a></svg>",
    "<svg><rect fill='url(https://evil.example/x)'/></svg>",
    "<svg><foreignObject><p>x</p></foreignObject></svg>",
    "<!DOCTYPE svg [<!ENTITY a 'aaaa'>]><svg><text>&a;</text></svg>",
    "<svg><text><![CDATA[</text><script>alert(1)</script>]]></text></svg>",
    "<div>not svg</div>",
    "<svg><text>unclosed</svg>",
])
def test_clean_svg_refuses_anything_but_a_plain_chart(svg):
    with pytest.raises(UnsafeSvg):
        clean_svg(svg)


def test_clean_svg_keeps_a_real_chart_with_its_tooltips_and_escaping():
    from sharding_lab import svg

    chart = svg.stacked_bar_chart("Bytes <per> rank", [svg.Bar("ddp & co", {"params": 2048.0})], ["params"])
    cleaned = str(clean_svg(chart))
    assert cleaned.startswith("<svg viewBox=") and cleaned.count("<title>") >= 2
    assert "Bytes &lt;per&gt; rank" in cleaned and "ddp &amp; co" in cleaned and "<per>" not in cleaned


# --- the CLI and the export ------------------------------------------------------------------


@launches
def test_labs_run_all_stores_every_lab_and_export_anki_uses_the_results(app, runner, tmp_path):
    result = runner.invoke(args=["labs", "run-all", "--world-size", "4"])
    assert result.exit_code == 0, result.output
    assert f"{len(LABS)} of {len(LABS)} claims held" in result.output
    stored = runs(app)
    assert [run.lab_id for run in stored] == list(LABS)
    assert all(run.status == "done" and run.params == {"world_size": 4, "device": "cpu"} and run.finished_at
               for run in stored)

    from studyapp.anki import ALL_DECKS_FILE, read_package

    exported = runner.invoke(args=["export-anki", "--out", str(tmp_path / "anki")])
    assert exported.exit_code == 0, exported.output
    assert f"lab results: {len(LABS)} from the database" in exported.output
    fields = [" ".join(note.fields) for note in read_package(tmp_path / "anki" / ALL_DECKS_FILE).notes.values()]
    assert any(f"fake finding for {LAB} at 4 ranks" in text for text in fields)


@launches
def test_labs_run_all_exits_1_and_says_which_failed(app, runner):
    app.config["LAB_COMMAND"] = fake_command("--fail", "2")
    result = runner.invoke(args=["labs", "run-all"])
    assert result.exit_code == 1
    assert f"0 of {len(LABS)} claims held" in result.output and "FAILED: exit status 2" in result.output
    assert {run.status for run in runs(app)} == {"failed"}
    assert runner.invoke(args=["labs", "run-all", "--world-size", "3"]).exit_code == 2


# --- a real lab --------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_real_lab_runs_end_to_end_and_the_web_process_never_imports_torch(tmp_path):
    """The real `sharding-lab` through the app's queue and subprocess, in a fresh interpreter so that
    torch imported by other tests cannot hide an import by the app."""
    script = f"""
import json, re, sys, time
from studyapp import create_app
from studyapp.lab_runs import start_worker
app = create_app({{"DATABASE_URL": "sqlite:///{tmp_path / 'db.sqlite3'}", "SECRET_KEY": "x", "TESTING": True,
                  "LAB_TIMEOUT_S": 240}}, instance_path={str(tmp_path / 'instance')!r})
client = app.test_client()
token = re.search(r'name="csrf-token" content="([^"]+)"', client.get("/labs/{LAB}").get_data(as_text=True))[1]
response = client.post("/labs/{LAB}/runs", json={{"world_size": 2}}, headers={{"X-CSRF-Token": token}})
assert response.status_code == 202, response.get_data(as_text=True)
worker = start_worker(app)
started = time.monotonic()
while (body := client.get(response.json["url"]).json)["status"] not in ("done", "failed"):
    time.sleep(0.2)
page = client.get("/labs/{LAB}").get_data(as_text=True)
worker.stop()
print(json.dumps({{"body": body, "seconds": time.monotonic() - started, "page_has_chart": "<svg viewBox" in page,
                  "torch": sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))}}))
"""
    temp = tmp_path / "tmp"  # the app's and its lab server's temporary files
    temp.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "STUDYAPP_DATABASE_URL"} | {"TMPDIR": str(temp)}
    semaphores = shared_semaphores()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    # The worker's stop ended its lab server, which ended its pool: no folder, no semaphore left. (The
    # server dies with the worker thread that started it, so that thread must outlive its cleanup.)
    assert [path.name for path in temp.iterdir() if path.name.startswith("sharding-lab")] == []
    assert shared_semaphores() - semaphores == set()
    report = json.loads(done.stdout.strip().splitlines()[-1])
    body = report["body"]
    assert body["status"] == "done", body.get("error")
    result = body["result"]
    assert result["lab"] == LAB and result["holds"] is True and "2.00x" in result["finding"]
    assert result["config"]["world_size"] == 2 and result["config"]["backend"] == "gloo"
    assert report["page_has_chart"]
    assert report["torch"] == []  # the lab ran torch in its own processes, never in the web one
    print(f"real lab through the app: {report['seconds']:.1f} s")


@launches
def test_the_labs_index_says_which_claims_held(client, runner, app):
    app.config["LAB_COMMAND"] = fake_command("--holds", "no")
    assert runner.invoke(args=["labs", "run-all"]).exit_code == 1
    page = client.get("/labs").get_data(as_text=True)
    assert page.count('<span class="tag">did NOT hold</span>') == len(LABS)
    app.config["LAB_COMMAND"] = fake_command()
    assert runner.invoke(args=["labs", "run-all"]).exit_code == 0
    page = client.get("/labs").get_data(as_text=True)
    assert page.count('<span class="tag">held</span>') == len(LABS) and "did NOT hold" not in page


# --- the device ----------------------------------------------------------------------------------

# A stand-in for `python -m sharding_lab.engine.devices`: waits for a gate file (when given), then
# fails with a message (when given) or reports `gpus` fake GPUs.
FAKE_DEVICES = """
import json, pathlib, sys, time
gate, gpus, fail = sys.argv[1], int(sys.argv[2]), sys.argv[3]
while gate and not pathlib.Path(gate).exists():
    time.sleep(0.02)
if fail:
    sys.exit(print("Traceback (most recent call last):", fail, sep="\\n", file=sys.stderr) or 1)
print(json.dumps({"cuda_gpus": gpus, "gpu_names": ["Fake GPU"] * gpus, "torch_version": "9.9.0+fake",
                  "cuda_version": "13.0" if gpus else None}))
"""


def devices_command(gpus: int = 0, gate: str = "", fail: str = "") -> list[str]:
    """LAB_DEVICES_COMMAND for a machine with `gpus` fake GPUs (answers are kept per command)."""
    return [sys.executable, "-c", FAKE_DEVICES, gate, str(gpus), fail]


def installed_torch_version() -> str:
    done = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def test_cuda_is_offered_once_a_lab_process_has_found_a_gpu_and_refused_while_it_looks(client, csrf_token, app,
                                                                                        tmp_path):
    gate = tmp_path / "answer-now"
    app.config["LAB_DEVICES_COMMAND"] = devices_command(gpus=1, gate=str(gate))
    page = client.get(f"/labs/{LAB}").get_data(as_text=True)
    assert "Looking for GPUs in a lab process…" in page
    assert '<option value="cpu">CPU ranks (gloo)</option>' in page and 'value="cuda"' not in page
    refused = post_run(client, csrf_token, world_size=2, device="cuda")
    assert refused.status_code == 409
    assert refused.get_json()["error"] == ("device cuda asked while a lab process is still looking for GPUs on this "
                                           "machine (detection is under way); try again in a few seconds, or use cpu.")
    assert post_run(client, csrf_token, world_size=2, device="cpu").status_code == 202  # cpu needs no detection
    looking = client.get("/labs/devices").get_json()  # what the page's JS polls meanwhile
    assert looking["pending"] is True and looking["options"] == '<option value="cpu">CPU ranks (gloo)</option>'
    assert "Looking for GPUs in a lab process…" in looking["notes"]

    gate.touch()
    assert devices.probe(app).wait(20).devices.cuda_gpus == 1
    found = client.get("/labs/devices").get_json()
    assert found["pending"] is False
    assert found["options"] == ('<option value="cpu">CPU ranks (gloo)</option>'
                                '<option value="cuda">CUDA: 1 GPU (Fake GPU)</option>')
    assert "<li>4 ranks on cuda: this machine has 1 GPU (Fake GPU): 4 real ranks share cuda:0 over gloo</li>" in found["notes"]
    page = client.get(f"/labs/{LAB}").get_data(as_text=True)
    assert "Looking for GPUs" not in page
    assert '<option value="cuda">CUDA: 1 GPU (Fake GPU)</option>' in page
    assert "On CUDA (torch 9.9.0+fake, CUDA 13.0):" in page
    assert "<li>2 ranks on cuda: this machine has 1 GPU (Fake GPU): 2 real ranks share cuda:0 over gloo</li>" in page
    assert "<li>4 ranks on cuda: this machine has 1 GPU (Fake GPU): 4 real ranks share cuda:0 over gloo</li>" in page

    on_gpu = post_run(client, csrf_token, world_size=2, device="cuda")
    assert on_gpu.status_code == 202
    run_id = on_gpu.get_json()["run_id"]
    assert status(client, run_id)["params"] == {"world_size": 2, "device": "cuda"}
    assert post_run(client, csrf_token, world_size=2, device="cuda").get_json()["run_id"] == run_id  # a double click
    form = client.post(f"/labs/{LAB}/runs", data={"csrf_token": csrf_token, "world_size": "4", "device": "cuda"})
    assert form.status_code == 303
    assert [run.params for run in runs(app)] == [{"world_size": 2, "device": "cpu"}, {"world_size": 2, "device": "cuda"},
                                                 {"world_size": 4, "device": "cuda"}]


def test_a_detection_that_fails_is_shown_plainly_and_cuda_is_refused(client, csrf_token, app):
    app.config["LAB_DEVICES_COMMAND"] = devices_command(fail="ModuleNotFoundError: No module named 'torch'")
    client.get(f"/labs/{LAB}")
    error = devices.probe(app).wait(20).error
    assert error == ("could not ask torch for GPUs: the lab process exited with status 1: "
                     "ModuleNotFoundError: No module named 'torch'")
    page = html.unescape(client.get(f"/labs/{LAB}").get_data(as_text=True))
    assert f'<p class="error">{error}. Labs run on CPU ranks.</p>' in page and 'value="cuda"' not in page
    refused = post_run(client, csrf_token, world_size=2, device="cuda")
    assert refused.status_code == 400 and refused.get_json()["error"] == f"device cuda asked, but {error}; use cpu."
    assert runs(app) == []

    app.config["LAB_DEVICES_COMMAND"] = [sys.executable, "-c", "print('no GPUs here')"]
    assert devices.probe(app).wait(20).error == (
        "could not ask torch for GPUs: the lab process answered 'no GPUs here', not its devices "
        "(Expecting value: line 1 column 1 (char 0))")


@pytest.mark.parametrize("device", ["tpu", "CUDA", "cuda:0", "", None, 1, ["cuda"], {"cuda": 1}, "cpu; rm -rf /"])
def test_an_unknown_device_is_400_naming_the_choices_and_queues_nothing(client, csrf_token, app, device):
    response = post_run(client, csrf_token, world_size=2, device=device)
    assert response.status_code == 400
    assert response.get_json()["error"] == f"device must be one of cpu, cuda, got {str(device)[:40]!r}."
    assert runs(app) == []


@pytest.mark.slow  # asks the real torch, in two processes
def test_cuda_is_refused_where_the_lab_process_sees_no_gpu(client, csrf_token, app):
    assert app.config["LAB_DEVICES_COMMAND"] is None  # the real detection: `python -m sharding_lab.engine.devices`
    found = devices.probe(app).wait(90)
    assert found.error is None, found.error
    if found.devices.cuda_gpus:
        pytest.skip("this machine has a GPU: cuda is offered (tests/test_lab_devices.py's gpu test)")
    torch_version = installed_torch_version()
    assert found.devices.torch_version == torch_version and found.devices.devices == ("cpu",)
    refused = post_run(client, csrf_token, world_size=2, device="cuda")
    assert refused.status_code == 400
    assert refused.get_json()["error"] == (
        f"device cuda asked, but the lab process sees no CUDA GPU on this machine (torch {torch_version}); use cpu.")
    page = client.get(f"/labs/{LAB}").get_data(as_text=True)
    assert f"The lab process sees no CUDA GPU on this machine (torch {torch_version}): labs run on CPU ranks." in page
    assert 'value="cuda"' not in page and runs(app) == []


@pytest.mark.slow  # asks the real torch
def test_the_web_process_never_imports_torch_while_detecting(tmp_path):
    """A fresh interpreter, so that torch imported by other tests cannot hide an import by the app."""
    script = textwrap.dedent(f"""
        import json, sys
        from studyapp import create_app
        from studyapp.lab_runs import devices
        app = create_app({{"TESTING": True, "DATABASE_URL": "sqlite:///{tmp_path}/t.db", "SECRET_KEY": "x"}},
                         instance_path="{tmp_path}/instance")
        client = app.test_client()
        first = client.get("/labs/{LAB}").get_data(as_text=True)
        found = devices.probe(app).wait(90)
        second = client.get("/labs/{LAB}").get_data(as_text=True)
        print(json.dumps({{"pending_first": "Looking for GPUs in a lab process" in first,
                          "found": found.devices.to_json() if found.devices else found.error,
                          "offered_after": "sees no CUDA GPU" in second or 'value="cuda"' in second,
                          "torch": sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))}}))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=150, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["pending_first"] and report["offered_after"]
    assert json.loads(report["found"])["torch_version"] == installed_torch_version()
    assert report["torch"] == []  # torch was asked in a lab process, never imported by the web one


def test_a_run_stores_its_device_and_a_row_from_before_devices_means_cpu(app):
    engine = get_engine(app)
    at = datetime(2026, 3, 2, 12, 0, tzinfo=timezone.utc)
    with Session(engine) as session:
        session.add(LabRun(lab_id=LAB, params={"world_size": 2}, status="queued", created_at=at))
        session.commit()
    old = runs(app)[0]
    assert lab_runs.enqueue(engine, LAB, 2).id == old.id  # the same run: it ran on cpu
    on_gpu = lab_runs.enqueue(engine, LAB, 2, "cuda")
    assert on_gpu.id != old.id and on_gpu.params == {"world_size": 2, "device": "cuda"}
    with pytest.raises(ValueError, match=r"unknown device 'tpu'; choose one of cpu, cuda"):
        lab_runs.enqueue(engine, LAB, 2, "tpu")
    assert lab_argv(["sl"], LAB, 2, "cuda") == ["sl", "run", LAB, "--world-size", "2", "--device", "cuda", "--json"]
    assert lab_argv(["sl"], LAB, 4) == ["sl", "run", LAB, "--world-size", "4", "--device", "cpu", "--json"]
    with pytest.raises(ValueError, match="unknown device"):
        lab_argv(["sl"], LAB, 2, "cuda --fail 3")


@launches
def test_a_cuda_run_passes_its_device_to_the_lab_and_the_page_names_the_gpu(client, csrf_token, app, start):
    app.config["LAB_DEVICES_COMMAND"] = devices_command(gpus=1)
    client.get(f"/labs/{LAB}")
    devices.probe(app).wait(20)
    run_id = post_run(client, csrf_token, world_size=2, device="cuda").get_json()["run_id"]
    start()
    body = finished(client, run_id)
    assert body["status"] == "done", body.get("error")
    assert body["result"]["config"]["device"] == "cuda:0" and body["result"]["config"]["gpu_name"] == "Fake GPU"
    page = client.get(f"/labs/{LAB}").get_data(as_text=True)
    assert "measured on cuda:0 (Fake GPU), world size 2, torch fake, CUDA 13.0</span>" in page  # the latest result
    assert "<td>cuda (Fake GPU, CUDA 13.0)</td>" in page  # the past runs
