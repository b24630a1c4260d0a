"""The collective tracker: ring formulas, what it records for each c10d op, and the ordered timeline
of a real FSDP step (all-gathers before each block, prefetching, reduce-scatters in backward)."""

from __future__ import annotations

import warnings
from contextlib import nullcontext

import pytest
import torch
import torch.distributed as dist
from sharding_measurements import measurements

from sharding_lab.engine import _torch_internals as internals
from sharding_lab.engine.comm import CommTracker
from sharding_lab.engine.model import GPT, config_for
from sharding_lab.engine.overlap import overlap_of
from sharding_lab.measurement import CommSummary, OpTotal

# The all-gather function FSDP2 calls in this torch (renamed in 2.13: see the test of every name).
ALL_GATHER_LEAF = "all_gather_single" if hasattr(dist, "all_gather_single") else "all_gather_into_tensor"


def test_overlap_is_the_part_of_communication_time_inside_compute_time():
    comm = [(0.0, 10.0), (20.0, 30.0)]
    compute = [(5.0, 15.0), (12.0, 25.0)]  # overlapping kernels: their union is 5..25
    result = overlap_of(comm, compute)
    assert result["comm_kernel_us"] == 20.0 and result["compute_kernel_us"] == 20.0
    assert result["overlapped_us"] == 10.0  # 5..10 and 20..25
    assert result["overlapped_fraction_of_comm"] == 0.5 and result["overlapped"]
    assert not overlap_of([(0.0, 1.0)], [(2.0, 3.0)])["overlapped"]


@pytest.fixture(scope="module")
def one_rank_group(tmp_path_factory):
    """A one-rank gloo group in this process: collectives still reach the dispatcher."""
    store = tmp_path_factory.mktemp("group") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.slow
def test_records_each_collective_with_its_phase_and_logical_bytes(one_rank_group):
    model = GPT(config_for("tiny"))
    tracker = CommTracker(model, world_size=1)
    x = torch.ones(10)
    with tracker:
        with tracker.phase("forward"):
            dist.all_reduce(x)
        with tracker.phase("backward"):
            out = torch.empty(10)
            dist.all_gather_into_tensor(out, x)
            dist.reduce_scatter_tensor(torch.empty(10), out)
        with tracker.phase("optimizer"):
            dist.broadcast(model.wpe.weight.data, src=0)
    dist.all_reduce(x)  # outside the tracker: not recorded
    tracker.remove_hooks()
    recorded = [(c["op"], c["phase"], c["bytes"]) for c in tracker.collectives]
    assert recorded == [
        ("all_reduce", "forward", 40),
        ("all_gather", "backward", 40),
        ("reduce_scatter", "backward", 40),
        ("broadcast", "optimizer", 4 * 32 * 32),
    ]
    # A broadcast parameter is attributed to the unit that owns it.
    assert tracker.collectives[-1]["module"] == "root"
    assert CommSummary.from_json(tracker.summary()).totals()["all_reduce"] == OpTotal(1, 40, 0)


@pytest.mark.slow
def test_every_name_of_a_gather_or_scatter_this_torch_has_is_recorded_once(one_rank_group):
    # torch 2.13 calls the leaves all_gather_single / reduce_scatter_single and keeps the older names
    # as aliases of them; torch 2.11 (our GPU machine's) has only the older names, which FSDP2 calls.
    gathers = [n for n in ("all_gather_single", "all_gather_into_tensor", "_all_gather_base") if hasattr(dist, n)]
    scatters = [n for n in ("reduce_scatter_single", "reduce_scatter_tensor", "_reduce_scatter_base") if hasattr(dist, n)]
    assert "all_gather_into_tensor" in gathers and "reduce_scatter_tensor" in scatters
    tracker = CommTracker(GPT(config_for("tiny")), world_size=1)
    shard, full = torch.ones(6), torch.empty(6)
    with tracker, tracker.phase("forward"), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # the deprecated names say so
        for name in gathers:
            getattr(dist, name)(full, shard)
        for name in scatters:
            getattr(dist, name)(torch.empty(6), full)
    tracker.remove_hooks()
    assert [(c["op"], c["bytes"]) for c in tracker.collectives] == (
        [("all_gather", 24)] * len(gathers) + [("reduce_scatter", 24)] * len(scatters)
    )


