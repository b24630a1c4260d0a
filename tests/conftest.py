"""Fixtures: an app with a fresh database per test (SQLite, and PostgreSQL when
STUDYAPP_TEST_POSTGRES_URL is set), a small bank of its own, a settable clock, the test
client and CLI runner, a live server, Playwright driving Debian's Chromium, and a small disk to fill.

Hypothesis: under CI=true the "ci" profile derandomizes every property test (the same examples
on every run); elsewhere the "dev" profile draws one seed per session, printed in the header and
after a failure (rerun with `--hypothesis-seed=N`)."""

from __future__ import annotations

import inspect
import os
import random
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import core as hypothesis_core
from hypothesis import settings as hypothesis_settings
from sqlalchemy import MetaData, create_engine
from werkzeug.serving import make_server

from studyapp import create_app, lab_runs
from studyapp.db import get_engine
from studyapp.sync import sync_bank

IN_CI = os.environ.get("CI") == "true"
hypothesis_settings.register_profile("ci", derandomize=True, database=None, deadline=None, print_blob=True)
hypothesis_settings.register_profile("dev", deadline=None, print_blob=True)
hypothesis_settings.load_profile("ci" if IN_CI else "dev")  # before test modules build their @settings


def pytest_configure(config) -> None:
    if not IN_CI and config.getoption("hypothesis_seed", None) is None:
        hypothesis_core.global_force_seed = random.SystemRandom().randrange(2**32)


def _hypothesis_seed_line() -> str:
    if IN_CI:
        return "hypothesis: profile ci (CI=true), derandomized: the same examples on every run"
    seed = hypothesis_core.global_force_seed
    return f"hypothesis: profile dev, seed {seed} (rerun with --hypothesis-seed={seed})"


def pytest_collection_modifyitems(config, items) -> None:
    """Mark `torch` every test of a module that uses torch or the lab engine: `make test-torch211`
    runs those again on torch 2.11, the lent GPU machine's release."""
    uses_torch: dict[Path, bool] = {}
    for item in items:
        path = Path(item.path)
        if path not in uses_torch:
            text = path.read_text(encoding="utf-8")
            uses_torch[path] = "import torch" in text or "sharding_lab" in text
        if uses_torch[path]:
            item.add_marker(pytest.mark.torch)


def pytest_report_header(config) -> str:
    return _hypothesis_seed_line()


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if terminalreporter.stats.get("failed") or terminalreporter.stats.get("error"):
        terminalreporter.write_line(_hypothesis_seed_line())


REPO = Path(__file__).resolve().parent.parent


def require_git_checkout(full_history: bool = False) -> None:
    """Skip, saying why, unless REPO is a git checkout (a tarball or a copy has no .git), and with
    full_history, not a shallow clone (`git clone --depth 1` has no parent commits)."""
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
        except FileNotFoundError:
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    top = git("rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != REPO:
        pytest.skip(f"needs {REPO} to be a git checkout (no .git here, or git is not installed)")
    if full_history and git("rev-parse", "--is-shallow-repository") == "true":
        pytest.skip("needs the git history, and this is a shallow clone: run `git fetch --unshallow`")


POSTGRES_URL_ENV = "STUDYAPP_TEST_POSTGRES_URL"
CHROMIUM = os.environ.get("STUDYAPP_CHROMIUM", "/usr/bin/chromium")  # Debian's; Playwright cannot fetch its own
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

# Two small decks written for the tests, so they do not depend on the real bank's wording.
ALPHA_DECK = """\
id: alpha
title: Alpha deck
questions:
  - id: alpha-shards
    prompt: What does FSDP shard that DDP replicates?
    choices:
      - text: Parameters, gradients and optimizer states
        correct: true
      - text: Only the input batches
        why_wrong: Every data-parallel method splits the batch.
      - text: Only the learning rate schedule
        why_wrong: A schedule is a few scalars, nothing to shard.
      - text: The dataset files on disk
        why_wrong: Files on disk are not GPU memory.
    explanation: FSDP keeps 1/N of every model state per rank.
    lab: what-fsdp-shards
    tags: [fsdp]
  - id: alpha-gather
    prompt: Which collective rebuilds a layer's full weights before it runs?
    choices:
      - text: Broadcast-only
        why_wrong: One sender cannot rebuild shards held by everyone.
      - text: All-gather
        correct: true
      - text: Scatter
        why_wrong: Scatter splits data up; it does not gather it.
      - text: Barrier
        why_wrong: A barrier moves no data.
    explanation: Each rank contributes its shard and receives all others.
    lab: allgather-before-layer
    tags: [fsdp]
  - id: alpha-free
    prompt: Why are gathered weights freed after a layer runs?
    choices:
      - text: To corrupt unused gradients
        why_wrong: Nothing is corrupted.
      - text: To keep only one shard per device between layers
        correct: true
    explanation: Only the shard stays resident.
    lab: reshard-after-forward
    tags: [fsdp]
"""

BETA_DECK = """\
id: beta
title: Beta deck
questions:
  - id: beta-adam
    prompt: Why is Adam's optimizer state large?
    choices:
      - text: It keeps two extra values per parameter
        correct: true
      - text: It stores no state
        why_wrong: Adam keeps momentum and variance.
    explanation: Momentum and variance, each fp32.
    lab: adam-optimizer-state
    tags: [zero]
  - id: beta-stage3
    prompt: What does ZeRO stage 3 shard that stages 1 and 2 do not?
    choices:
      - text: The training data
        why_wrong: Data is split by any data parallelism.
      - text: The model parameters
        correct: true
    explanation: Stage 3 shards the parameters themselves.
    lab: stage3-shards-params
    tags: [zero]
"""

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=timezone.utc)  # noon UTC on a Monday


