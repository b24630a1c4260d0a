"""The app's lab server (studyapp.lab_runs.server): one long-lived child answers every run (the warm
ranks live in it), a run past its timeout or a stop ends the child's whole group (SIGTERM, then
SIGKILL; the real server leaves no files or semaphores), a child that dies
fails its run clearly and the next run starts a fresh one. Runs the fake tests/data/fake_lab_server.py;
tests/test_sharding_pool.py, test_lab_runs' real-lab test and the last test here cover the real
`sharding-lab serve-labs`."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
from test_lab_runs import devices_command, finished, post_run, process_gone, wait_for
from test_sharding_launch import shared_semaphores

from sharding_lab.proc_stat import read_stat
from studyapp.lab_runs import RunStatus, devices, start_worker
from studyapp.lab_runs import worker as worker_module
from studyapp.lab_runs.server import LabServer, server_argv

FAKE_SERVER = Path(__file__).parent / "data" / "fake_lab_server.py"
LAB = "adam-optimizer-state"
pytestmark = pytest.mark.slow  # starts processes


def fake_server(*options: str) -> list[str]:
    return [sys.executable, str(FAKE_SERVER), *options]


def assert_done(outcome, what: str = "") -> None:
    assert outcome.status == RunStatus.done, f"{what}: {outcome.error}" if what else outcome.error


def test_one_child_answers_every_run():
    server = LabServer(fake_server())
    try:
        first = server.run(LAB, 2, timeout_s=30)
        pid = server.pid
        second = server.run("what-fsdp-shards", 4, timeout_s=30, device="cuda")
        assert first.status == second.status == RunStatus.done
        assert first.result["finding"] == second.result["finding"] == f"served by {pid}"
        assert first.result["config"] == {"world_size": 2, "device": "cpu"}  # the request carried the device
        assert second.result["lab"] == "what-fsdp-shards" and second.result["config"] == {"world_size": 4, "device": "cuda"}
        assert server.run("no-such-lab", 2, timeout_s=30).status == RunStatus.failed
        refused = server.run(LAB, 2, timeout_s=30, device="tpu")
        assert refused.status == RunStatus.failed
        assert refused.error == "could not start the lab: unknown device 'tpu'; choose one of cpu, cuda"
    finally:
        server.stop()
    assert process_gone(pid)


def test_a_run_past_its_timeout_kills_the_child_and_its_group_and_the_next_run_starts_afresh(tmp_path):
    log = tmp_path / "fake.log"
    server = LabServer(fake_server("--sleep", "60", "--child", "--log", str(log)))
    try:
        outcome = server.run(LAB, 2, timeout_s=2)
        assert outcome.status == RunStatus.failed and outcome.error.startswith("timed out after 2 s")
        assert "request 0: adam-optimizer-state" in outcome.error  # the stderr tail says how far it got
        pids = [int(line.split()[1]) for line in log.read_text().splitlines()]
        assert len(pids) == 2
        wait_for(lambda: all(process_gone(pid) for pid in pids), 10, "the child and its grandchild gone")
        server.argv = fake_server()
        assert_done(server.run(LAB, 2, timeout_s=30))
    finally:
        server.stop()


def test_a_child_that_dies_fails_its_run_clearly_and_an_engine_error_is_a_failed_run(tmp_path):
    server = LabServer(fake_server("--die-after", "1", "--error-for", "what-fsdp-shards"))
    try:
        failed = server.run("what-fsdp-shards", 2, timeout_s=30)
        assert failed.status == RunStatus.failed and failed.error.startswith("rank 1 failed")
        died = server.run(LAB, 2, timeout_s=30)
        assert died.status == RunStatus.failed and "the lab server exited with status 3" in died.error
        assert_done(server.run(LAB, 2, timeout_s=30), "a fresh child")
    finally:
        server.stop()


def test_a_run_sent_while_a_killed_child_is_still_ending_goes_to_a_fresh_child():
    # Killed outright, a server's main thread can be gone while its last thread is not: it cannot be reaped
    # yet and reads no more requests (a CI run once sent a lab to one in that window, and it failed). The
    # fake ends its main thread after one answer and keeps another for 5 s.
    server = LabServer(fake_server("--leader-exits-after", "1"))
    try:
        assert_done(server.run(LAB, 2, timeout_s=30), "the first run")
        ending = server.process
        wait_for(lambda: read_stat(ending.pid).state == "Z" and ending.poll() is None, 4,
                 "its main thread gone, another still running (so it cannot be reaped)")
        fresh = server.run(LAB, 2, timeout_s=30)
        assert_done(fresh, "the run after")
        assert fresh.result["finding"] == f"served by {server.pid}" and server.pid != ending.pid
        assert ending.returncode == 0, "the old child was waited for, not killed"
    finally:
        server.stop()


def test_the_worker_runs_on_the_lab_server_and_its_stop_leaves_nothing(client, csrf_token, app, monkeypatch, tmp_path):
    log = tmp_path / "fake.log"
    monkeypatch.setattr(worker_module, "server_argv", lambda idle_s, timeout_s: fake_server("--child", "--log", str(log)))
    app.config.update(LAB_COMMAND=None, LAB_TIMEOUT_S=30, LAB_DEVICES_COMMAND=devices_command(gpus=1))
    client.get(f"/labs/{LAB}")
    assert devices.probe(app).wait(20).devices.cuda_gpus == 1
    worker = start_worker(app)
    try:
        first = post_run(client, csrf_token, world_size=2).get_json()["run_id"]
        assert finished(client, first)["status"] == "done"
        second = post_run(client, csrf_token, "what-fsdp-shards", world_size=2, device="cuda").get_json()["run_id"]
        body = finished(client, second)
        assert body["status"] == "done" and body["result"]["finding"] == f"served by {worker.lab_server.pid}"
        assert body["result"]["config"]["device"] == "cuda"  # the worker passed the run's device on
        starts = [line for line in log.read_text().splitlines() if line.startswith("start")]
        assert len(starts) == 1, "both runs on one child"
    finally:
        worker.stop()
    pids = [int(line.split()[1]) for line in log.read_text().splitlines()]
    wait_for(lambda: all(process_gone(pid) for pid in pids), 10, "the lab server and its child gone")


def test_the_real_lab_server_runs_a_lab_on_the_device_asked_and_refuses_an_unknown_one():
    server = LabServer(server_argv(idle_timeout_s=60, timeout_s=240))
    try:
        outcome = server.run(LAB, 2, timeout_s=240, device="cpu")
    finally:
        server.stop()
    assert outcome.status == RunStatus.done, outcome.error
    config = outcome.result["config"]
    assert outcome.result["holds"] is True and config["device"] == "cpu" and config["backend"] == "gloo"
    assert config["world_size"] == 2 and config["torch_version"] and config["gpu_name"] is None

    # What the web side never sends (LabServer.run refuses it first), the real server refuses too.
    request = json.dumps({"lab": LAB, "world_size": 2, "device": "tpu"})
    done = subprocess.run([sys.executable, "-m", "sharding_lab.cli", "serve-labs"], input=request + "\n",
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == {"error": "unknown device 'tpu'; choose one of cpu, cuda"}


def test_the_real_lab_server_leaves_no_files_or_semaphores_when_stopped_or_timed_out(tmp_path, monkeypatch):
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))  # the child's temporary files: its pools' folders
    semaphores = shared_semaphores()
    server = LabServer(server_argv(idle_timeout_s=60, timeout_s=240))
    try:
        assert_done(server.run(LAB, 2, timeout_s=240))
        assert any(path.name.startswith("sharding-lab-pool-") for path in temp.iterdir()), "a warm pool's folder"
        assert shared_semaphores() - semaphores, "its ranks' queues hold semaphores while the pool is up"
        pid = server.pid
    finally:
        server.stop()
    assert process_gone(pid)
    assert [path.name for path in temp.iterdir() if path.name.startswith("sharding-lab")] == []
    assert shared_semaphores() - semaphores == set()

    # Stopped mid-run (a timeout or the worker's stop): once the fresh child's pool is up, before it answers.
    outcomes = []
    running = threading.Thread(target=lambda: outcomes.append(server.run("reshard-after-forward", 2, timeout_s=240)))
    running.start()
    wait_for(lambda: any(path.name.startswith("sharding-lab-pool-") for path in temp.iterdir()), 120, "the pool up")
    server.stop()
    running.join(30)
    assert outcomes[0].status == RunStatus.failed, "stopped before it answered"
    assert "exited with status 143" in outcomes[0].error, "it unwound from SIGTERM, not SIGKILL"
    assert [path.name for path in temp.iterdir() if path.name.startswith("sharding-lab")] == []
    assert shared_semaphores() - semaphores == set()


def rank_pids(server_pid: int) -> list[int]:
    """The lab server's rank processes (its spawned children, not multiprocessing's resource tracker)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            command = (stat.parent / "cmdline").read_bytes().decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue
        if parent == server_pid and "spawn_main" in command:
            found.append(int(stat.parent.name))
    return sorted(found)