@pytest.mark.slow
def test_module_events_nest_in_forward_and_backward(one_rank_group):
    model = GPT(config_for("tiny"))
    tracker = CommTracker(model, world_size=1)
    idx = torch.zeros(1, 8, dtype=torch.long)
    with tracker:
        with tracker.phase("forward"):
            loss = model(idx, idx)
        with tracker.phase("backward"):
            loss.backward()
    events = [(e["event"], e["module"]) for e in tracker.timeline]
    blocks = [f"blocks.{i}" for i in range(4)]
    forward = [("forward_start", "root")]
    for b in blocks:
        forward += [("forward_start", b), ("forward_end", b)]
    forward.append(("forward_end", "root"))
    backward = [("backward_start", "root")]
    for b in reversed(blocks):
        backward += [("backward_start", b), ("backward_end", b)]
    backward.append(("backward_end", "root"))
    assert events == forward + backward


def timeline(m: dict) -> list[tuple[str, str, str]]:
    """(kind, module, pass) per event: kind is the op for collectives, else e.g. 'forward_start'."""
    return [
        (e["op"], e["module"], e["phase"]) if e["event"] == "collective" else (e["event"], e["module"], e["phase"])
        for e in m["comm"]["timeline"]
    ]


def position(events, kind, module, phase=None) -> int:
    return next(i for i, e in enumerate(events) if e[0] == kind and e[1] == module and (phase is None or e[2] == phase))


@pytest.mark.slow
def test_without_prefetch_each_block_is_gathered_right_before_its_forward():
    events = timeline(measurements()["zero3 no prefetch"])
    for i in range(4):
        start = position(events, "forward_start", f"blocks.{i}")
        assert events[start - 1] == ("all_gather", f"blocks.{i}", "forward")
        if i > 0:  # and only after the previous block finished
            assert events[start - 2] == ("forward_end", f"blocks.{i - 1}", "forward")


@pytest.mark.slow
def test_with_prefetch_the_next_blocks_gather_is_issued_before_the_current_block_ends():
    m = measurements()["zero3"]
    events = timeline(m)
    for i in range(3):
        next_gather = position(events, "all_gather", f"blocks.{i + 1}", "forward")
        assert next_gather < position(events, "forward_end", f"blocks.{i}")
    prefetched = [c["module"] for c in m["comm"]["collectives"] if c["prefetch"] and c["phase"] == "forward"]
    assert prefetched == ["blocks.0", "blocks.1", "blocks.2", "blocks.3"]


@pytest.mark.slow
def test_each_blocks_reduce_scatter_happens_inside_its_backward():
    for key in ("zero2", "zero3", "zero3 no prefetch"):
        events = timeline(measurements()[key])
        for i in range(4):
            rs = position(events, "reduce_scatter", f"blocks.{i}")
            assert position(events, "backward_start", f"blocks.{i}") < rs < position(events, "backward_end", f"blocks.{i}")


@pytest.mark.slow
def test_ddp_all_reduce_fires_in_backward_and_zero1_broadcasts_in_the_optimizer_step():
    ddp = timeline(measurements()["ddp"])
    all_reduce = position(ddp, "all_reduce", "root")
    assert position(ddp, "backward_start", "root") < all_reduce < position(ddp, "backward_end", "root")
    zero1 = measurements()["zero1"]["comm"]["collectives"]
    assert {c["phase"] for c in zero1 if c["op"] == "broadcast"} == {"optimizer"}


@pytest.mark.slow
def test_wire_bytes_are_derived_per_collective_and_summed_per_op():
    # At N = 2 a ring all-gather, reduce-scatter or broadcast sends half the buffer per rank, and an
    # all-reduce (a reduce-scatter plus an all-gather) the whole buffer.
    per_byte_at_two_ranks = {"all_gather": 0.5, "reduce_scatter": 0.5, "broadcast": 0.5, "all_reduce": 1.0}
    for m in measurements().values():
        assert m["config"]["world_size"] == 2
        for c in m["comm"]["collectives"]:
            assert c["wire_bytes_derived"] == c["bytes"] * per_byte_at_two_ranks[c["op"]]
        for op, total in m["comm"]["totals"].items():
            assert total["wire_bytes_derived"] == sum(
                c["wire_bytes_derived"] for c in m["comm"]["collectives"] if c["op"] == op
            )


