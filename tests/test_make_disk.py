"""`make test` checks the disk before its 10-minute main suite: the torch 2.11.0 pass installs a
CUDA build of several GiB afterwards, and a full disk used to fail it only at the end."""

import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _make_test_disk(venv: Path, free_gib: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "-s", "test-disk", f"VENV211={venv}", f"TORCH211_FREE_GIB={free_gib}"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )


def test_too_little_disk_for_the_torch211_pass_is_refused_with_the_figures(tmp_path: Path) -> None:
    result = _make_test_disk(tmp_path / "venv", free_gib=10**6)
    assert result.returncode != 0
    stated = re.search(r"needs about 1000000 GiB free; (\S+) has (\d+) GiB free", result.stderr)
    assert stated, result.stderr
    assert stated.group(1) == str(ROOT)
    free_gib = shutil.disk_usage(ROOT).free / 2**30
    assert abs(int(stated.group(2)) - free_gib) < 1.5  # df and statvfs agree on free space, to a GiB


def test_enough_disk_passes_quietly(tmp_path: Path) -> None:
    result = _make_test_disk(tmp_path / "venv", free_gib=0)
    assert (result.returncode, result.stderr) == (0, "")


def test_an_installed_torch211_venv_needs_no_more_disk(tmp_path: Path) -> None:
    (tmp_path / "venv").mkdir()
    (tmp_path / "venv" / ".installed").touch()
    result = _make_test_disk(tmp_path / "venv", free_gib=10**6)
    assert (result.returncode, result.stderr) == (0, "")