def test_a_hung_rank_in_the_real_lab_server_is_named_before_the_run_times_out(tmp_path, monkeypatch):
    # `kill -STOP` on a warm rank: the server's own hang detection must answer (naming the rank) before
    # the app's timeout stops the whole server, which says only that the time ran out.
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # where the server saves the hung rank's stack
    server = LabServer(server_argv(idle_timeout_s=60, timeout_s=40))
    try:
        assert_done(server.run(LAB, 2, timeout_s=240))
        pid, ranks = server.pid, rank_pids(server.pid)
        assert len(ranks) == 2
        os.kill(ranks[1], signal.SIGSTOP)
        outcome = server.run(LAB, 2, timeout_s=40)
        assert outcome.status == RunStatus.failed
        assert "rank 1 failed: hung" in outcome.error, outcome.error
        assert "Traceback" not in outcome.error
        assert server.pid == pid, "the server answered, so it was not stopped"
        wait_for(lambda: all(process_gone(rank) for rank in ranks), 10, "the hung pool's ranks gone")
        assert_done(server.run(LAB, 2, timeout_s=240), "a fresh pool")
    finally:
        server.stop()


def pool_folders(temp: Path) -> list[str]:
    return sorted(path.name for path in temp.iterdir() if path.name.startswith("sharding-lab"))


