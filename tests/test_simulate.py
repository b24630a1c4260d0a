"""`--simulate`: FSDP2 on fake tensors and a fake process group, against bytes worked out by hand."""

from __future__ import annotations

import argparse
import json
import math

import pytest

from sharding_lab import estimate
from sharding_lab.engine.model import GPT, config_for
from sharding_lab.engine.simulate import simulate

# The expected bytes are worked out by hand from tiny's shapes (block_size 32, vocab 128, 4 blocks,
# n_embd 32, biases): FSDP2 keeps fp32 shards of every parameter, its gradient and Adam's exp_avg and
# exp_avg_sq (4 + 4 + 8 bytes an element) plus Adam's fp32 scalar `step` per tensor (4 bytes).
# A rank holds ceil(dim0 / N) rows of each parameter; rank 0 (the one simulated) a full chunk.
C = 32
BLOCK_SHAPES = [
    (C,), (C,),  # ln_1
    (3 * C, C), (3 * C,),  # attn.c_attn
    (C, C), (C,),  # attn.c_proj
    (C,), (C,),  # ln_2
    (4 * C, C), (4 * C,),  # mlp.c_fc
    (C, 4 * C), (C,),  # mlp.c_proj
]
ROOT_SHAPES = [(128, C), (32, C), (C,), (C,), (128, C)]  # wte, wpe, ln_f, lm_head: the root FSDP unit
TINY_ELEMENTS = 60_096  # root 4096 + 1024 + 64 + 4096 = 9280, each block 12,704 (x4 = 50,816)
TINY_TENSORS = 53  # 5 in the root, 12 per block
ROOT_ELEMENTS, BLOCK_ELEMENTS = 9_280, 12_704
STEP_COUNTERS = 4 * TINY_TENSORS  # 212 bytes


def run_estimate_cli(argv: list[str]) -> int:
    """Parse `argv` as the sharding-lab CLI would (a subparser registered by estimate) and dispatch."""
    parser = argparse.ArgumentParser(prog="sharding-lab")
    estimate.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["estimate", *argv])
    return args.func(args)


def model_shapes(size: str) -> list[tuple[int, ...]]:
    import torch

    with torch.device("meta"):
        model = GPT(config_for(size))
    return [tuple(p.shape) for p in model.parameters()]


def rank0_elements(shapes: list[tuple[int, ...]], world_size: int) -> int:
    """Rank 0's share under FSDP2: ceil(dim0 / N) rows of every parameter."""
    return sum(math.ceil(shape[0] / world_size) * math.prod(shape[1:]) for shape in shapes)


def test_the_hand_written_shapes_are_tiny_s():
    shapes = model_shapes("tiny")
    assert sorted(shapes) == sorted(ROOT_SHAPES + 4 * BLOCK_SHAPES)
    assert (sum(math.prod(s) for s in shapes), len(shapes)) == (TINY_ELEMENTS, TINY_TENSORS)
    assert sum(math.prod(s) for s in ROOT_SHAPES) == ROOT_ELEMENTS
    assert sum(math.prod(s) for s in BLOCK_SHAPES) == BLOCK_ELEMENTS


@pytest.fixture(scope="module")
def tiny_at_8_ranks() -> dict:
    return simulate("tiny", 8, batch=2, seq=32)


@pytest.mark.slow
def test_model_states_at_8_ranks_are_an_eighth_of_each(tiny_at_8_ranks):
    # Every dim0 of tiny (128, 32, 96) divides by 8: rank 0 holds 60,096 / 8 = 7,512 elements.
    result = tiny_at_8_ranks
    assert (result["num_params"], result["padded_num_params"]) == (TINY_ELEMENTS, TINY_ELEMENTS)
    per_rank = result["per_rank"]
    assert per_rank["params"] == 4 * 7_512 == 30_048
    assert per_rank["grads"] == 30_048
    assert per_rank["optimizer"] == 8 * 7_512 + STEP_COUNTERS == 60_308
    assert per_rank["model_states"] == 120_404
    assert result["model_states_match_prediction"]


@pytest.mark.slow
def test_activations_and_peak(tiny_at_8_ranks):
    result, per_rank = tiny_at_8_ranks, tiny_at_8_ranks["per_rank"]
    after_forward, peak = result["after_forward"], result["peak_breakdown"]
    # After forward the root unit stays gathered (FSDP2 keeps the root's parameters whole for
    # backward); every block is resharded. At the peak one block is gathered beside the root.
    assert after_forward["unsharded_params"] == 4 * ROOT_ELEMENTS == 37_120
    assert peak["unsharded_params"] == 4 * (ROOT_ELEMENTS + BLOCK_ELEMENTS) == 87_936
    assert after_forward["inputs"] == peak["inputs"] == 2 * (2 * 32 * 8)  # idx and targets: int64 (2, 32)
    # Each block's forward keeps about 17 residual widths a token for backward (the inputs of both
    # layer norms, of the four Linears and of GELU, q, k, v and attention's output): 17 to 18 x 32
    # floats x 4 bytes x 32 tokens x 4 blocks, for each of the 2 sequences.
    assert 2 * 17 * C * 4 * 32 * 4 <= per_rank["activations"] <= 2 * 18 * C * 4 * 32 * 4
    # The peak is one moment's total, in the second step: Adam's state exists, gradients are not yet made.
    assert peak["total"] == per_rank["peak"] == sum(v for k, v in peak.items() if k != "total")
    assert (peak["params"], peak["optimizer"], peak["grads"]) == (per_rank["params"], per_rank["optimizer"], 0)
    assert peak["total"] >= after_forward["total"] == sum(v for k, v in after_forward.items() if k != "total")
    assert 0 < result["wall_s"] < 120


