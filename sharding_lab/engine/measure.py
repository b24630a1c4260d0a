"""Measure a strategy from the run itself: memory by category, every collective, step time.

`measure(config)` starts the ranks, trains a few steps and returns one `Measurement`
(sharding_lab.measurement documents every field; `to_json()` is the `sharding-lab measure --json`
output). `measure_many(configs)` measures several configurations in one launch, one after another in
the same process group: starting processes and importing torch is the slow part on a small machine.

Each configuration, on every rank:
1. build the GPT (on the meta device for FSDP, which shards before materializing), parallelize it;
2. warm-up steps (`RunConfig.steps_before_tracked`: one for FSDP, two for DDP): FSDP's lazy init,
   Adam's state and DDP's bucket rebuild all happen here, so the measured step is a steady one. With
   `check_gradients`, the first warm-up step also compares the full gradient with a single-process
   reference on the same global batch;
3. one measured step under the memory and communication trackers, phase by phase;
4. plain timed steps for `step_time_s` (the trackers slow a step down; `timed_steps=0` times none, and
   `step_time_s` is then None); on CUDA over NCCL one more runs under the profiler to see whether
   communication kernels overlapped compute kernels.

Configurations in one launch are independent: before each, every rank collects garbage (FSDP2's
modules sit in reference cycles), empties the CUDA cache and resets its peak statistics; after each,
it checks that the configuration's model and optimizer are gone and CUDA's allocated bytes are back
at their baseline, and fails loudly if not.

Ranks return plain JSON values (they cross a process boundary); the parent types them.
"""

from __future__ import annotations

import gc
import os
import statistics
import sys
import time
import warnings
import weakref
from collections.abc import Callable, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sharding_lab import analytic, host_memory, torch_versions
from sharding_lab.engine.launch import RankContext, cuda_device_count, run_ranks, under_torchrun
from sharding_lab.measurement import Measurement
from sharding_lab.run_config import Placement, PlacementChoice, RunConfig, resolve_placement

if TYPE_CHECKING:
    from sharding_lab.engine.pool import Pools


def measure(config: RunConfig, *, timeout_s: float = 600.0) -> Measurement:
    """One configuration's measurement."""
    return measure_many([config], timeout_s=timeout_s)[0]


def measure_many(
    configs: Sequence[RunConfig],
    *,
    timeout_s: float = 600.0,
    on_progress: Callable[[str], None] | None = None,
    every_rank: bool = False,
    pools: Pools | None = None,
) -> list[Measurement]:
    """Measure each configuration in one launch; they must share a world size, device and placement.

    `every_rank`: the caller needs every rank's figures, so with fewer GPUs than ranks the ranks share
    one GPU instead of measuring rank 0's view (see run_config.resolve_placement). `pools`: run on its
    warm ranks for this world size (started if none are up) instead of starting ranks for this call.
    """
    if not configs:
        return []
    if (warning := torch_versions.check(torch_versions.installed())) is not None:  # before any rank starts
        print(f"sharding-lab: {warning}", file=sys.stderr)
    first = configs[0]
    for config in configs:
        if (config.world_size, config.device, config.placement) != (first.world_size, first.device, first.placement):
            raise ValueError(
                f"one launch runs one world size on one device and placement: {config.label} asks for "
                f"{config.world_size} ranks on {config.device} ({config.placement}), the first for "
                f"{first.world_size} on {first.device} ({first.placement})"
            )
    choice = _placement(first, every_rank)
    for config in configs:
        if config.options.mixed_precision and config.strategy.uses_ddp and first.device != "cuda" and not under_torchrun():
            raise ValueError(f"{config.strategy} with mixed precision needs CUDA (DDP's mixed precision uses CUDA events)")
        if config.check_gradients and choice.placement is Placement.RANK_VIEW:
            raise ValueError("gradient parity needs real ranks: in a rank view collectives move no data")
    if not under_torchrun():  # CPU ranks share this host's memory; under torchrun they may span hosts
        processes = 1 if choice.placement is Placement.RANK_VIEW else first.world_size
        host_memory.check_fits(configs, host_memory.available_bytes(), processes)
    if on_progress:
        on_progress(choice.note or f"starting {first.world_size} ranks for {len(configs)} configuration(s)")
    launcher = run_ranks if pools is None or under_torchrun() else pools.run
    per_rank = launcher(
        _measure_on_rank, first.world_size, list(configs), device=first.device, placement=choice.placement,
        timeout_s=timeout_s, on_progress=on_progress,
    )
    return [
        _combine(config, choice, [rank_results[i] for rank_results in per_rank]) for i, config in enumerate(configs)
    ]


