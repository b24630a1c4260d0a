"""`--simulate`: FSDP2 on fake tensors and a fake process group, against the analytic model."""

from __future__ import annotations

import argparse
import json
import math

import pytest

from sharding_lab import estimate
from sharding_lab.analytic import fsdp_padded_numel, model_states_bytes_per_rank
from sharding_lab.engine.model import GPT, config_for
from sharding_lab.engine.simulate import ADAM_STEP_COUNTER_BYTES, simulate


def run_estimate_cli(argv: list[str]) -> int:
    """Parse `argv` as the sharding-lab CLI would (a subparser registered by estimate) and dispatch."""
    parser = argparse.ArgumentParser(prog="sharding-lab")
    estimate.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["estimate", *argv])
    return args.func(args)


def tiny_shapes() -> list[tuple[int, ...]]:
    import torch

    with torch.device("meta"):
        model = GPT(config_for("tiny"))
    return [tuple(p.shape) for p in model.parameters()]


@pytest.fixture(scope="module")
def tiny_at_8_ranks() -> dict:
    return simulate("tiny", 8, batch=2, seq=32)


def test_model_states_match_the_analytic_model_exactly(tiny_at_8_ranks):
    result = tiny_at_8_ranks
    shapes = tiny_shapes()
    num_params = sum(math.prod(s) for s in shapes)
    assert result["num_params"] == num_params
    expected = model_states_bytes_per_rank(num_params, 8, "zero3", padded_num_params=fsdp_padded_numel(shapes, 8))
    per_rank = result["per_rank"]
    assert per_rank["params"] == expected["params"]
    assert per_rank["grads"] == expected["grads"]
    # Adam's state: exp_avg and exp_avg_sq (the paper's 8 B/param) plus one scalar step per tensor.
    assert per_rank["optimizer"] == expected["optimizer"] + ADAM_STEP_COUNTER_BYTES * len(shapes)
    assert result["model_states_match_prediction"]


def test_activations_and_peak_are_reported(tiny_at_8_ranks):
    per_rank = tiny_at_8_ranks["per_rank"]
    assert per_rank["activations"] > 0
    # The peak holds the persistent sharded states plus what forward/backward adds on top.
    assert per_rank["peak"] > per_rank["params"] + per_rank["optimizer"]
    assert tiny_at_8_ranks["peak_breakdown"]["total"] == per_rank["peak"]
    assert tiny_at_8_ranks["peak_rss_bytes"] > 0
    assert tiny_at_8_ranks["wall_s"] > 0


def test_uneven_world_size_pads_like_fsdp2():
    # 3 does not divide tiny's dims: rank 0 holds the padded (largest) shard of every parameter.
    result = simulate("tiny", 3, batch=1, seq=16, steps=1)
    padded = fsdp_padded_numel(tiny_shapes(), 3)
    assert result["padded_num_params"] == padded > result["num_params"]
    assert result["per_rank"]["params"] == 4 * padded // 3
    assert result["model_states_match_prediction"]


def test_a_1b_model_at_96_ranks_matches_with_padding():
    # 96 divides the vocabulary (50304) but not block_size or n_embd (2048): padding matters.
    result = simulate("1b", 96, batch=1, seq=64, steps=1)
    assert result["padded_num_params"] > result["num_params"]
    assert result["model_states_match_prediction"]


def test_activations_grow_with_the_batch():
    small = simulate("tiny", 4, batch=1, seq=32, steps=1)["per_rank"]["activations"]
    large = simulate("tiny", 4, batch=4, seq=32, steps=1)["per_rank"]["activations"]
    assert large > 3 * small


def test_refuses_a_sequence_longer_than_the_model():
    with pytest.raises(ValueError, match="block_size"):
        simulate("tiny", 2, seq=64)


def test_cli_json_carries_simulated_and_analytic_figures(capsys):
    assert run_estimate_cli(["--simulate", "--size", "tiny", "--world-size", "8", "--batch", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    simulated = report["simulate"]
    assert simulated["world_size"] == 8
    assert simulated["seq"] == 32  # tiny's block_size, shorter than the default 128
    for key in ("params", "grads", "optimizer", "activations", "peak"):
        assert simulated["per_rank"][key] > 0
    assert report["params"] == simulated["num_params"]
    assert set(report["strategies"]) == {"ddp", "zero1", "zero2", "zero3"}


def test_cli_table(capsys):
    assert run_estimate_cli(["--simulate", "--size", "tiny", "--world-size", "2"]) == 0
    out = capsys.readouterr().out
    assert "Simulated" in out
    assert "activations" in out
    assert "peak host RSS" in out


def test_cli_names_the_sizes_for_an_unknown_one():
    with pytest.raises(SystemExit, match="unknown model size 'huge'.*tiny"):
        run_estimate_cli(["--simulate", "--size", "huge", "--world-size", "2"])


def test_global_peak_tracker_agrees_with_fsdp_mem_tracker(monkeypatch):
    # The simulation skips FSDPMemTracker's per-module peaks for speed; the global figures must not move.
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    from sharding_lab.engine import simulate as simulate_module

    fast = simulate("tiny", 4, batch=2, seq=32)
    monkeypatch.setattr(simulate_module, "_GlobalPeakMemTracker", FSDPMemTracker)
    stock = simulate("tiny", 4, batch=2, seq=32)
    assert fast["per_rank"] == stock["per_rank"]
    assert fast["peak_breakdown"] == stock["peak_breakdown"]