@pytest.mark.slow
def test_uneven_world_size_pads_like_fsdp2():
    # 3 divides none of tiny's dim0s (128, 96, 32): rank 0 holds ceil(dim0 / 3) rows of each,
    # 43 of 128, 32 of 96 and 11 of 32: root 3,126 elements, each block 4,301, 20,330 in all.
    result = simulate("tiny", 3, batch=1, seq=16, steps=1)
    assert rank0_elements(ROOT_SHAPES + 4 * BLOCK_SHAPES, 3) == 3_126 + 4 * 4_301 == 20_330
    assert (result["num_params"], result["padded_num_params"]) == (TINY_ELEMENTS, 3 * 20_330)
    assert result["per_rank"]["params"] == result["per_rank"]["grads"] == 4 * 20_330
    assert result["per_rank"]["optimizer"] == 8 * 20_330 + STEP_COUNTERS
    assert result["after_forward"]["unsharded_params"] == 4 * 3 * 3_126  # the root gathered: padded chunks
    assert result["model_states_match_prediction"]


@pytest.mark.slow
def test_a_1b_model_at_96_ranks_matches_with_padding():
    # 96 divides the vocabulary (50304) and 3 x n_embd, not block_size or n_embd (2048: 22 rows) nor 4 x n_embd.
    shapes = model_shapes("1b")
    result = simulate("1b", 96, batch=1, seq=64, steps=1)
    elements = rank0_elements(shapes, 96)
    assert result["padded_num_params"] == 96 * elements > result["num_params"] == sum(math.prod(s) for s in shapes)
    assert result["per_rank"]["params"] == result["per_rank"]["grads"] == 4 * elements
    assert result["per_rank"]["optimizer"] == 8 * elements + 4 * len(shapes)
    assert result["model_states_match_prediction"]


@pytest.mark.slow
def test_activations_grow_with_the_batch_and_not_with_the_ranks(tiny_at_8_ranks):
    one, four = (simulate("tiny", 4, batch=batch, seq=32, steps=1)["per_rank"]["activations"] for batch in (1, 4))
    two = tiny_at_8_ranks["per_rank"]["activations"]  # 8 ranks, batch 2
    # Linear in the batch (each sequence keeps the same tensors), and FSDP does not shard activations.
    assert four - one == 3 * (two - one) > 0
    assert 17 * C * 4 * 32 * 4 <= two - one <= 18 * C * 4 * 32 * 4


def test_refuses_a_sequence_longer_than_the_model():
    with pytest.raises(ValueError, match="block_size"):
        simulate("tiny", 2, seq=64)


@pytest.mark.slow
def test_cli_json_carries_simulated_and_analytic_figures(capsys, tiny_at_8_ranks):
    assert run_estimate_cli(["--simulate", "--size", "tiny", "--world-size", "8", "--batch", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    simulated = report["simulate"]
    assert simulated["world_size"] == 8
    assert simulated["seq"] == 32  # tiny's block_size, shorter than the default 128
    assert simulated["per_rank"] == tiny_at_8_ranks["per_rank"]  # the same run as simulate(...) gives
    assert (simulated["per_rank"]["params"], simulated["per_rank"]["optimizer"]) == (30_048, 60_308)
    assert report["params"] == simulated["num_params"] == TINY_ELEMENTS
    assert set(report["strategies"]) == {"ddp", "zero1", "zero2", "zero3"}


@pytest.mark.slow
def test_cli_table(capsys):
    assert run_estimate_cli(["--simulate", "--size", "tiny", "--world-size", "2"]) == 0
    out = capsys.readouterr().out
    assert "Simulated" in out
    assert "activations" in out
    assert "peak host RSS" in out


def test_cli_names_the_sizes_for_an_unknown_one():
    with pytest.raises(SystemExit, match="unknown model size 'huge'.*tiny"):
        run_estimate_cli(["--simulate", "--size", "huge", "--world-size", "2"])


@pytest.mark.slow
def test_global_peak_tracker_agrees_with_fsdp_mem_tracker(monkeypatch):
    # The simulation skips FSDPMemTracker's per-module peaks for speed; the global figures must not move.
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    from sharding_lab.engine import simulate as simulate_module

    fast = simulate("tiny", 4, batch=2, seq=32)
    monkeypatch.setattr(simulate_module, "_GlobalPeakMemTracker", FSDPMemTracker)
    stock = simulate("tiny", 4, batch=2, seq=32)
    assert fast["per_rank"] == stock["per_rank"]
    assert fast["peak_breakdown"] == stock["peak_breakdown"]