def test_a_lab_server_killed_with_sigkill_leaves_no_rank_and_the_next_start_removes_its_folder(tmp_path, monkeypatch):
    # The OOM killer or a `kill -9`: nothing of the server runs. Its ranks die with it (their parent-death
    # signal); its pool's folder is removed by the next pool to start, and by the app's stop.
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the child's temporary directory
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # and this process's, as in an app started so
    semaphores = shared_semaphores()
    server = LabServer(server_argv(idle_timeout_s=60, timeout_s=240))
    try:
        assert_done(server.run(LAB, 2, timeout_s=240))
        killed, ranks = server.pid, rank_pids(server.pid)
        left = pool_folders(tmp_path)
        assert len(ranks) == 2 and len(left) == 1
        os.kill(killed, signal.SIGKILL)
        wait_for(lambda: all(process_gone(rank) for rank in ranks), 10, "the killed server's ranks gone")
        # Its ranks get their parent-death signal when the thread that started them exits, which can be
        # before the server's last thread has. A run in that window is the test before this one's; this
        # one is of a server already gone.
        wait_for(lambda: server.pid is None, 10, "the killed server reaped")
        assert_done(server.run(LAB, 2, timeout_s=240), "a fresh server")
        assert server.pid != killed
        assert left[0] not in pool_folders(tmp_path), "the next pool removed the killed server's folder"
        assert len(pool_folders(tmp_path)) == 1, "the live server's own"
        # Killed again, then the app stops: the stop removes what it left.
        killed, ranks = server.pid, rank_pids(server.pid)
        os.kill(killed, signal.SIGKILL)
        wait_for(lambda: all(process_gone(rank) for rank in ranks), 10, "the second server's ranks gone")
    finally:
        server.stop()
    assert pool_folders(tmp_path) == []
    # A SIGKILLed server's semaphores are unlinked by multiprocessing's resource tracker once the last process
    # using them is gone: asynchronously, and seconds later on a loaded machine (a CI run read it too soon).
    wait_for(lambda: not (shared_semaphores() - semaphores), 30, "the killed servers' semaphores unlinked")
    assert shared_semaphores() - semaphores == set()


APP_STAND_IN = """
import sys, time
sys.path.insert(0, sys.argv[1])
from studyapp.lab_runs.server import LabServer, server_argv
from test_lab_server import rank_pids
server = LabServer(server_argv(idle_timeout_s=60, timeout_s=240))
outcome = server.run("adam-optimizer-state", 2, timeout_s=240)
print(outcome.status.value, server.pid, *rank_pids(server.pid), flush=True)
time.sleep(600)
"""


def test_an_app_killed_with_sigkill_takes_its_lab_server_ranks_and_folders_with_it(tmp_path):
    # The server gets SIGTERM when its parent dies (not SIGKILL), so it unwinds as from a stop.
    semaphores = shared_semaphores()
    app = subprocess.Popen([sys.executable, "-c", APP_STAND_IN, str(Path(__file__).parent)], stdout=subprocess.PIPE,
                           text=True, env={**os.environ, "TMPDIR": str(tmp_path)})
    try:
        status, *pids = app.stdout.readline().split()
        assert status == "done" and len(pids) == 3, (status, pids)
        assert len(pool_folders(tmp_path)) == 1
    finally:
        app.kill()
        app.wait()
    wait_for(lambda: all(process_gone(int(pid)) for pid in pids), 15, "the lab server and its ranks gone")
    wait_for(lambda: pool_folders(tmp_path) == [], 5, "the pool's folder removed")
    assert shared_semaphores() - semaphores == set()


def as_pid_1() -> list[str]:
    """The argv prefix that runs a command as pid 1 of a new pid namespace (as a container's entrypoint
    is); skips where that is not allowed."""
    prefix = ["unshare", "--pid", "--fork", "--mount-proc"]
    if shutil.which("unshare") is None or subprocess.run([*prefix, "true"], capture_output=True).returncode != 0:
        pytest.skip("needs unshare and the right to make a pid namespace")
    return prefix


PID_1_APP = """
import os, sys
from studyapp.lab_runs.server import LabServer, server_argv
server = LabServer(server_argv(idle_timeout_s=60, timeout_s=240))
outcome = server.run("adam-optimizer-state", 2, timeout_s=240)
server.stop()
print(os.getpid(), outcome.status.value, outcome.error)
"""


def test_an_app_that_is_pid_1_gets_a_lab_server(tmp_path):
    # A container's entrypoint is pid 1: its lab server took its parent's pid for "the parent is gone" and
    # exited 1 at once, so every run failed with "the lab server exited with status 1 before answering".
    done = subprocess.run([*as_pid_1(), sys.executable, "-c", PID_1_APP], capture_output=True, text=True,
                          timeout=240, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert done.stdout.split(maxsplit=2)[:2] == ["1", "done"], done.stdout + done.stderr[-2000:]
    assert pool_folders(tmp_path) == []
