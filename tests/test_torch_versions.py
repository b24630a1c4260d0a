"""The torch range the engine has run on (sharding_lab.torch_versions): inside it nothing is said,
outside it the run is refused before a rank starts, naming the version, the range and the way out."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sharding_lab import torch_versions
from sharding_lab.torch_versions import TorchVersionOutsideRange, check, minor

REPO = Path(__file__).resolve().parents[1]


def test_reads_major_and_minor_from_any_build_string():
    assert minor("2.11.0+cu130") == (2, 11)
    assert minor("2.13.0") == (2, 13)
    assert minor("2.14.0.dev20261101+cpu") == (2, 14)
    assert minor("nightly") is None


@pytest.mark.parametrize("version", ["2.11.0+cu130", "2.11.3", "2.12.1+cpu", "2.13.0+cpu", "2.14.1"])
def test_versions_inside_the_range_pass_silently(version):
    assert check(version, env={}) is None


@pytest.mark.parametrize("version", ["2.10.1", "2.6.0", "2.15.0", "3.0.0", "nightly"])
def test_versions_outside_are_refused_naming_version_range_and_the_way_out(version):
    with pytest.raises(TorchVersionOutsideRange) as refused:
        check(version, env={})
    message = str(refused.value)
    assert f"torch {version} is outside" in message and "2.11 to 2.14" in message
    assert "2.11.0+cu130" in message and "2.13.0+cpu" in message  # the builds actually run
    assert "SHARDING_LAB_UNTESTED_TORCH=1" in message


def test_the_override_turns_the_refusal_into_a_warning():
    warning = check("2.15.0", env={"SHARDING_LAB_UNTESTED_TORCH": "1"})
    assert warning is not None and warning.startswith("warning: torch 2.15.0 is outside")
    with pytest.raises(TorchVersionOutsideRange, match="not installed"):
        check(None, env={"SHARDING_LAB_UNTESTED_TORCH": "1"})  # nothing to run on at all


def test_the_installed_version_is_read_without_importing_torch():
    code = ("import sys; from sharding_lab import torch_versions; v = torch_versions.installed(); "
            "print(v, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout
    import torch

    version, imported = out.split()
    # The metadata's version; torch.__version__ may add the build's local label (2.14.1 -> 2.14.1+cu130).
    assert torch.__version__.startswith(version) and imported == "False"


def test_measuring_on_a_torch_outside_the_range_is_refused_before_any_rank_starts(monkeypatch, capsys):
    from sharding_lab import cli
    from sharding_lab.engine import measure

    monkeypatch.delenv(torch_versions.UNTESTED_OK, raising=False)
    monkeypatch.setattr(torch_versions, "installed", lambda: "2.9.1")
    monkeypatch.setattr(measure, "run_ranks", lambda *a, **k: pytest.fail("a rank was started"))
    assert cli.main(["measure", "--strategy", "zero3", "--world-size", "2"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("sharding-lab: torch 2.9.1 is outside the versions this engine has run on")
    assert "Traceback" not in error
