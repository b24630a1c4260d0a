"""The engine's training options on real CPU ranks (gloo): activation checkpointing, CPU offload, HSDP
and gradient accumulation. Each is checked for what it must change, what it must leave alone, and
the gradient it computes against one process on the same global batch."""

from __future__ import annotations

import functools

import pytest

from sharding_lab.measurement import Measurement
from sharding_lab.model_config import SIZES, num_params
from sharding_lab.run_config import RunConfig

pytestmark = pytest.mark.slow

PSI = num_params(SIZES["tiny"])  # 60,096 parameters
UNITS = SIZES["tiny"].n_layer + 1  # one FSDP unit per block, plus the root


def _run(strategy: str, world_size: int = 2, **options) -> RunConfig:
    return RunConfig.of(strategy, world_size=world_size, timed_steps=1, **options)


TWO_RANKS = {
    "zero3": _run("zero3", check_gradients=True),
    "zero3 checkpointed": _run("zero3", activation_checkpointing=True, check_gradients=True),
    "zero3 offload": _run("zero3", cpu_offload=True, check_gradients=True),
    "zero3 accum 2": _run("zero3", grad_accum_steps=2),
    "ddp": _run("ddp"),
    "ddp accum 2": _run("ddp", grad_accum_steps=2),
    "ddp checkpointed": _run("ddp", activation_checkpointing=True, check_gradients=True),
    "zero3 tied": _run("zero3", model_overrides={"tied": True}, check_gradients=True),
    "ddp tied": _run("ddp", model_overrides={"tied": True}, check_gradients=True),
}
FOUR_RANKS = {
    "hsdp 2x2": _run("zero3", world_size=4, replicas=2, check_gradients=True),
    "zero3 N=4": _run("zero3", world_size=4),
}


@functools.cache
def runs() -> dict[str, Measurement]:
    from sharding_lab.engine.measure import measure_many

    measured = {}
    for group in (TWO_RANKS, FOUR_RANKS):
        measured.update(zip(group, measure_many(list(group.values())), strict=True))
    return measured


def count(m: Measurement, op: str, phase: str | None = None) -> int:
    return sum(1 for c in m.comm.collectives if c.op == op and (phase is None or c.phase == phase))


def forward_starts(m: Measurement, module: str) -> int:
    return sum(1 for e in m.comm.timeline if e.kind == "start" and e.phase == "forward" and e.module == module)


def test_checkpointing_keeps_only_each_blocks_input_and_runs_each_block_forward_twice():
    base, checkpointed = runs()["zero3"], runs()["zero3 checkpointed"]
    assert checkpointed.config.activation_checkpointing and not base.config.activation_checkpointing
    assert checkpointed.gradient_parity.holds, checkpointed.gradient_parity
    # Saved for backward when forward returns: a checkpointed block keeps only its input, one
    # (batch, seq, width) fp32 tensor: 2 x 32 x 32 x 4 bytes.
    block_input = 2 * 32 * 32 * 4
    saved_base = base.ranks[0].activations_after_forward_bytes
    saved_checkpointed = checkpointed.ranks[0].activations_after_forward_bytes
    assert 0 < saved_checkpointed < saved_base
    assert saved_base - saved_checkpointed > SIZES["tiny"].n_layer * block_input  # each block saved far more
    # The price is compute: every block's forward runs again in backward (the root's does not).
    assert forward_starts(base, "blocks.0") == 1
    assert all(forward_starts(checkpointed, f"blocks.{i}") == 2 for i in range(SIZES["tiny"].n_layer))
    # Communication is unchanged: the recompute uses the all-gather backward issues anyway.
    assert count(checkpointed, "all_gather") == count(base, "all_gather") == 2 * UNITS - 1
    assert checkpointed.ranks[0].model_states_bytes == base.ranks[0].model_states_bytes


def test_checkpointing_under_ddp_computes_the_same_gradient():
    m = runs()["ddp checkpointed"]
    assert m.gradient_parity.holds, m.gradient_parity
    assert m.ranks[0].activations_after_forward_bytes < runs()["ddp"].ranks[0].activations_after_forward_bytes


def test_cpu_offload_keeps_the_same_model_states_and_collectives_on_cpu_ranks():
    base, offloaded = runs()["zero3"], runs()["zero3 offload"]
    assert offloaded.config.cpu_offload
    assert offloaded.gradient_parity.holds, offloaded.gradient_parity
    # On CPU ranks the device is the host: the same bytes, in the same place.
    assert offloaded.ranks[0].model_states_bytes == base.ranks[0].model_states_bytes == 16 * PSI // 2
    assert [(c.op, c.bytes) for c in offloaded.comm.collectives] == [(c.op, c.bytes) for c in base.comm.collectives]