def _placement(config: RunConfig, every_rank: bool) -> PlacementChoice:
    if under_torchrun():
        return PlacementChoice(Placement.RANKS, "")
    gpus = cuda_device_count() if config.device == "cuda" else 0
    return resolve_placement(config.placement, config.device, config.world_size, gpus, every_rank=every_rank)


# --- the parent's side: one Measurement per configuration ---------------------------------------------


def _combine(config: RunConfig, choice: PlacementChoice, ranks: list[dict]) -> Measurement:
    first = ranks[0]
    measured_config = {
        "strategy": str(config.strategy),
        "world_size": config.world_size,
        "placement": str(choice.placement),
        "placement_note": choice.note,
        "size": config.size,
        **first["config"],
        "prefetch": config.options.prefetch,
        "mixed_precision": config.options.mixed_precision,
        "reshard_after_forward": config.reshard_after_forward,
        "activation_checkpointing": config.options.activation_checkpointing,
        "cpu_offload": config.options.cpu_offload,
        "replicas": config.options.replicas,
        "grad_accum_steps": config.grad_accum_steps,
        "batch_size_per_rank": config.batch_size,
        "warmup_steps": config.steps_before_tracked,
        "timed_steps": config.timed_steps,
        "seed": config.seed,
    }
    return Measurement.from_json(
        {
            "config": measured_config,
            "memory": {"per_rank": [r["memory"] for r in ranks]},
            "comm": first["comm"],
            "predicted": _predicted(config, measured_config["num_params"], measured_config["padded_num_params"]),
            # The slowest rank sets the pace of a synchronous step (None: no step was timed).
            "step_time_s": None if config.timed_steps == 0 else max(r["step_time_s"] for r in ranks),
            "loss": first["loss"],
            "gradient_parity": first["gradient_parity"],
            "overlap": first["overlap"],
        }
    )


def _predicted(config: RunConfig, num_params: int, padded_num_params: int) -> dict:
    """The analytic model's figures for this run, in the dtypes this run moves."""
    strategy = config.strategy
    padded = padded_num_params if strategy.fully_sharded else None
    # Mixed precision here is PyTorch's: bf16 all-gathers of parameters, fp32 reductions of gradients
    # (FSDP2's MixedPrecisionPolicy and DDP's mixed precision alike); the paper's moves fp16 throughout.
    wire = analytic.PYTORCH_MIXED_PRECISION_WIRE if config.options.mixed_precision else analytic.FP32_WIRE
    if config.options.mixed_precision and strategy.uses_ddp:
        wire = analytic.FP32_WIRE  # DDP reduces fp32 gradients; ZeRO-1 broadcasts fp32 parameters
    communication_note = "bf16 all-gathers, fp32 reductions" if wire["gather"] == 2 else "fp32 on the wire"
    # The sharded (master) parameters, gradients and Adam state stay fp32 under PyTorch's mixed
    # precision (bf16 copies exist only while gathered), so model states use fp32 Adam's 4 + 4 + 8.
    # Model states shard over one shard group: the world, or world_size / replicas under HSDP.
    states = analytic.model_states_bytes_per_rank(num_params, config.shards, strategy, padded_num_params=padded)
    communication = analytic.communication_bytes_per_step(
        num_params, config.shards, strategy,
        gather_bytes_per_element=wire["gather"], reduce_bytes_per_element=wire["reduce"],
    )
    accounting = (
        "model states: fp32 Adam (4+4+8 bytes per parameter), FSDP padding included for zero2/zero3; "
        f"communication: the paper's collectives, {communication_note}"
    )
    if config.options.replicas > 1:
        accounting += (
            f"; HSDP: those collectives within a shard group of {config.shards}, plus an all-reduce of each "
            f"rank's gradient shard across {config.options.replicas} replicas (not in these figures)"
        )
    if config.grad_accum_steps > 1:
        accounting += f"; per optimizer step of {config.grad_accum_steps} micro-batches (gradients sync once)"
        if strategy.fully_sharded:  # FSDP2 reshards after each micro-batch's backward and gathers again
            accounting += (f", but with one forward and backward's all-gathers: FSDP2 all-gathers for each of "
                           f"the {config.grad_accum_steps} micro-batches")
    differences = strategy.known_differences
    if strategy.fully_sharded and config.reshard_after_forward != strategy.default_reshard_after_forward:
        # The strategy's text describes its own reshard-after-forward; an override changes what backward gathers.
        differences = RESHARD_OVERRIDDEN[config.reshard_after_forward]
    return {
        "model_states_bytes_per_rank": states,
        "communication_bytes_per_step": communication,
        "accounting": accounting,
        "differences": differences,
    }


