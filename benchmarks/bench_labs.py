"""Labs that answer in the time a page takes, measured side by side in one run:

(a) one lab through the app, from the POST to the stored result, on warm ranks (the lab server's pool
    already up), over a cold `import torch` in a fresh interpreter: the two interleaved, round by round;
    the first lab after the app starts (cold pool: process start, torch, the process group) is reported;
(b) every lab in one `sharding-lab run --all`, wall time over the seconds the ranks spent measuring
    (the labs' own cost, from the run's JSON): what process start-up and evaluation add.
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.figure import Figure

LAB = "reshard-after-forward"  # the lab the issue timed through the app (12.2 s before warm ranks)
ROUNDS = 5


def import_torch_seconds() -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch"], check=True, capture_output=True)
    return time.perf_counter() - started


class AppLab:
    """The study app with its lab worker, driven like a browser: POST the run, poll until stored."""

    def __init__(self, folder: Path):
        from studyapp import create_app
        from studyapp.lab_runs import start_worker

        self.app = create_app(
            {"DATABASE_URL": f"sqlite:///{folder / 'labs.sqlite3'}", "SECRET_KEY": "bench", "TESTING": True,
             "LAB_TIMEOUT_S": 300}, instance_path=str(folder / "instance"),
        )
        self.client = self.app.test_client()
        page = self.client.get(f"/labs/{LAB}").get_data(as_text=True)
        self.token = re.search(r'name="csrf-token" content="([^"]+)"', page)[1]
        self.worker = start_worker(self.app)

    def run_seconds(self) -> float:
        started = time.perf_counter()
        response = self.client.post(f"/labs/{LAB}/runs", json={"world_size": 2}, headers={"X-CSRF-Token": self.token})
        assert response.status_code == 202, response.get_data(as_text=True)
        while (body := self.client.get(response.json["url"]).json)["status"] not in ("done", "failed"):
            time.sleep(0.05)  # a page polls far less often; polling harder only takes CPU from the ranks
        seconds = time.perf_counter() - started
        assert body["status"] == "done" and body["result"]["holds"], body
        return seconds

    def close(self) -> None:
        self.worker.stop()


def run_all() -> tuple[float, float]:
    """(wall seconds, seconds in the ranks) of one `sharding-lab run --all --json`."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "sharding_lab.cli", "run", "--all", "--json"],
                          capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - started
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert all(run["holds"] for run in report["runs"]), done.stderr[-2000:]
    return wall, report["rank_s"]


def run() -> list[Figure]:
    with tempfile.TemporaryDirectory() as tmp:
        lab = AppLab(Path(tmp))
        try:
            cold_lab = lab.run_seconds()
            warm, torch_import = [], []
            for _ in range(ROUNDS):  # interleaved, so drift on a shared machine hits both alike
                torch_import.append(import_torch_seconds())
                warm.append(lab.run_seconds())
        finally:
            lab.close()
    ratio = statistics.median(w / t for w, t in zip(warm, torch_import, strict=True))
    all_wall, all_rank = run_all()
    return [
        Figure(
            f"labs: {LAB} through the app, warm / cold `import torch`",
            ratio,
            "x",
            "<= 1.0",
            f"median of {ROUNDS} interleaved rounds: POST to stored result {statistics.median(warm):.2f} s against "
            f"{statistics.median(torch_import):.2f} s for `python -c 'import torch'`",
        ),
        Figure("labs: the first lab after the app starts (cold pool), POST to stored result", cold_lab, "s", "",
               "ranks started, torch imported and the process group built for it"),
        Figure(
            "labs: `sharding-lab run --all` wall / the ranks' own seconds",
            all_wall / all_rank,
            "x",
            "<= 3",
            f"{all_wall:.1f} s for every lab in one command against {all_rank:.1f} s spent measuring in the ranks",
        ),
    ]