@pytest.mark.slow
def test_wrappers_are_put_back_and_a_ddp_model_gets_the_default_all_reduce_hook(one_rank_group):
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel

    gather = ALL_GATHER_LEAF
    originals = (getattr(dist, gather), getattr(dist.distributed_c10d, gather), dist.broadcast)
    model = DistributedDataParallel(GPT(config_for("tiny")))
    tracker = CommTracker(model, world_size=1)
    assert tracker.method == "wrap" and internals.ddp_comm_hooks(model) == [allreduce_hook]
    with tracker:
        assert getattr(dist, gather) is not originals[0]
    assert (getattr(dist, gather), getattr(dist.distributed_c10d, gather), dist.broadcast) == originals
    CommTracker(model, world_size=1).remove_hooks()  # a second tracker reuses the hook
    tracker.remove_hooks()


def _both_methods_on_rank(ctx, runs: dict) -> dict[str, dict[str, dict]]:
    torch.set_num_threads(1)
    results = {}
    for key, run in runs.items():
        results[key] = _record_both_ways(ctx, run)
        dist.barrier()
    return results


def _record_both_ways(ctx, run) -> dict[str, dict]:
    """A steady step recorded by the dispatch reference, then the next by the wrappers, as `measure`
    records it (under the memory tracker, phase by phase)."""
    from sharding_lab.engine.measure import _build, training_batch
    from sharding_lab.engine.memory import MemoryTracker

    model_config, mesh, model, optimizer = _build(ctx, run)

    def step(number: int, tracker: CommTracker | None = None) -> None:
        idx, targets = training_batch(model_config, run, ctx.rank, number, ctx.device)
        optimizer.zero_grad(set_to_none=True)
        with tracker.phase("forward") if tracker else nullcontext():
            loss = model(idx, targets)
        with tracker.phase("backward") if tracker else nullcontext():
            loss.backward()
        with tracker.phase("optimizer") if tracker else nullcontext():
            optimizer.step()

    for number in range(run.steps_before_tracked):
        step(number)
    recorded = {}
    for number, method in enumerate(("dispatch", "wrap"), start=run.steps_before_tracked):
        with MemoryTracker(model, optimizer, ctx.device):
            tracker = CommTracker(model, ctx.world_size, method=method, mesh=mesh)
            with tracker:
                step(number, tracker)
            tracker.remove_hooks()
        assert tracker.method == method
        recorded[method] = tracker.summary()
    return recorded


@pytest.mark.slow
def test_the_wrappers_record_exactly_what_the_dispatch_reference_records():
    from sharding_measurements import RUNS, WORLD_SIZE

    from sharding_lab.engine.launch import run_ranks

    runs = {key: run.replace(check_gradients=False) for key, run in RUNS.items()}
    for rank_results in run_ranks(_both_methods_on_rank, WORLD_SIZE, runs, timeout_s=300):
        for key, by_method in rank_results.items():
            assert by_method["wrap"]["collectives"], key
            assert by_method["wrap"] == by_method["dispatch"], key


def _gathers_still_held_after_the_call(ctx, calls: int) -> dict[str, int]:
    """How many of `calls` blocking all-gathers still hold their tensors once the call has returned (the
    caller's last references dropped, a weak reference still alive): untracked, then under the tracker."""
    import weakref

    model = GPT(config_for("tiny"))

    def held() -> int:
        count = 0
        for _ in range(calls):
            shard, full = torch.ones(1024), torch.empty(1024 * ctx.world_size)
            dist.all_gather_into_tensor(full, shard)
            refs = [weakref.ref(shard), weakref.ref(full)]
            del shard, full
            count += any(ref() is not None for ref in refs)
        return count

    untracked = held()
    tracker = CommTracker(model, ctx.world_size, wait_for_gloo=True)  # as `measure` tracks a step
    with tracker:
        tracked = held()
    tracker.remove_hooks()
    return {"untracked": untracked, "tracked": tracked}


@pytest.mark.slow
def test_a_blocking_gloo_collective_under_the_tracker_has_let_go_of_its_tensors_when_it_returns():
    # gloo's worker thread wakes the caller before it lets go of the collective's tensors, so a buffer the
    # caller drops is freed a moment later, and on a loaded machine the memory tracker saw it alive beside
    # the next one (a CI run's zero3 figures differed between two steady steps). Under the tracker `measure`
    # runs every one is gone when the call returns. (Untracked, 81 and 80 of 300 were still held on an idle 2-core machine.)
    from sharding_lab.engine.launch import run_ranks

    for rank in run_ranks(_gathers_still_held_after_the_call, 2, 300, timeout_s=300):
        assert rank["tracked"] == 0, rank