# Where PyTorch differs from the paper when --[no-]reshard-after-forward overrides the strategy's choice
# (the blocks'; FSDP2's root is never resharded after forward), by the blocks' reshard-after-forward.
RESHARD_OVERRIDDEN: dict[bool, str] = {
    False: (
        "reshard_after_forward is off here: every unit stays gathered from its forward to its backward, so "
        "backward all-gathers nothing: the step moves 2Ψ (plus FSDP's padding), not the paper's stage-3 3Ψ. "
        "Parameters are still sharded between steps."
    ),
    True: (
        "reshard_after_forward is on here: FSDP2 keeps only a parameter shard between steps (stage 3's params "
        "bytes), frees the blocks' parameters after their forward and all-gathers them again in backward (not "
        "the root's): more than the paper's stage-2 2Ψ, by the blocks' parameters."
    ),
}


def _measure_on_rank(ctx: RankContext, configs: list[RunConfig]) -> list[dict]:
    import torch

    if ctx.device.type == "cpu":
        torch.set_num_threads(1)  # ranks share the machine's cores; oversubscription only adds noise
    results = []
    for index, config in enumerate(configs):
        baseline = _start_clean(ctx)
        alive: list[weakref.ref] = []
        results.append(_measure_one(ctx, config, index, len(configs), alive))
        _check_released(ctx, config, baseline, alive)
        torch.distributed.barrier()
    return results


TRACE_LEAKS_ENV = "SHARDING_LAB_TRACE_CUDA_LEAKS"  # set: a leak names where its blocks were allocated


@dataclass(frozen=True)
class CudaBaseline:
    """What a configuration starts from: the CUDA bytes allocated (0 on CPU) and, when tracing, the blocks."""

    allocated: int = 0
    blocks: frozenset[tuple[int, int]] = frozenset()


def _start_clean(ctx: RankContext) -> CudaBaseline:
    """Free what earlier configurations left (FSDP2's modules sit in reference cycles) and reset the CUDA
    peak, so this configuration's figures are its own; what is still allocated."""
    import torch

    from sharding_lab.engine import _torch_internals as internals

    gc.collect()
    if ctx.device.type != "cuda":
        return CudaBaseline()
    torch.cuda.synchronize(ctx.device)
    internals.clear_cublas_workspaces()  # each configuration's first matmul allocates them anew
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(ctx.device)
    blocks: frozenset[tuple[int, int]] = frozenset()
    if os.environ.get(TRACE_LEAKS_ENV):
        internals.record_cuda_allocation_stacks()
        blocks = frozenset(internals.cuda_live_blocks())
    return CudaBaseline(torch.cuda.memory_allocated(ctx.device), blocks)


RELEASE_GRACE_S = 5.0  # how long a finished configuration's CUDA memory may take to come back


def _check_released(ctx: RankContext, config: RunConfig, baseline: CudaBaseline, alive: list[weakref.ref]) -> None:
    """Fail loudly if the configuration outlived itself: its model or optimizer still referenced, or
    CUDA bytes allocated beyond the baseline it started from."""
    import torch

    from sharding_lab.engine import _torch_internals as internals

    gc.collect()
    survivors = [type(obj).__name__ for ref in alive if (obj := ref()) is not None]
    if survivors:
        raise RuntimeError(f"{config.label}: {', '.join(survivors)} still alive after the configuration ended")
    if ctx.device.type != "cuda":
        return
    # A gloo collective's work can be released on gloo's own thread a moment after the call returns, with
    # the CUDA tensors it moved (shared-GPU ranks): wait a little for those, never for a real leak.
    deadline = time.monotonic() + RELEASE_GRACE_S
    while True:
        torch.cuda.synchronize(ctx.device)
        internals.clear_cublas_workspaces()  # torch's own, kept from the first matmul on: not a leak
        # A tensor a collective recorded on its stream (gloo's CUDA path) is freed only when the allocator
        # next processes its events, and counts as allocated until then: empty_cache processes them. (That
        # is not what keeps DDP's gradient buckets on CUDA: they stayed after it on the H200; see README.)
        torch.cuda.empty_cache()
        left = torch.cuda.memory_allocated(ctx.device) - baseline.allocated
        if left <= 0:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{config.label}: {left:,} CUDA bytes still allocated after the configuration ended"
                               + _leaked_blocks(baseline))
        time.sleep(0.05)
        gc.collect()