def test_fsdp_gradient_accumulation_reduce_scatters_once_and_keeps_unsharded_gradients():
    base, accumulated = runs()["zero3"], runs()["zero3 accum 2"]
    assert accumulated.config.grad_accum_steps == 2
    assert count(accumulated, "reduce_scatter") == count(base, "reduce_scatter") == UNITS
    assert count(accumulated, "all_gather") == 2 * count(base, "all_gather")  # each micro-batch gathers
    # Between micro-batches every unit keeps its whole gradient: 4 bytes x Psi at once, where a
    # synchronizing step frees each unit's unsharded gradient once it is reduce-scattered.
    assert accumulated.ranks[0].category_peaks["grads"] >= 4 * PSI > base.ranks[0].category_peaks["grads"]
    # After the step the gradients are sharded again: the same model states.
    assert accumulated.ranks[0].model_states_bytes == base.ranks[0].model_states_bytes


def test_ddp_gradient_accumulation_all_reduces_once_per_optimizer_step():
    assert count(runs()["ddp accum 2"], "all_reduce") == count(runs()["ddp"], "all_reduce") == 1
    assert runs()["ddp accum 2"].comm.bytes_per_step == runs()["ddp"].comm.bytes_per_step == 4 * PSI


def test_hsdp_shards_within_a_group_and_all_reduces_across_replicas():
    hsdp, full = runs()["hsdp 2x2"], runs()["zero3 N=4"]
    assert hsdp.config.replicas == 2 and hsdp.gradient_parity.holds, hsdp.gradient_parity
    # Model states shard over a group of 2: what full sharding holds at N=2, twice N=4's.
    assert hsdp.ranks[0].model_states_bytes == runs()["zero3"].ranks[0].model_states_bytes == 16 * PSI // 2
    assert full.ranks[0].model_states_bytes < hsdp.ranks[0].model_states_bytes
    placed = {(c.op, c.mesh_dim, c.group_size) for c in hsdp.comm.collectives}
    assert placed == {("all_gather", "shard", 2), ("reduce_scatter", "shard", 2), ("all_reduce", "replicate", 2)}
    # Each unit's reduce-scatter is followed by an all-reduce of the shard it produced: half its bytes.
    assert count(hsdp, "all_reduce") == count(hsdp, "reduce_scatter") == UNITS
    scattered = sum(c.bytes for c in hsdp.comm.collectives if c.op == "reduce_scatter")
    assert sum(c.bytes for c in hsdp.comm.collectives if c.op == "all_reduce") == scattered // 2
    assert {c.mesh_dim for c in full.comm.collectives} == {"dp"}


def test_a_tied_head_is_one_parameter_sharded_once_with_the_summed_gradient():
    head = SIZES["tiny"].vocab_size * SIZES["tiny"].n_embd  # 128 x 32: the weight a tie saves
    for name in ("zero3 tied", "ddp tied"):
        m = runs()[name]
        assert m.gradient_parity.holds, (name, m.gradient_parity)  # the embedding's and the head's, summed
        assert m.num_params == PSI - head
    assert runs()["zero3 tied"].ranks[0].model_states_bytes == 16 * (PSI - head) // 2
    assert runs()["ddp tied"].ranks[0].model_states_bytes == 16 * (PSI - head)
    # The root's all-gather carries one vocab x width weight instead of two; every block's is the same.
    gathers = [(c.module, c.bytes) for c in runs()["zero3 tied"].comm.collectives if c.op == "all_gather"]
    untied = [(c.module, c.bytes) for c in runs()["zero3"].comm.collectives if c.op == "all_gather"]
    assert gathers[0][1] == untied[0][1] - 4 * head
    assert gathers[1:] == untied[1:]
    assert runs()["ddp tied"].comm.bytes_per_step == 4 * (PSI - head)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"strategy": "ddp", "cpu_offload": True}, "cpu_offload is an FSDP option"),
        ({"strategy": "zero1", "replicas": 2}, "replicas is an FSDP option"),
        ({"strategy": "zero3", "replicas": 3, "world_size": 4}, "replicas=3 must divide the world size 4"),
        ({"strategy": "zero3", "replicas": -1}, "replicas must be at least 1, got -1"),  # -1 divides 2: not the why
        ({"strategy": "zero3", "replicas": 0}, "replicas must be at least 1, got 0"),
        ({"strategy": "zero3", "grad_accum_steps": 0}, "grad_accum_steps must be at least 1"),
        ({"strategy": "zero3", "grad_accum_steps": 2, "check_gradients": True}, "use grad_accum_steps=1"),
        ({"strategy": "zero3", "warmup_steps": -1}, "warmup_steps must be at least 0, got -1"),
        ({"strategy": "zero3", "warmup_steps": 0, "check_gradients": True}, "check_gradients needs at least one"),
    ],
)
def test_impossible_option_combinations_are_refused_by_name(options, message):
    with pytest.raises(ValueError, match=message):
        RunConfig.of(**options)
