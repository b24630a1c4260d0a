"""The simulation (FSDP2 on fake tensors and a fake process group) against bytes worked out by hand,
against measure's real CPU ranks for every engine option, and through `estimate --simulate`."""

from __future__ import annotations

import argparse
import json
import math
import re

import pytest
from sharding_measurements import WIDE_TIED

from sharding_lab import estimate
from sharding_lab.engine.model import GPT, config_for
from sharding_lab.engine.simulate import simulate
from sharding_lab.engine.validation import Case, compare
from sharding_lab.run_config import Placement, RunConfig

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


def tiny(world_size: int, batch: int, seq: int, **options) -> RunConfig:
    return RunConfig.of("zero3", world_size=world_size, size="tiny", batch_size=batch, seq_len=seq, **options)


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
def tiny_at_8_ranks():
    return simulate(tiny(8, batch=2, seq=32))


@pytest.mark.slow
def test_model_states_at_8_ranks_are_an_eighth_of_each(tiny_at_8_ranks):
    # Every dim0 of tiny (128, 32, 96) divides by 8: rank 0 holds 60,096 / 8 = 7,512 elements.
    result = tiny_at_8_ranks
    assert (result.num_params, result.padded_num_params) == (TINY_ELEMENTS, TINY_ELEMENTS)
    states = result.model_states
    assert states["params"] == 4 * 7_512 == 30_048
    assert states["grads"] == 30_048
    assert states["optimizer"] == 8 * 7_512 + STEP_COUNTERS == 60_308
    assert states["total"] == 120_404
    assert result.model_states_match_prediction


@pytest.mark.slow
def test_activations_and_peak(tiny_at_8_ranks):
    result = tiny_at_8_ranks
    after_forward, peak = result.after_forward, result.peak_breakdown
    # After forward the root unit stays gathered (FSDP2 keeps the root's parameters whole for
    # backward); every block is resharded. At the peak one block is gathered beside the root.
    assert after_forward["unsharded_params"] == 4 * ROOT_ELEMENTS == 37_120
    assert peak["unsharded_params"] == 4 * (ROOT_ELEMENTS + BLOCK_ELEMENTS) == 87_936
    # The batch is made inside the step, as measure makes it, so it counts as an activation: idx and
    # targets, int64 (2, 32) each. Each block's forward keeps about 17 residual widths a token for
    # backward (the inputs of both layer norms, of the four Linears and of GELU, q, k, v and
    # attention's output): 17 to 18 x 32 floats x 4 bytes x 32 tokens x 4 blocks, for each of the 2 sequences.
    batch_bytes = 2 * (2 * 32 * 8)
    assert 2 * 17 * C * 4 * 32 * 4 <= result.activations_after_forward - batch_bytes <= 2 * 18 * C * 4 * 32 * 4
    # The peak is one moment's total in the tracked step: Adam's state exists, gradients are not yet made.
    assert peak["total"] == result.peak_bytes == sum(v for k, v in peak.items() if k != "total")
    states = result.model_states
    assert (peak["params"], peak["optimizer"], peak["grads"]) == (states["params"], states["optimizer"], 0)
    assert peak["total"] >= after_forward["total"] == sum(v for k, v in after_forward.items() if k != "total")
    # Each category's own maximum is at least its share of the peak moment.
    assert all(result.category_peaks[k] >= v for k, v in peak.items())
    assert result.category_peaks["total"] == result.peak_bytes
    assert 0 < result.wall_s < 120


@pytest.mark.slow
def test_uneven_world_size_pads_like_fsdp2():
    # 3 divides none of tiny's dim0s (128, 96, 32): rank 0 holds ceil(dim0 / 3) rows of each,
    # 43 of 128, 32 of 96 and 11 of 32: root 3,126 elements, each block 4,301, 20,330 in all.
    result = simulate(tiny(3, batch=1, seq=16))
    assert rank0_elements(ROOT_SHAPES + 4 * BLOCK_SHAPES, 3) == 3_126 + 4 * 4_301 == 20_330
    assert (result.num_params, result.padded_num_params) == (TINY_ELEMENTS, 3 * 20_330)
    assert result.model_states["params"] == result.model_states["grads"] == 4 * 20_330
    assert result.model_states["optimizer"] == 8 * 20_330 + STEP_COUNTERS
    assert result.after_forward["unsharded_params"] == 4 * 3 * 3_126  # the root gathered: padded chunks
    assert result.model_states_match_prediction


@pytest.mark.slow
def test_a_1b_model_at_96_ranks_matches_with_padding():
    # 96 divides the vocabulary (50304) and 3 x n_embd, not block_size or n_embd (2048: 22 rows) nor 4 x n_embd.
    shapes = model_shapes("1b")
    result = simulate(RunConfig.of("zero3", world_size=96, size="1b", batch_size=1, seq_len=64))
    elements = rank0_elements(shapes, 96)
    assert result.padded_num_params == 96 * elements > result.num_params == sum(math.prod(s) for s in shapes)
    assert result.model_states["params"] == result.model_states["grads"] == 4 * elements
    assert result.model_states["optimizer"] == 8 * elements + 4 * len(shapes)
    assert result.model_states_match_prediction
    assert result.extrapolated  # 20 blocks: from 3 and 4


