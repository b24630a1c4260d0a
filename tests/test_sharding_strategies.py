"""Each strategy on 2 real ranks (CPU, gloo): its collectives per step, its model-state bytes against
the ZeRO paper's model, and the gradient it computes against one process on the same global batch."""

from __future__ import annotations

import pytest
from sharding_measurements import WORLD_SIZE, measurements

from sharding_lab import analytic
from sharding_lab.engine.parallelize import STRATEGIES, canonical_strategy, describe

pytestmark = pytest.mark.slow

N_BLOCKS = 4  # the tiny model's blocks: one FSDP unit each, plus the root


def count(m: dict, op: str, phase: str | None = None) -> int:
    return sum(1 for c in m["comm"]["collectives"] if c["op"] == op and (phase is None or c["phase"] == phase))


def ops_used(m: dict) -> set[str]:
    return {c["op"] for c in m["comm"]["collectives"]}


def test_unknown_strategy_names_the_valid_ones():
    with pytest.raises(ValueError, match="ddp, zero1, zero2, zero3, fsdp"):
        canonical_strategy("zero4")
    assert canonical_strategy("fsdp") == "zero3"


def test_descriptions_say_how_each_differs_from_the_paper():
    assert "broadcasts" in describe("zero1") and "all-reduces" in describe("zero1")
    assert "DeepSpeed" in describe("zero2")
    assert set(STRATEGIES) == {"ddp", "zero1", "zero2", "zero3"}


def test_ddp_all_reduces_the_gradients_once_in_backward():
    m = measurements()["ddp"]
    assert m["config"]["n_blocks"] == N_BLOCKS
    assert ops_used(m) == {"all_reduce"}
    assert count(m, "all_reduce", "backward") == 1  # the tiny model fits in one bucket
    assert m["comm"]["totals"]["all_reduce"]["bytes"] == 4 * m["config"]["num_params"]


def test_zero1_all_reduces_gradients_and_broadcasts_every_parameter_from_its_owner():
    m = measurements()["zero1"]
    n_tensors = 4 + 12 * N_BLOCKS + 1  # wte, wpe, ln_f (weight, bias), lm_head; 12 per block
    assert ops_used(m) == {"all_reduce", "broadcast"}
    assert count(m, "all_reduce", "backward") == 1
    assert count(m, "broadcast", "optimizer") == count(m, "broadcast") == n_tensors
    # Every parameter is broadcast once: the broadcasts add up to the whole model.
    assert m["comm"]["totals"]["broadcast"]["bytes"] == 4 * m["config"]["num_params"]


def test_zero2_gathers_each_unit_once_and_reduce_scatters_each_unit():
    m = measurements()["zero2"]
    assert ops_used(m) == {"all_gather", "reduce_scatter"}
    assert count(m, "all_gather", "forward") == N_BLOCKS + 1
    assert count(m, "all_gather", "backward") == 0  # parameters stay gathered from forward to backward
    assert count(m, "reduce_scatter", "backward") == N_BLOCKS + 1


def test_zero3_gathers_again_in_backward_for_every_block_but_not_the_root():
    m = measurements()["zero3"]
    assert ops_used(m) == {"all_gather", "reduce_scatter"}
    assert count(m, "all_gather", "forward") == N_BLOCKS + 1
    # FSDP never reshards the root after forward (backward needs it first), so only blocks regather.
    backward_gathers = [c["module"] for c in m["comm"]["collectives"] if c["op"] == "all_gather" and c["phase"] == "backward"]
    assert backward_gathers == [f"blocks.{i}" for i in reversed(range(N_BLOCKS))]
    assert count(m, "reduce_scatter", "backward") == N_BLOCKS + 1
    assert count(m, "all_gather", "optimizer") == count(m, "reduce_scatter", "optimizer") == 0


def test_turning_reshard_after_forward_off_makes_zero3_gather_like_zero2():
    off, zero2 = measurements()["zero3 reshard off"], measurements()["zero2"]
    assert off["config"]["reshard_after_forward"] is False and measurements()["zero3"]["config"]["reshard_after_forward"]
    assert count(off, "all_gather", "backward") == 0
    assert off["comm"]["totals"] == zero2["comm"]["totals"]


def test_zero3_moves_the_model_three_times_less_the_root_it_does_not_regather():
    m = measurements()["zero3"]
    psi_bytes = 4 * m["config"]["num_params"]
    forward_gather = sum(c["bytes"] for c in m["comm"]["collectives"] if c["op"] == "all_gather" and c["phase"] == "forward")
    root_bytes = next(c["bytes"] for c in m["comm"]["collectives"] if c["module"] == "root" and c["op"] == "all_gather")
    assert forward_gather == psi_bytes
    assert m["comm"]["totals"]["reduce_scatter"]["bytes"] == psi_bytes
    assert m["comm"]["bytes_per_step"] == 3 * psi_bytes - root_bytes


@pytest.mark.parametrize("strategy", ["ddp", "zero1", "zero2", "zero3", "zero3 padded"])
def test_gradient_matches_a_single_process_on_the_global_batch(strategy):
    parity = measurements()[strategy]["gradient_parity"]
    assert parity["global_batch_size"] == WORLD_SIZE * 2
    assert parity["max_relative_error"] <= 1e-5, parity
    assert parity["holds"]


