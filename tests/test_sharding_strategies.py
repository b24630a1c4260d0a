"""Each strategy on 2 real ranks (CPU, gloo): its collectives per step, its model-state bytes against
the ZeRO paper's model, and the gradient it computes against one process on the same global batch."""

from __future__ import annotations

import math

import pytest
from sharding_measurements import WORLD_SIZE, measurements, typed

from sharding_lab.measurement import Measurement
from sharding_lab.strategies import STRATEGIES, Strategy

pytestmark = pytest.mark.slow

N_BLOCKS = 4  # the tiny model's blocks: one FSDP unit each, plus the root


def count(m: dict, op: str, phase: str | None = None) -> int:
    return sum(1 for c in m["comm"]["collectives"] if c["op"] == op and (phase is None or c["phase"] == phase))


def ops_used(m: dict) -> set[str]:
    return {c["op"] for c in m["comm"]["collectives"]}


def test_unknown_strategy_names_the_valid_ones():
    with pytest.raises(ValueError, match="ddp, zero1, zero2, zero3, fsdp"):
        Strategy.parse("zero4")
    assert Strategy.parse("fsdp") is Strategy.ZERO3


def test_descriptions_say_how_each_differs_from_the_paper():
    assert "broadcasts" in Strategy.ZERO1.description and "all-reduces" in Strategy.ZERO1.description
    assert "DeepSpeed" in Strategy.ZERO2.description
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


# Expected model-state bytes, worked out here from the tiny model's parameter shapes rather than by
# sharding_lab.analytic: fp32 Adam is 4 + 4 + 8 bytes per element; a sharded parameter's rank holds
# ceil(dim0 / N) rows of it (FSDP2 pads dim 0 up to a multiple of N).
BYTES_PER_ELEMENT = {"params": 4, "grads": 4, "optimizer": 8}


def tiny_shapes(vocab: int = 128, width: int = 32, blocks: int = N_BLOCKS, context: int = 32) -> list[tuple[int, ...]]:
    """GPT's parameter shapes (nanoGPT layout, biases, untied head), written out by hand."""
    per_block = [(width,), (width,), (3 * width, width), (3 * width,), (width, width), (width,),
                 (width,), (width,), (4 * width, width), (4 * width,), (width, 4 * width), (width,)]
    return [(vocab, width), (context, width), *per_block * blocks, (width,), (width,), (vocab, width)]