def _leaked_blocks(baseline: CudaBaseline, shown: int = 4, depth: int = 8) -> str:
    """The largest blocks allocated since the baseline, each with where it was allocated; or how to see them."""
    from sharding_lab.engine import _torch_internals as internals

    if not os.environ.get(TRACE_LEAKS_ENV):
        return f" (set {TRACE_LEAKS_ENV}=1 to name where its blocks were allocated)"
    new = sorted(((size, frames) for (address, size), frames in internals.cuda_live_blocks().items()
                  if (address, size) not in baseline.blocks), key=lambda block: -block[0])
    # One line: a rank's failure is summed up by its error's first line.
    sites = [f"{size:,} B at " + (" <- ".join(frames[:depth]) or "(no stack recorded)") for size, frames in new[:shown]]
    return f"; {len(new)} block(s) allocated since it started, the largest: " + "; ".join(sites)


def _build(ctx: RankContext, config: RunConfig):
    import torch

    from sharding_lab.engine.model import GPT, config_for
    from sharding_lab.engine.parallelize import data_parallel_mesh, parallelize

    model_config = config_for(config.size, **dict(config.model_overrides))
    torch.manual_seed(config.seed)
    mesh = ctx.mesh
    if config.options.replicas > 1:
        mesh = data_parallel_mesh(ctx.device.type, ctx.world_size, config.options.replicas)
    if config.strategy.fully_sharded:
        # torchtitan's order: shard on meta, then give each rank storage for its shard only (in host
        # memory when offloaded: FSDP2 copies it to the device for each all-gather).
        with torch.device("meta"):
            model = GPT(model_config)
        model, make_optimizer = parallelize(model, config.strategy, mesh, config.options)
        model.to_empty(device="cpu" if config.options.cpu_offload else ctx.device)
        with torch.no_grad(), warnings.catch_warnings():
            # On a CPU mesh DTensor fills each local shard from this rank's own generator (it warns
            # so): the values differ from an unsharded init, but they are GPT-2's distribution.
            warnings.filterwarnings("ignore", message="DTensor random operators")
            model.init_weights()
    else:
        with torch.device(ctx.device):
            model = GPT(model_config)
        with torch.no_grad():
            model.init_weights()
        model, make_optimizer = parallelize(model, config.strategy, ctx.mesh, config.options)
        if ctx.backend == "fake":
            # The fake process group's works carry no result, which DDP's built-in all-reduce needs.
            from sharding_lab.engine.comm import synchronous_allreduce_hook

            model.register_comm_hook(ctx.mesh.get_group(), synchronous_allreduce_hook)
    return model_config, mesh, model, make_optimizer()


def training_batch(model_config, config: RunConfig, rank: int, step: int, device, micro: int = 0):
    """Rank `rank`'s batch for `step` (micro-batch `micro` of it), the same whichever process makes it
    (the reference needs all)."""
    import torch

    seq_len = config.seq_len or model_config.block_size
    generator = torch.Generator().manual_seed(config.seed * 1_000_003 + step * 1_009 + rank + micro * 7_919)
    tokens = torch.randint(0, model_config.vocab_size, (config.batch_size, seq_len + 1), generator=generator)
    # Two tensors of their own, as on a GPU (where `.to` copies): at batch 1 `.contiguous()` would
    # leave both as views of `tokens`, and CPU memory would differ from a GPU's by the batch size.
    return tokens[:, :-1].clone().to(device), tokens[:, 1:].clone().to(device)