@pytest.mark.slow
def test_activations_grow_with_the_batch_and_not_with_the_ranks(tiny_at_8_ranks):
    one, two, four = (simulate(tiny(4, batch=batch, seq=32)).activations_after_forward for batch in (1, 2, 4))
    # FSDP does not shard activations: 4 ranks save what 8 save.
    assert two == tiny_at_8_ranks.activations_after_forward
    # Linear in the batch (each sequence keeps the same tensors), but for the tracker rounding each
    # storage up to a multiple of 512 B: the small ones (SDPA's logsumexp, LayerNorm statistics) do
    # not double when the batch does.
    assert abs((four - one) - 3 * (two - one)) <= 512 * 4  # 496 B: less than one rounding a block
    assert 17 * C * 4 * 32 * 4 <= two - one <= 18 * C * 4 * 32 * 4


def test_refuses_a_sequence_longer_than_the_model():
    with pytest.raises(ValueError, match="block_size"):
        simulate(tiny(2, batch=1, seq=64))


def test_refuses_what_it_does_not_simulate():
    with pytest.raises(ValueError, match="FSDP2"):
        simulate(RunConfig.of("ddp", world_size=2))
    with pytest.raises(ValueError, match="warmup_steps"):  # the tracked step would create Adam's state
        simulate(tiny(2, batch=1, seq=16, warmup_steps=0))


@pytest.mark.slow
def test_cli_json_carries_simulated_and_analytic_figures(capsys, tiny_at_8_ranks):
    assert run_estimate_cli(["--simulate", "--size", "tiny", "--world-size", "8", "--batch", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    simulated = report["simulate"]
    assert simulated["config"]["world_size"] == 8
    assert simulated["config"]["seq_len"] == 32  # tiny's block_size, shorter than the default 128
    expected = tiny_at_8_ranks.to_json()  # the same run as simulate(...) gives
    for key in ("model_states", "peak_bytes", "peak_breakdown", "after_forward", "method"):
        assert simulated[key] == expected[key]
    assert (simulated["model_states"]["params"], simulated["model_states"]["optimizer"]) == (30_048, 60_308)
    assert report["params"] == simulated["num_params"] == TINY_ELEMENTS
    assert set(report["strategies"]) == {"ddp", "zero1", "zero2", "zero3"}


@pytest.mark.slow
def test_cli_table(capsys):
    assert run_estimate_cli(["--simulate", "--size", "tiny", "--world-size", "2"]) == 0
    out = capsys.readouterr().out
    assert "Simulated" in out
    assert "activations" in out
    assert "peak host RSS" in out


def test_cli_names_the_sizes_for_an_unknown_one(capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_estimate_cli(["--simulate", "--size", "huge", "--world-size", "2"])
    assert exit_info.value.code == 2
    assert re.search("unknown model size 'huge'.*tiny", capsys.readouterr().err)


@pytest.mark.slow
def test_the_simulations_own_peak_is_fsdp_mem_trackers(monkeypatch):
    # The simulation keeps the peak itself (the tracker only hands it each op's bytes); FSDPMemTracker's
    # own bookkeeping, run beside it in the same step, must find the same moment.
    from sharding_lab.engine import _torch_internals as internals
    from sharding_lab.engine import simulate as simulate_module

    stock = internals.fsdp_mem_tracker_class()
    trackers = []

    class Both(simulate_module._ObservingTracker):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            trackers.append(self)

        def _update_peak_stats(self, peak_state):
            super()._update_peak_stats(peak_state)
            stock._update_peak_stats(self, peak_state)

    monkeypatch.setattr(simulate_module, "_ObservingTracker", Both)
    result = simulate(tiny(4, batch=2, seq=32))
    (tracker,) = trackers
    assert simulate_module._vector(tracker.get_tracker_snapshot("peak")) == tuple(result.peak_breakdown.values())


# --- held against measure: real CPU ranks (gloo), every engine option ---------------------------------------

MEASURED_CASES = {
    "zero3": Case("tiny", 2, 32, 2, False),
    "zero3, 6 blocks (extrapolated)": Case("tiny", 2, 32, 2, False, (("model_overrides", (("n_layer", 6),)),)),
    "zero2": Case("tiny", 2, 32, 2, False, (("strategy", "zero2"),)),
    "mixed precision": Case("tiny", 2, 32, 2, True),
    "activation checkpointing": Case("tiny", 2, 32, 2, False, (("activation_checkpointing", True),)),
    "cpu offload": Case("tiny", 2, 32, 2, False, (("cpu_offload", True),)),
    # A wide vocabulary, so the end of backward holds the peak: the tied weight's two gradients summed.
    "tied head": Case("tiny", 2, 8, 1, False, (("model_overrides", WIDE_TIED),)),
    "tied head, accumulation 2": Case("tiny", 2, 8, 1, False, (("model_overrides", WIDE_TIED), ("grad_accum_steps", 2))),
    "grad accum 2": Case("tiny", 2, 32, 2, False, (("grad_accum_steps", 2),)),
    "hsdp 2x2": Case("tiny", 4, 32, 2, False, (("replicas", 2),)),
    "hsdp 2x2, 6 blocks, checkpointing, accum 2": Case(
        "tiny", 4, 32, 2, False,
        (("replicas", 2), ("activation_checkpointing", True), ("grad_accum_steps", 2),
         ("model_overrides", (("n_layer", 6),))),
    ),
}
PEAK_TOLERANCE = 0.05


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MEASURED_CASES))
def test_the_simulation_holds_against_measure_on_real_cpu_ranks(name):
    result = compare(MEASURED_CASES[name], "cpu", timeout_s=300, placement=Placement.RANKS)
    # Model states to the byte (the simulation counts Adam's step counters with the optimizer state).
    assert result.simulated_model_states == result.measured_model_states + result.measured_step_counters
    assert result.tracked_error <= PEAK_TOLERANCE, result.to_json()