def elements(shapes, world_size: int = 1, *, sharded: bool = False) -> int:
    if not sharded:
        return sum(math.prod(shape) for shape in shapes)
    return sum(-(-shape[0] // world_size) * math.prod(shape[1:]) for shape in shapes)


def expected(shapes, sharded_parts: set[str]) -> dict[str, int]:
    result = {
        name: size * elements(shapes, WORLD_SIZE, sharded=name in sharded_parts)
        for name, size in BYTES_PER_ELEMENT.items()
    }
    result["total"] = sum(result.values())
    return result


def part(m: dict, name: str) -> list[int]:
    return [rank[f"{name}_bytes"] for rank in m["memory"]["per_rank"]]


def test_the_hand_written_shapes_are_the_tiny_model():
    assert measurements()["ddp"]["config"]["num_params"] == elements(tiny_shapes()) == 60_096


def test_ddp_model_states_equal_the_unsharded_prediction_exactly():
    m = measurements()["ddp"]
    full = expected(tiny_shapes(), set())
    assert full["total"] == 16 * 60_096
    for name in ("params", "grads", "optimizer"):
        assert part(m, name) == [full[name]] * WORLD_SIZE


def test_zero3_model_states_equal_stage_3_exactly():
    m = measurements()["zero3"]
    stage3 = expected(tiny_shapes(), {"params", "grads", "optimizer"})
    assert stage3["total"] == 16 * 60_096 // 2  # every dim 0 of tiny splits evenly in two
    for name in ("params", "grads", "optimizer"):
        assert part(m, name) == [stage3[name]] * WORLD_SIZE
    assert m["predicted"]["model_states_bytes_per_rank"] == stage3


def test_padding_accounts_for_the_difference_from_the_padded_prediction():
    m = measurements()["zero3 padded"]
    config = m["config"]
    assert config["padded_num_params"] == config["num_params"] + 2 * 32  # one row each for wte, lm_head
    padded = expected(tiny_shapes(vocab=129), {"params", "grads", "optimizer"})
    assert padded["total"] == 16 * (60_096 + 2 * 32 + 2 * 32) // 2  # 129 rows -> 65 per rank, twice
    rank0, rank1 = m["memory"]["per_rank"]
    assert rank0["padding_elements"] == 0  # torch.chunk gives rank 0 a full ceil(dim0/N) shard
    assert rank0["model_states_bytes"] == padded["total"]
    assert rank1["padding_elements"] == 2 * 32  # one 32-wide row short in each of wte and lm_head
    assert rank1["model_states_bytes"] + rank1["padding_bytes"] == padded["total"]


def test_zero2_shards_gradients_and_optimizer_like_stage_2_and_parameters_between_steps_too():
    m = measurements()["zero2"]
    stage2 = expected(tiny_shapes(), {"grads", "optimizer"})
    stage3 = expected(tiny_shapes(), {"params", "grads", "optimizer"})
    assert part(m, "grads") == [stage2["grads"]] * WORLD_SIZE
    assert part(m, "optimizer") == [stage2["optimizer"]] * WORLD_SIZE
    # Unlike DeepSpeed's ZeRO-2, FSDP2 keeps only a parameter shard between steps.
    assert part(m, "params") == [stage3["params"]] * WORLD_SIZE
    assert stage2["params"] == 4 * m["config"]["num_params"]


def test_zero1_shards_only_the_optimizer_whole_tensors_at_a_time():
    m = measurements()["zero1"]
    full = expected(tiny_shapes(), set())
    assert part(m, "params") == [full["params"]] * WORLD_SIZE
    assert part(m, "grads") == [full["grads"]] * WORLD_SIZE
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
    # Predicted in the dtypes moved: bf16 gathers in forward and backward (2Ψ + 2Ψ B), an fp32
    # reduce-scatter (4Ψ B); fp32 throughout would be 12Ψ.
    psi = m["config"]["num_params"]
    assert m["predicted"]["communication_bytes_per_step"]["bytes"] == 8 * psi == 480_768


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


def test_a_measurement_reads_back_from_its_json_unchanged():
    for key, m in typed().items():
        assert Measurement.from_json(m.to_json()) == m, key


# The JSON contract: the keys the web app, the exports, the README and these tests read. Written out
# here, so a change to the measurement types that drops or renames one fails.
CONTRACT = {
    "": {"config", "memory", "comm", "predicted", "step_time_s", "loss"},
    "config": {"strategy", "world_size", "size", "backend", "device", "torch_version", "prefetch",
               "mixed_precision", "reshard_after_forward", "num_params", "padded_num_params", "n_blocks",
               "model", "seq_len", "batch_size_per_rank", "warmup_steps", "timed_steps", "seed", "placement",
               "placement_note", "cuda_version", "gpu_name", "activation_checkpointing", "cpu_offload", "replicas",
               "grad_accum_steps"},
    "memory.per_rank[]": {"rank", "params_bytes", "grads_bytes", "optimizer_bytes", "model_states_bytes",
                          "optimizer_scalar_bytes", "padding_elements", "padding_bytes", "peak_bytes",
                          "persistent_bytes", "categories", "category_peaks", "unsharded_params_peak_bytes",
                          "unsharded_params_after_forward_bytes", "cuda_max_memory_allocated",
                          "activations_after_forward_bytes", "gathered_with_buffers_peak_bytes",
                          "gathered_with_buffers_later_blocks_peak_bytes", "states_device"},
    "comm": {"collectives", "totals", "bytes_per_step", "wire_bytes_per_step_derived", "timeline"},
    "comm.collectives[]": {"seq", "op", "phase", "module", "prefetch", "bytes", "wire_bytes_derived", "dtype",
                           "group_size", "mesh_dim"},
    "comm.totals.*": {"count", "bytes", "wire_bytes_derived"},
    "predicted": {"model_states_bytes_per_rank", "communication_bytes_per_step", "accounting", "differences"},
    "gradient_parity": {"max_relative_error", "worst_parameter", "tolerance", "holds", "global_batch_size",
                        "reference_loss"},
}


def test_the_json_keeps_the_keys_its_readers_use():
    m = measurements()["zero3"]
    assert set(m) - {"gradient_parity"} == CONTRACT[""]
    assert set(m["config"]) == CONTRACT["config"]
    assert all(set(rank) == CONTRACT["memory.per_rank[]"] for rank in m["memory"]["per_rank"])
    assert set(m["comm"]) == CONTRACT["comm"]
    assert all(set(c) == CONTRACT["comm.collectives[]"] for c in m["comm"]["collectives"])
    assert set(m["comm"]["totals"]) == {"all_gather", "reduce_scatter", "all_reduce", "broadcast"}
    assert all(set(t) == CONTRACT["comm.totals.*"] for t in m["comm"]["totals"].values())
    assert set(m["predicted"]) == CONTRACT["predicted"]
    assert set(m["gradient_parity"]) == CONTRACT["gradient_parity"]
    events = m["comm"]["timeline"]
    assert {e["event"] for e in events} >= {"collective", "forward_start", "forward_end", "backward_start", "backward_end"}
    assert all(set(e) == {"event", *CONTRACT["comm.collectives[]"]} for e in events if e["event"] == "collective")
    assert all(set(e) == {"event", "module", "phase"} for e in events if e["event"] != "collective")
