"""Per-rank memory: exact bytes of the local tensors, and the trackers' categories over a real step."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from sharding_measurements import WORLD_SIZE, measurements

from sharding_lab.engine.memory import model_state_bytes
from sharding_lab.engine.model import GPT, config_for
from sharding_lab.measurement import CATEGORIES
from sharding_lab.run_config import RunConfig


def test_model_state_bytes_reads_params_grads_and_adam_state_exactly():
    model = GPT(config_for("tiny", n_layer=1))
    optimizer = torch.optim.Adam(model.parameters(), foreach=False)
    idx = torch.zeros(1, 4, dtype=torch.long)
    model(idx, idx).backward()
    optimizer.step()
    psi = model.num_params()
    n_tensors = len(list(model.parameters()))
    states = model_state_bytes(model, optimizer, world_size=1)
    assert states["params_bytes"] == states["grads_bytes"] == 4 * psi
    assert states["optimizer_bytes"] == 8 * psi  # exp_avg and exp_avg_sq
    assert states["optimizer_scalar_bytes"] == 4 * n_tensors  # one fp32 `step` per parameter tensor
    assert states["model_states_bytes"] == 16 * psi
    assert states["padding_elements"] == states["padding_bytes"] == 0
    assert states["states_device"] == "cpu"


slow = pytest.mark.slow


@slow
def test_persistent_memory_is_the_model_states_and_nothing_else():
    for key, m in measurements().items():
        for rank in m["memory"]["per_rank"]:
            # FSDP allocates a short shard's parameter and gradient at the padded size; Adam's state
            # (zeros_like of the unpadded local tensor) has no padding.
            allocated_padding = rank["padding_elements"] * (4 + 4)
            expected = rank["model_states_bytes"] + rank["optimizer_scalar_bytes"] + allocated_padding
            assert rank["persistent_bytes"] == expected, key


@slow
def test_peak_categories_add_up_to_the_peak():
    for key, m in measurements().items():
        for rank in m["memory"]["per_rank"]:
            assert set(rank["categories"]) == set(CATEGORIES)
            assert sum(rank["categories"].values()) == rank["peak_bytes"], key
            assert rank["peak_bytes"] > rank["persistent_bytes"]  # activations exist at the peak
            assert rank["categories"]["activations"] > 0
            assert rank["cuda_max_memory_allocated"] is None  # CPU run


@slow
def test_fsdp_buffers_appear_only_under_fsdp():
    ms = measurements()
    for key in ("ddp", "zero1"):
        peaks = ms[key]["memory"]["per_rank"][0]["category_peaks"]
        assert peaks["all_gather_buffers"] == peaks["reduce_scatter_buffers"] == 0
    for key in ("zero2", "zero3"):
        peaks = ms[key]["memory"]["per_rank"][0]["category_peaks"]
        assert peaks["all_gather_buffers"] > 0 and peaks["reduce_scatter_buffers"] > 0


def unit_bytes(m: dict) -> tuple[int, int]:
    """(root's full fp32 parameter bytes, one block's), read off the forward all-gathers."""
    gathers = {c["module"]: c["bytes"] for c in m["comm"]["collectives"] if c["op"] == "all_gather" and c["phase"] == "forward"}
    return gathers["root"], gathers["blocks.0"]


@slow
def test_reshard_after_forward_keeps_at_most_the_root_and_a_block_or_two_gathered():
    ms = measurements()
    root, block = unit_bytes(ms["zero3"])
    for key in ("zero3", "zero3 no prefetch"):
        for rank in ms[key]["memory"]["per_rank"]:
            assert rank["unsharded_params_after_forward_bytes"] == root  # the root is never resharded
            assert root + block <= rank["unsharded_params_peak_bytes"] <= root + 2 * block


@slow
def test_prefetching_holds_exactly_one_more_block_in_gathered_params_and_all_gather_buffers():
    ms = measurements()
    root, block = unit_bytes(ms["zero3"])
    for on, off in zip(ms["zero3"]["memory"]["per_rank"], ms["zero3 no prefetch"]["memory"]["per_rank"], strict=True):
        # Without prefetching the most is at a block's copy-out: the root, the block's all-gather buffer and
        # the parameters copied out of it, the previous block already resharded.
        assert off["gathered_with_buffers_peak_bytes"] == root + 2 * block
        # With it, the next block's buffer is also in flight.
        assert on["gathered_with_buffers_peak_bytes"] == root + 3 * block
        # tiny's root is lighter than a block: the blocks after the first hold the step's most.
        assert off["gathered_with_buffers_later_blocks_peak_bytes"] == root + 2 * block
        assert on["gathered_with_buffers_later_blocks_peak_bytes"] == root + 3 * block


@slow
def test_a_root_heavier_than_the_blocks_holds_the_steps_most_and_the_blocks_window_leaves_it_out():
    ms = measurements()
    root, block = unit_bytes(ms["zero3 heavy root"])
    assert root > 9 * block  # vocab 2,048 x width 32, twice, and the positions: about ten blocks
    for on, off in zip(ms["zero3 heavy root"]["memory"]["per_rank"],
                       ms["zero3 heavy root no prefetch"]["memory"]["per_rank"], strict=True):
        # The step's most is where the first block's all-gather is waited on: the root's parameters, the
        # all-gather buffer they were copied out of, and the first block's buffer; prefetching or not.
        assert on["gathered_with_buffers_peak_bytes"] == off["gathered_with_buffers_peak_bytes"] == 2 * root + block
        # While later blocks run, the root's buffer is gone and prefetching's one more block shows.
        assert off["gathered_with_buffers_later_blocks_peak_bytes"] == root + 2 * block
        assert on["gathered_with_buffers_later_blocks_peak_bytes"] == root + 3 * block


@slow
def test_without_reshard_after_forward_every_block_stays_gathered_until_backward():
    m = measurements()["zero2"]
    full = 4 * m["config"]["num_params"]
    for rank in m["memory"]["per_rank"]:
        assert rank["unsharded_params_after_forward_bytes"] == full
        assert rank["unsharded_params_peak_bytes"] == full
        assert rank["params_bytes"] == full // WORLD_SIZE  # and only the shard between steps


@slow
def test_ddp_parameters_are_always_whole():
    m = measurements()["ddp"]
    for rank in m["memory"]["per_rank"]:
        assert rank["unsharded_params_after_forward_bytes"] == rank["params_bytes"] == 4 * m["config"]["num_params"]
        assert rank["gathered_with_buffers_peak_bytes"] == rank["params_bytes"]  # no all-gather buffers


@slow
def test_at_four_ranks_fsdp_holds_a_quarter_of_what_ddp_holds():
    from sharding_lab.engine.measure import measure_many

    # vocab 130 rows split 33, 33, 33, 31: the last rank's shard is short, and FSDP pads it.
    runs = [RunConfig.of(s, world_size=4, model_overrides={"vocab_size": 130}, timed_steps=1) for s in ("zero3", "ddp")]
    zero3, ddp = (m.to_json() for m in measure_many(runs, timeout_s=300))
    psi, padded = zero3["config"]["num_params"], zero3["config"]["padded_num_params"]
    assert padded == psi + 2 * 2 * 32  # wte and lm_head: 130 rows padded to 132
    stage3 = 16 * padded // 4  # fp32 Adam's 16 bytes per element, a quarter of the padded model each
    assert [r["model_states_bytes"] + r["padding_bytes"] for r in zero3["memory"]["per_rank"]] == [stage3] * 4
    assert [r["padding_elements"] for r in zero3["memory"]["per_rank"]] == [0, 0, 0, 2 * 2 * 32]
    assert [r["model_states_bytes"] for r in ddp["memory"]["per_rank"]] == [16 * psi] * 4


def _steady(rank, *, peak_moment: bool):
    """A rank's figures but its temporaries: when gloo's worker thread completes a collective moves them
    from run to run even for one configuration alone (zero2's most temporaries at once: 111,872, 124,928
    or 162,688 B). Where two moments of a step come within a few percent, that also moves the step's peak
    from one to the other, with its breakdown (zero3 bf16: 745,240 or 770,584 B; zero3 without
    prefetch: 1,062,876 or 1,105,372 B, in repeated runs of one configuration): `peak_moment=False`
    leaves the peak and its breakdown out, and keeps each category's own maximum."""

    def drop(categories):
        return {k: v for k, v in categories.items() if k != "temporaries"}

    categories = drop(rank.categories) if peak_moment else {}
    return replace(rank, peak_bytes=0, categories=categories, category_peaks=drop(rank.category_peaks))