def _measure_one(ctx: RankContext, config: RunConfig, index: int, count: int, alive: list[weakref.ref]) -> dict:
    import torch

    from sharding_lab.engine.comm import CommTracker
    from sharding_lab.engine.memory import MemoryTracker, model_state_bytes, padded_numel
    from sharding_lab.engine.parity import MIXED_PRECISION_TOLERANCE, TOLERANCE, gradient_parity

    label = f"{config.strategy} ({index + 1}/{count})"
    ctx.mark(f"{label}: build")
    model_config, mesh, model, optimizer = _build(ctx, config)
    inner = getattr(model, "module", model)
    alive += [weakref.ref(model), weakref.ref(optimizer)]
    micro_batches = config.grad_accum_steps

    def train_step(step: int, tracker: CommTracker | None = None, memory: MemoryTracker | None = None) -> float:
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for micro in range(micro_batches):
            last = micro == micro_batches - 1
            idx, targets = training_batch(model_config, config, ctx.rank, step, ctx.device, micro)
            tag = f" micro-batch {micro + 1}/{micro_batches}" if micro_batches > 1 else ""
            # Gradients sync on the last micro-batch only: before it, FSDP keeps unsharded gradients
            # and skips its reduce-scatter, DDP skips its all-reduce.
            if memory and micro > 0:
                memory.next_micro_batch()
            with gradient_sync(model, config, enabled=last):
                ctx.mark(f"{label}: step {step}{tag} forward")
                with tracker.phase("forward") if tracker else nullcontext():
                    loss = model(idx, targets)
                    if micro_batches > 1:
                        loss = loss / micro_batches  # the accumulated gradient is the mean over micro-batches
                if memory and last:
                    memory.mark_after_forward()
                ctx.mark(f"{label}: step {step}{tag} backward")
                with tracker.phase("backward") if tracker else nullcontext():
                    loss.backward()
            total += loss.item()
        ctx.mark(f"{label}: step {step} optimizer")
        with tracker.phase("optimizer") if tracker else nullcontext():
            optimizer.step()
        return total

    parity = None
    for step in range(config.steps_before_tracked):
        if step == 0 and config.check_gradients:
            tolerance = MIXED_PRECISION_TOLERANCE if config.options.mixed_precision else TOLERANCE
            parity = gradient_parity(
                ctx, model, optimizer, model_config,
                lambda r: training_batch(model_config, config, r, 0, ctx.device), tolerance,
            )
        else:
            train_step(step)

    # The measured step. The cycle collector stays off during it, so when it happens to run cannot move
    # the figures (the warm-up steps leave FSDP2's reference cycles behind).
    step = config.steps_before_tracked
    gc.collect()
    gc.disable()
    try:
        memory = MemoryTracker(model, optimizer, ctx.device)
        with memory:
            # Hooks go on after the memory tracker has re-registered FSDP's own (it wraps them), so the
            # timeline's module events sit where they should relative to FSDP's.
            comm = CommTracker(model, ctx.world_size, mesh=mesh, wait_for_gloo=True)
            with comm:
                loss = train_step(step, comm, memory)
                memory.mark_persistent()
            comm.remove_hooks()
    finally:
        gc.enable()
    # Read now: gradients are still present (no zero_grad yet) and the CUDA peak is this step's.
    memory_result = {"rank": ctx.rank, **model_state_bytes(model, optimizer, config.shards), **memory.result()}

    step_time, overlap = _time_steps(ctx, config, train_step, step + 1)
    return {
        "config": {
            "backend": ctx.backend,
            "device": str(ctx.device),
            "torch_version": str(torch.__version__),  # a TorchVersion would need torch to unpickle
            "cuda_version": torch.version.cuda if ctx.device.type == "cuda" else None,
            "gpu_name": torch.cuda.get_device_name(ctx.device) if ctx.device.type == "cuda" else None,
            "num_params": inner.num_params(),  # a DTensor's numel is its global size
            "padded_num_params": padded_numel(inner, config.shards),
            "n_blocks": len(inner.blocks),
            "model": model_config.to_dict(),
            "seq_len": config.seq_len or model_config.block_size,
        },
        "memory": memory_result,
        "comm": comm.summary(),
        "step_time_s": step_time,
        "loss": loss,
        "gradient_parity": parity,
        "overlap": overlap,
    }


def gradient_sync(model, config: RunConfig, *, enabled: bool):
    """A context in which backward does (enabled) or does not synchronize gradients."""
    if enabled or config.grad_accum_steps == 1:
        return nullcontext()
    if config.strategy.uses_ddp:
        return model.no_sync()
    return _fsdp_sync_off(model)


@contextmanager
def _fsdp_sync_off(model):
    # FSDP2: no reduce-scatter in this backward; each unit keeps its unsharded gradient to add to.
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def _time_steps(
    ctx: RankContext, config: RunConfig, train_step, first_step: int
) -> tuple[float | None, dict | None]:
    import torch

    def synchronize():
        if ctx.device.type == "cuda":
            torch.cuda.synchronize(ctx.device)

    durations = []
    for i in range(config.timed_steps):
        synchronize()
        started = time.perf_counter()
        train_step(first_step + i)
        synchronize()
        durations.append(time.perf_counter() - started)
    overlap = None
    # Only NCCL runs collectives as kernels beside compute. Shared-GPU ranks (gloo: a host round trip on
    # the rank's thread) and a rank view (nothing moves) have no communication kernels to overlap.
    if ctx.device.type == "cuda" and ctx.backend == "nccl":
        from sharding_lab.engine.overlap import profile_overlap

        overlap = profile_overlap(lambda: train_step(first_step + config.timed_steps), ctx.device)
    return (statistics.median(durations) if durations else None), overlap