class Clock:
    """A settable clock for the app's CLOCK config: tests step through study days with it."""

    def __init__(self, now: datetime = T0):
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> None:
        self.now += timedelta(**delta)


def write_bank(folder: Path, decks: dict[str, str] | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.yaml"):
        old.unlink()
    for name, text in (decks or {"alpha": ALPHA_DECK, "beta": BETA_DECK}).items():
        (folder / f"{name}.yaml").write_text(text, encoding="utf-8")
    return folder


def _empty_postgres(url: str) -> None:
    """Drop every table, so each test starts from an empty database."""
    engine = create_engine(url)
    try:
        metadata = MetaData()
        metadata.reflect(engine)
        metadata.drop_all(engine)
    finally:
        engine.dispose()


DATABASES = ["sqlite"] + (["postgresql"] if os.environ.get(POSTGRES_URL_ENV) else [])


@pytest.fixture(params=DATABASES)
def database_url(request, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'test.sqlite3'}"
    url = os.environ[POSTGRES_URL_ENV]
    _empty_postgres(url)
    return url


@pytest.fixture
def bank_dir(tmp_path: Path) -> Path:
    return write_bank(tmp_path / "bank")


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def app_config(database_url: str, bank_dir: Path, tmp_path: Path, clock: Clock) -> dict:
    return {
        "TESTING": True,
        "DATABASE_URL": database_url,
        "SECRET_KEY": "test-secret",
        "BANK_PATH": str(bank_dir),
        "EXPORTS_DIR": str(tmp_path / "exports"),
        "TIMEZONE": "UTC",
        "DAY_START_HOUR": 4,
        "CLOCK": clock,
    }


@pytest.fixture
def app(app_config: dict, tmp_path: Path, bank_dir: Path):
    app = create_app(app_config, instance_path=str(tmp_path / "instance"))
    sync_bank(get_engine(app), bank_dir)
    yield app
    # A lab worker left running (e.g. by `serve`) would go on polling a database that the next
    # test reuses (PostgreSQL) and claim that test's runs with this app's settings.
    lab_worker = lab_runs.app_worker(app)
    if lab_worker is not None:
        lab_worker.stop()
    get_engine(app).dispose()


@pytest.fixture
def client(app):
    return app.test_client()


@pytest.fixture
def runner(app):
    return app.test_cli_runner()


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 4 MiB tmpfs of its own. Mounting needs root: without it a full-disk test skips, saying why,
    except under CI=true (which runs as root), where it fails, as the browser tests do."""
    mountpoint = tmp_path / "disk"
    mountpoint.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mountpoint)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        message = f"a full disk needs a tmpfs of its own, and mounting one was refused: {mounted.stderr.strip()}"
        if IN_CI:
            pytest.fail(f"{message}; CI=true, so the full-disk tests must run", pytrace=False)
        pytest.skip(message)
    yield mountpoint
    subprocess.run(["umount", "--lazy", str(mountpoint)], check=True)


def fill(folder: Path) -> Path:
    """Write a file in `folder` until its disk has no block left."""
    filler = folder / "filler"
    descriptor = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(descriptor, b"\0" * 4096)
    except OSError as error:
        assert error.errno == 28, error  # ENOSPC
    finally:
        os.close(descriptor)
    return filler


# Fills the disk of the folder named first (with `fill` itself), then runs the script named second with
# the rest of the arguments: see `filling_first`.
_FILL_THEN_RUN = "import os, runpy, sys\nfrom pathlib import Path\n" + inspect.getsource(fill) + """
fill(Path(sys.argv.pop(1)))
sys.argv[0] = sys.argv.pop(1)
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def filling_first(command: list[str], disk: Path) -> list[str]:
    """`command` (python SCRIPT ARGS..., a fake lab or plan CLI) made to fill `disk` before the script runs,
    so the result it prints meets a full disk."""
    python, script, *args = command
    return [python, "-c", _FILL_THEN_RUN, str(disk), script, *args]


class DatabaseOnSmallDisk:
    """Base of a test class whose app keeps its SQLite database on `small_disk`."""

    @pytest.fixture
    def database_url(self, small_disk: Path) -> str:
        return f"sqlite:///{small_disk / 'test.sqlite3'}"


def csrf_token_of(client) -> str:
    """The client's session CSRF token, as a page would embed it."""
    html = client.get("/").get_data(as_text=True)
    return re.search(r'<meta name="csrf-token" content="([^"]+)">', html).group(1)


@pytest.fixture
def csrf_token(client) -> str:
    return csrf_token_of(client)


@pytest.fixture
def live_server(app) -> Iterator[str]:
    """The app on a real HTTP server in a thread (127.0.0.1, a free port); yields its base URL."""
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    thread.join(timeout=5)


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args: dict) -> dict:
    """Playwright cannot download its own browser here: use Debian's Chromium.
    Without it a browser test skips, except under CI=true, where it fails."""
    if not os.access(CHROMIUM, os.X_OK):
        message = f"Chromium not found at {CHROMIUM} (apt-get install chromium)"
        if IN_CI:
            pytest.fail(f"{message}; CI=true, so browser tests must run", pytrace=False)
        pytest.skip(message)
    return {**browser_type_launch_args, "executable_path": CHROMIUM, "args": CHROMIUM_ARGS}


def with_committed_lab_results(app_config: dict, tmp_path: Path) -> dict:
    """`app_config` with the committed exports/lab-results.json as the reference, as on a fresh install."""
    exports = tmp_path / "reference-exports"
    exports.mkdir()
    shutil.copy(REPO / "exports" / "lab-results.json", exports / "lab-results.json")
    return {**app_config, "EXPORTS_DIR": str(exports)}