def _same_figures(a, b, *, peak_moment: bool = True) -> bool:
    """Every figure of every rank (model states, persistent, gathered bytes, after forward, each
    category's maximum; the peak within 0.5% and its categories unless `peak_moment` is False), and
    every collective with its bytes."""
    same_peaks = not peak_moment or all(
        x.peak_bytes == pytest.approx(y.peak_bytes, rel=0.005) for x, y in zip(a.ranks, b.ranks, strict=True)
    )
    return (
        [_steady(r, peak_moment=peak_moment) for r in a.ranks] == [_steady(r, peak_moment=peak_moment) for r in b.ranks]
        and same_peaks
        and a.comm.to_json() == b.comm.to_json()
    )


@slow
def test_configurations_in_one_launch_measure_what_each_measures_alone():
    from sharding_lab.engine.measure import measure_many

    zero2 = RunConfig.of("zero2", world_size=2, timed_steps=1)
    others = [RunConfig.of(s, world_size=2, timed_steps=1) for s in ("zero3", "ddp")]
    together = measure_many([*others, zero2], timeout_s=300)[-1]
    alone = measure_many([zero2], timeout_s=300)[0]
    assert _same_figures(together, alone)


@slow
def test_an_fsdp_step_is_steady_after_one_warm_up_step_and_a_ddp_step_after_two():
    """Why FSDP's configurations warm up one step and DDP's two (`RunConfig.steps_before_tracked`):
    FSDP's lazy init and Adam's state come with the first step; DDP rebuilds its buckets in its second
    forward, so its first tracked step would differ."""
    from sharding_lab.engine.measure import measure_many

    fsdp = [
        RunConfig.of("zero3", world_size=2, timed_steps=0, **options)
        for options in ({}, {"prefetch": False}, {"activation_checkpointing": True}, {"cpu_offload": True},
                        {"grad_accum_steps": 2}, {"mixed_precision": True})
    ] + [RunConfig.of("zero2", world_size=2, timed_steps=0)]
    ddp = [RunConfig.of(s, world_size=2, timed_steps=0) for s in ("ddp", "zero1")]
    assert {c.steps_before_tracked for c in fsdp} == {1} and {c.steps_before_tracked for c in ddp} == {2}
    runs = [replace(c, warmup_steps=n) for c in fsdp + ddp for n in (1, 2, 3)]
    measured = measure_many(runs, timeout_s=600)
    by_steps = [measured[i : i + 3] for i in range(0, len(measured), 3)]
    for config, (one, two, three) in zip(fsdp, by_steps[: len(fsdp)], strict=True):
        assert _same_figures(one, two, peak_moment=False), config.label
        assert _same_figures(two, three, peak_moment=False), config.label
    for config, (one, two, three) in zip(ddp, by_steps[len(fsdp):], strict=True):
        assert not _same_figures(one, two, peak_moment=False), config.label  # the bucket rebuild, tracked
        assert _same_figures(two, three, peak_moment=False), config.label