def test_gradient_parity_catches_a_sum_instead_of_a_mean():
    # FSDP told to divide by 1: the reduced gradient is the sum over 2 ranks, twice the mean.
    parity = measurements()["zero3 summing"]["gradient_parity"]
    assert not parity["holds"]
    assert parity["max_relative_error"] == pytest.approx(WORLD_SIZE - 1, rel=1e-4)


def predicted(m: dict, strategy: str, *, padded: bool = False) -> dict:
    c = m["config"]
    return analytic.model_states_bytes_per_rank(
        c["num_params"], c["world_size"], strategy, padded_num_params=c["padded_num_params"] if padded else None
    )


def part(m: dict, name: str) -> list[int]:
    return [rank[f"{name}_bytes"] for rank in m["memory"]["per_rank"]]


def test_ddp_model_states_equal_the_unsharded_prediction_exactly():
    m = measurements()["ddp"]
    expected = predicted(m, "ddp")
    for name in ("params", "grads", "optimizer"):
        assert part(m, name) == [expected[name]] * WORLD_SIZE


def test_zero3_model_states_equal_stage_3_exactly():
    m = measurements()["zero3"]
    expected = predicted(m, "zero3", padded=True)
    for name in ("params", "grads", "optimizer"):
        assert part(m, name) == [expected[name]] * WORLD_SIZE
    assert m["predicted"]["model_states_bytes_per_rank"] == expected


def test_padding_accounts_for_the_difference_from_the_padded_prediction():
    m = measurements()["zero3 padded"]
    config = m["config"]
    assert config["padded_num_params"] == config["num_params"] + 2 * 32  # one row each for wte, lm_head
    expected = predicted(m, "zero3", padded=True)
    rank0, rank1 = m["memory"]["per_rank"]
    assert rank0["padding_elements"] == 0  # torch.chunk gives rank 0 a full ceil(dim0/N) shard
    assert rank0["model_states_bytes"] == expected["total"]
    assert rank1["padding_elements"] == 2 * 32  # one 32-wide row short in each of wte and lm_head
    assert rank1["model_states_bytes"] + rank1["padding_bytes"] == expected["total"]


def test_zero2_shards_gradients_and_optimizer_like_stage_2_and_parameters_between_steps_too():
    m = measurements()["zero2"]
    stage2 = predicted(m, "zero2", padded=True)
    stage3 = predicted(m, "zero3", padded=True)
    assert part(m, "grads") == [stage2["grads"]] * WORLD_SIZE
    assert part(m, "optimizer") == [stage2["optimizer"]] * WORLD_SIZE
    # Unlike DeepSpeed's ZeRO-2, FSDP2 keeps only a parameter shard between steps.
    assert part(m, "params") == [stage3["params"]] * WORLD_SIZE
    assert stage2["params"] == 4 * m["config"]["num_params"]


def test_zero1_shards_only_the_optimizer_whole_tensors_at_a_time():
    m = measurements()["zero1"]
    expected = predicted(m, "zero1")
    assert part(m, "params") == [expected["params"]] * WORLD_SIZE
    assert part(m, "grads") == [expected["grads"]] * WORLD_SIZE
    psi = m["config"]["num_params"]
    assert sum(part(m, "optimizer")) == 8 * psi  # every parameter's Adam state lives on exactly one rank
    largest_tensor = m["config"]["model"]["vocab_size"] * m["config"]["model"]["n_embd"]
    assert all(abs(b - 8 * psi / WORLD_SIZE) <= 8 * largest_tensor for b in part(m, "optimizer"))


def test_mixed_precision_gathers_bf16_and_reduces_fp32():
    m = measurements()["zero3 bf16"]
    gathers = [c for c in m["comm"]["collectives"] if c["op"] == "all_gather"]
    reductions = [c for c in m["comm"]["collectives"] if c["op"] == "reduce_scatter"]
    assert {c["dtype"] for c in gathers} == {"bfloat16"}
    assert {c["dtype"] for c in reductions} == {"float32"}
    assert sum(c["bytes"] for c in gathers if c["phase"] == "forward") == 2 * m["config"]["num_params"]
    # The sharded (master) parameters stay fp32.
    assert part(m, "params") == part(measurements()["zero3"], "params")


def plain_values(obj, path="m") -> list[str]:
    """Paths to anything that is not a plain JSON value (a torch object would need torch to unpickle)."""
    if isinstance(obj, dict):
        return [p for k, v in obj.items() for p in ([f"{path} key {k!r}"] if type(k) is not str else [])
                + plain_values(v, f"{path}.{k}")]
    if isinstance(obj, list):
        return [p for i, v in enumerate(obj) for p in plain_values(v, f"{path}[{i}]")]
    return [] if type(obj) in (str, int, float, bool, type(None)) else [f"{path}: {type(obj).__name__}"]


def test_measurements_are_plain_json_values():
    for key, m in measurements().items():
        assert plain_values(m) == [], key
