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


def _gpu_check_rehearsal(site: Path, tmp_path: Path, **limits: str) -> tuple[subprocess.CompletedProcess, Path]:
    """scripts/gpu-check itself, whole, on CPU (GPU_CHECK_DEVICE=cpu) with only the device's packages:
    its JSON goes to tmp_path, and what the device tool would bring back to tmp_path/out ($OUT)."""
    python = tmp_path / "python-like-the-device"
    python.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")
    python.chmod(0o755)
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site), "PYTHON": str(python), "GPU_CHECK_DEVICE": "cpu",
           "GPU_CHECK_RESULTS": str(tmp_path / "gpu-results.json"), "OUT": str(out), **limits}
    result = subprocess.run(["bash", "scripts/gpu-check"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    return result, out


def test_the_whole_gpu_check_runs_every_lab_and_brings_its_results_back(device_like_path, tmp_path):
    result, out = _gpu_check_rehearsal(device_like_path, tmp_path)
    # Exit 1: no simulator comparison can be collected without a GPU; everything else ran.
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    assert sorted(path.name for path in out.iterdir()) == ["gpu-results.json", "labs.err", "pytest.txt"]
    results = json.loads((out / "gpu-results.json").read_text())
    assert results == json.loads((tmp_path / "gpu-results.json").read_text())
    assert results["gpu"] is None and results["gpus"] == 0
    assert results["torch"] == lab_torch_version(device_like_path)
    listed = json.loads(_run_like_the_device(["-m", "sharding_lab.cli", "list", "--json"], device_like_path).stdout)
    assert sorted(results["labs"]) == sorted(lab["id"] for lab in listed["labs"])
    assert all(lab["holds"] for lab in results["labs"].values()), results["labs"]
    # CPU ranks, and for a few labs' larger world sizes a rank view; never GPU-shared ranks on CPU
    assert {p for lab in results["labs"].values() for p in lab["placement"]} == {"ranks", "rank-view"}
    assert re.fullmatch(r"\d+ skipped, \d+ deselected in .*", results["pytest"][0]), results["pytest"]
    assert results["stopped"] == [] and results["labs_error"] is None and results["simulator_vs_rank_view"] == []
    # The README's block renders from the file as it comes back, with the device's packages only
    table = _run_like_the_device(["scripts/gpu-table", "--results", str(out / "gpu-results.json")], device_like_path)
    assert table.returncode == 0, table.stderr
    assert f"{len(listed['labs'])} of {len(listed['labs'])} hold; placements used: rank-view, ranks." in table.stdout


def test_a_part_past_its_limit_is_stopped_and_named(device_like_path, tmp_path):
    result, out = _gpu_check_rehearsal(device_like_path, tmp_path, GPU_CHECK_LABS_S="1")
    assert result.returncode == 1
    stopped = "gpu-check: every lab on cpu ran past its 1 s and was stopped"
    assert stopped in result.stderr
    assert (out / "stopped.txt").read_text().strip() == stopped
    results = json.loads((out / "gpu-results.json").read_text())
    assert results["stopped"] == [stopped] and results["labs"] == {}
    assert results["labs_error"].startswith("JSONDecodeError")


def lab_torch_version(site: Path) -> str:
    return _run_like_the_device(["-c", "import torch; print(torch.__version__)"], site).stdout.strip()