def test_a_tracked_step_leaves_nothing_that_keeps_the_model_alive(tmp_path):
    """The trackers' ModTracker leaves multi-grad hooks whose cycles go through C++ (invisible to gc):
    without their removal the model, its optimizer and, on CUDA, their memory outlived the step."""
    import gc
    import weakref

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from sharding_lab.engine.comm import CommTracker
    from sharding_lab.engine.memory import MemoryTracker
    from sharding_lab.engine.parallelize import parallelize

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        refs = []
        for strategy in ("zero3", "ddp"):
            model, make_optimizer = parallelize(GPT(config_for("tiny")), strategy, mesh)
            optimizer = make_optimizer()
            idx = torch.zeros(2, 8, dtype=torch.long)
            with MemoryTracker(model, optimizer, torch.device("cpu")):
                tracker = CommTracker(model, world_size=1)
                with tracker:
                    model(idx, idx).backward()
                    optimizer.step()
                tracker.remove_hooks()
            refs += [weakref.ref(model), weakref.ref(optimizer)]
            del model, make_optimizer, optimizer, tracker
        gc.collect()
        assert [ref() for ref in refs] == [None] * len(refs)
    finally:
        dist.destroy_process_group()


def test_a_configuration_that_outlives_itself_fails_loudly():
    import weakref

    from sharding_lab.engine.launch import RankContext
    from sharding_lab.engine.measure import CudaBaseline, _check_released

    kept = GPT(config_for("tiny", n_layer=1))
    ctx = RankContext(0, 1, 0, "gloo", torch.device("cpu"), None)
    with pytest.raises(RuntimeError, match="GPT still alive after the configuration ended"):
        _check_released(ctx, RunConfig.of("ddp"), CudaBaseline(), [weakref.ref(kept)])


@pytest.mark.parametrize("created_in", [torch.float32, torch.bfloat16])
def test_fsdp2_mixed_precision_keeps_shards_and_adam_state_in_the_dtype_the_model_was_created_in(tmp_path, created_in):
    """What the bank says of MixedPrecisionPolicy (zero-adam-state, beyond-fsdp2-mixed-precision): it sets
    the compute and reduction dtypes only; the shards, the master weights, stay as created, and Adam's
    moments follow them. So 4/4/8 bytes per parameter holds for a model created in fp32, not one in bf16."""
    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)).to(created_in)
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for layer in model:
            fully_shard(layer, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
        optimizer = torch.optim.Adam(model.parameters())
        model(torch.ones(4, 8, dtype=created_in)).sum().backward()
        optimizer.step()
        for parameter in model.parameters():
            assert parameter.to_local().dtype == created_in and parameter.grad.to_local().dtype == created_in
            state = optimizer.state[parameter]
            assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == created_in
    finally:
        dist.destroy_process_group()
