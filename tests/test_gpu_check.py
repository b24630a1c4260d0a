"""scripts/gpu-check gets one try on a lent GPU machine, which has torch, numpy and pytest and nothing
else (no flask, sqlmodel, rich, genanki, network). This runs what the script runs, on CPU, with only
those packages importable: the gpu-marked tests collect without the web app's conftest, a lab runs
through the CLI as JSON, and scripts/gpu_results.py writes its file. An import of anything else on
that path fails here, not on the GPU machine."""

from __future__ import annotations

import importlib.metadata as metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DEVICE_PACKAGES = ("torch", "numpy", "pytest")  # what the GPU machine has, with their own requirements
GPU_TEST_FILES = ("tests/test_sharding_gpu.py", "tests/test_simulate_vs_rank_view.py", "tests/test_labs_checks.py",
                  "tests/test_lab_devices.py")  # as scripts/gpu-check lists them

pytestmark = pytest.mark.slow


def _requirement_closure(names: tuple[str, ...]) -> list[metadata.Distribution]:
    """The installed distributions `names` need, following unconditional requirements (extras left out)."""
    found: dict[str, metadata.Distribution] = {}
    todo = list(names)
    while todo:
        name = re.split(r"[\s<>=!~;\[(]", todo.pop(), maxsplit=1)[0].lower().replace("_", "-")
        if name in found:
            continue
        try:
            found[name] = distribution = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # numpy is optional to torch; absent here, present there
        todo += [r for r in distribution.requires or [] if "extra ==" not in r]
    return list(found.values())


@pytest.fixture(scope="module")
def device_like_path(tmp_path_factory) -> Path:
    """A folder where only the device's packages import (links to this environment's copies)."""
    folder = tmp_path_factory.mktemp("device-site")
    for distribution in _requirement_closure(DEVICE_PACKAGES):
        base = Path(distribution.locate_file(""))
        for top in {Path(str(file)).parts[0] for file in distribution.files or []}:
            if top not in ("..", "__pycache__", "bin") and (base / top).exists() and not (folder / top).exists():
                (folder / top).symlink_to(base / top)
    return folder


def _run_like_the_device(args: list[str], site: Path, **kwargs) -> subprocess.CompletedProcess:
    # -S: no site-packages but `site`; rank processes inherit the flag and PYTHONPATH.
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{REPO}"}
    return subprocess.run([sys.executable, "-S", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300, **kwargs)


def test_the_folder_hides_the_web_apps_packages(device_like_path):
    probe = ("import importlib.util as u, json; print(json.dumps({m: u.find_spec(m) is not None for m in "
             "('torch', 'pytest', 'flask', 'sqlmodel', 'rich', 'genanki', 'yaml')}))")
    found = json.loads(_run_like_the_device(["-c", probe], device_like_path).stdout)
    assert found == {"torch": True, "pytest": True, "flask": False, "sqlmodel": False, "rich": False,
                     "genanki": False, "yaml": False}


def test_the_gpu_tests_collect_without_the_web_app(device_like_path):
    result = _run_like_the_device(["-m", "pytest", "--noconftest", "-p", "no:cacheprovider", "--collect-only", "-q",
                                   "-m", "gpu", *GPU_TEST_FILES], device_like_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    collected = re.search(r"(\d+)/\d+ tests collected", result.stdout)
    assert collected and int(collected.group(1)) >= 10, result.stdout[-2000:]


def test_a_lab_runs_and_gpu_results_collects_it(device_like_path, tmp_path):
    lab = _run_like_the_device(["-m", "sharding_lab.cli", "run", "what-fsdp-shards", "--json"], device_like_path)
    assert lab.returncode == 0, lab.stderr[-3000:]
    run = json.loads(lab.stdout)
    assert run["holds"] is True
    # gpu-check's `run --all --json` gives {"runs": [...]}; one run in that shape
    (tmp_path / "labs.json").write_text(json.dumps({"runs": [run]}))
    (tmp_path / "pytest.txt").write_text("17 skipped in 1.00s\n")
    out = tmp_path / "gpu-results.json"
    collected = _run_like_the_device(["scripts/gpu_results.py", str(tmp_path), str(out)], device_like_path)
    # Exit 1: no simulator comparison was collected (there is no GPU here); the file is written anyway.
    assert collected.returncode == 1, collected.stderr[-3000:]
    results = json.loads(out.read_text())
    assert results["gpu"] is None and results["gpus"] == 0
    assert results["torch"] == lab_torch_version(device_like_path)
    assert results["labs"] == {"what-fsdp-shards": {"holds": True, "finding": run["finding"], "reasons": run["reasons"],
                                                    "placement": ["ranks"]}}
    assert results["pytest"] == ["17 skipped in 1.00s"] and results["labs_error"] is None


def lab_torch_version(site: Path) -> str:
    return _run_like_the_device(["-c", "import torch; print(torch.__version__)"], site).stdout.strip()
