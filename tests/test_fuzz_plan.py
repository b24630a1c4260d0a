"""scripts/fuzz-plan: random small plans held to the simulation (FSDP) or real ranks' tracker (DDP)."""

from __future__ import annotations

import random
import subprocess
import sys
import types
from dataclasses import replace
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "fuzz-plan"
fuzz = sys.modules["fuzz_plan"] = types.ModuleType("fuzz_plan")  # a script without .py, run as a module
fuzz.__file__ = str(SCRIPT)
exec(compile(SCRIPT.read_text(), fuzz.__file__, "exec"), fuzz.__dict__)


def test_the_fsdp_shapes_are_valid_plans_across_every_option():
    rng = random.Random(5)
    requests = [fuzz.fsdp_request(rng) for _ in range(300)]
    assert {r.strategy.value for r in requests} == {"zero2", "zero3"}
    for option in ("mixed_precision", "activation_checkpointing"):
        assert {getattr(r, option) for r in requests} == {True, False}
    assert {r.model.tied for r in requests} == {True, False}
    assert {r.grad_accum_steps for r in requests} == {1, 2, 3}
    assert {r.mesh.shards for r in requests} >= {1, 2, 8} and max(r.mesh.replicas for r in requests) > 1


def test_a_plan_that_differs_is_named_and_the_exit_is_1(monkeypatch, capsys, tmp_path):
    plans = [fuzz.Outcome("zero3 a", 100, 100, "block 0 backward"), fuzz.Outcome("zero2 b", 90, 100, "loss backward")]
    monkeypatch.setattr(fuzz, "fsdp_outcomes", lambda count, rng: iter(plans[:count]))
    out = tmp_path / "plans.jsonl"
    assert fuzz.main(["fsdp", "--count", "2", "--out", str(out)]) == 1
    printed = capsys.readouterr().out
    assert "differs: -10 B (-10.00%) at loss backward: zero2 b" in printed
    assert "1 of 2 analytic peaks equal the simulation's" in printed
    assert len(out.read_text().splitlines()) == 2
    assert fuzz.main(["fsdp", "--count", "1"]) == 0


@pytest.mark.slow
@pytest.mark.parametrize(("against", "equal"), [
    ("fsdp", "the simulation's"),
    ("ddp", "the tracker's on the fullest rank"),  # real CPU ranks
])
def test_random_plans_equal_what_they_are_held_to(against, equal):
    run = subprocess.run([sys.executable, str(SCRIPT), against, "--count", "4", "--seed", "46"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr[-2000:]
    assert f"4 of 4 analytic peaks equal {equal}, byte for byte (seed 46)" in run.stdout


def test_describe_names_the_options_that_are_on():
    request = fuzz.fsdp_request(random.Random(1))
    request = replace(request, mixed_precision=True, activation_checkpointing=False, grad_accum_steps=2)
    described = fuzz._describe(request)
    assert "bf16" in described and "checkpointing" not in described and f"x{2}" in described
