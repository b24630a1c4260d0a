"""Measure a strategy from the run itself: memory by category, every collective, step time.

`measure(strategy, world_size, size="tiny", **options)` starts the ranks, trains a few steps and
returns one JSON-ready dict (the `sharding-lab measure --json` output). `measure_many(runs, world_size)`
measures several configurations in one launch, one after another in the same process group: starting
processes and importing torch is the slow part on a small machine.

Each configuration, on every rank:
1. build the GPT (on the meta device for FSDP, which shards before materializing), parallelize it;
2. warm-up steps: FSDP's lazy init, Adam's state and DDP's bucket rebuild all happen here, so the
   measured step is a steady one. With `check_gradients`, the first warm-up step also compares the full
   gradient with a single-process reference on the same global batch;
3. one measured step under the memory and communication trackers, phase by phase;
4. plain timed steps for `step_time_s` (the trackers slow a step down); on CUDA one of them runs under
   the profiler to see whether communication kernels overlapped compute kernels.

The measurement (all sizes in bytes):

    config      strategy, world_size, size, backend, device, torch_version, prefetch, mixed_precision,
                reshard_after_forward, num_params (Ψ), padded_num_params (after FSDP's dim-0 padding),
                n_blocks, model (the GPTConfig), seq_len, batch_size_per_rank, steps and seed
    memory.per_rank[]   one per rank:
        params_bytes, grads_bytes, optimizer_bytes, model_states_bytes   exact local tensors, between steps
        optimizer_scalar_bytes   Adam's `step` counters (outside the ZeRO model)
        padding_elements, padding_bytes   how far this rank's shard is short of FSDP's padded shard
        peak_bytes, persistent_bytes   tracker totals: the step's peak, and after optimizer.step()
        categories   the peak moment by category (they add up to peak_bytes): params, grads, optimizer,
                     activations, temporaries, all_gather_buffers, reduce_scatter_buffers, buffers,
                     inputs, other
        category_peaks   each category's own maximum over the step
        unsharded_params_after_forward_bytes   gathered parameters alive when forward returns
        unsharded_params_peak_bytes   the most gathered parameters alive at once (FSDP's copied-out
                     parameters; a prefetched all-gather still in its buffer counts as all_gather_buffers)
        cuda_max_memory_allocated   torch.cuda's figure on CUDA, null on CPU
    comm        rank 0's step (every rank issues the same collectives):
        collectives[]   seq, op, phase, module, prefetch, bytes (logical, the full buffer), wire_bytes_derived,
                        dtype
        totals          per op: count, bytes, wire_bytes_derived
        bytes_per_step, wire_bytes_per_step_derived, bytes_per_step_per_rank
        timeline[]      collectives (event "collective", with op) and module events (event e.g.
                        "forward_start", pass "forward", edge "start", module, phase) in issue order
    predicted   sharding_lab.analytic's model_states_bytes_per_rank and communication_bytes_per_step,
                and where PyTorch departs from the paper
    step_time_s (slowest rank's median plain step), step_time_s_per_rank, loss,
    gradient_parity (with check_gradients), overlap (CUDA only)
"""

from __future__ import annotations

import math
import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any

from sharding_lab.engine.launch import RankContext, run_ranks, under_torchrun

DEFAULTS: dict[str, Any] = {
    "size": "tiny",
    "prefetch": True,
    "mixed_precision": False,
    "reshard_after_forward": None,  # None: the strategy's own (zero2 False, zero3 True)
    "batch_size": 2,  # per rank; the global batch is world_size times this
    "seq_len": None,  # None: the model's block_size
    "warmup_steps": 2,
    "timed_steps": 3,
    "check_gradients": False,
    "seed": 0,
    "model_overrides": None,  # GPTConfig fields to change, e.g. {"vocab_size": 131}
    "lr": 1e-3,
    # FSDP only: what summed gradients are divided by (None: FSDP's choice, the world size). Setting 1
    # makes FSDP sum instead of average, the regression the gradient-parity check must catch.
    "gradient_divide_factor": None,
}


def measure(strategy: str, world_size: int, size: str = "tiny", *, device: str = "cpu",
            timeout_s: float = 600.0, **options: Any) -> dict:
    """One configuration's measurement (see the module docstring); options are DEFAULTS' keys."""
    return measure_many([{"strategy": strategy, "size": size, **options}], world_size,
                        device=device, timeout_s=timeout_s)[0]


def measure_many(runs: Sequence[dict], world_size: int, *, device: str = "cpu", timeout_s: float = 600.0,
                 on_progress: Callable[[str], None] | None = None) -> list[dict]:
    """Measure each run (a dict with `strategy` and any DEFAULTS keys) in one launch of `world_size` ranks."""
    from sharding_lab.strategies import canonical_strategy  # no torch in the parent

    specs = []
    for run in runs:
        unknown = set(run) - set(DEFAULTS) - {"strategy"}
        if unknown:
            raise ValueError(f"unknown options {sorted(unknown)}; valid: {sorted(DEFAULTS)}")
        spec = {**DEFAULTS, **run, "strategy": canonical_strategy(run["strategy"])}
        if spec["mixed_precision"] and spec["strategy"] in ("ddp", "zero1") and device != "cuda" and not under_torchrun():
            raise ValueError(f"{spec['strategy']} with mixed precision needs CUDA (DDP's mixed precision uses CUDA events)")
        specs.append(spec)
    if on_progress:
        on_progress(f"starting {world_size} ranks for {len(specs)} configuration(s)")
    per_rank = run_ranks(
        _measure_on_rank, world_size, specs, device=device, timeout_s=timeout_s, on_progress=on_progress
    )
    return [_combine(spec, [rank_results[i] for rank_results in per_rank]) for i, spec in enumerate(specs)]


# --- the parent's side: one JSON object per configuration ---------------------------------------------


def _combine(spec: dict, ranks: list[dict]) -> dict:
    first = ranks[0]
    config = {
        "strategy": spec["strategy"],
        "world_size": len(ranks),
        "size": spec["size"],
        **first["config"],
        "prefetch": spec["prefetch"],
        "mixed_precision": spec["mixed_precision"],
        "batch_size_per_rank": spec["batch_size"],
        "warmup_steps": spec["warmup_steps"],
        "timed_steps": spec["timed_steps"],
        "seed": spec["seed"],
    }
    result = {
        "config": config,
        "memory": {"per_rank": [r["memory"] for r in ranks]},
        "comm": first["comm"],
        "predicted": _predicted(config),
        # The slowest rank sets the pace of a synchronous step.
        "step_time_s": max(r["step_time_s"] for r in ranks),
        "step_time_s_per_rank": [r["step_time_s"] for r in ranks],
        "loss": first["loss"],
    }
    result["comm"]["bytes_per_step_per_rank"] = [r["comm"]["bytes_per_step"] for r in ranks]
    if first.get("gradient_parity") is not None:
        result["gradient_parity"] = first["gradient_parity"]
    if first.get("overlap") is not None:
        result["overlap"] = first["overlap"]
    return result


def _predicted(config: dict) -> dict:
    """The analytic model's figures for this run; empty if sharding_lab.analytic is missing."""
    try:
        from sharding_lab import analytic
    except ImportError:
        return {}
    strategy, n, psi = config["strategy"], config["world_size"], config["num_params"]
    padded = config["padded_num_params"] if strategy in ("zero2", "zero3") else None
    # fp32 master parameters and gradients are what both our fp32 and mixed-precision runs keep
    # between steps (bf16 copies exist only while gathered), so the fp32 accounting applies.
    return {
        "model_states_bytes_per_rank": analytic.model_states_bytes_per_rank(psi, n, strategy, padded_num_params=padded),
        "communication_bytes_per_step": analytic.communication_bytes_per_step(psi, n, strategy),
        "accounting": "fp32 Adam (4+4+8 bytes per parameter), FSDP padding included for zero2/zero3",
        "differences": _KNOWN_DIFFERENCES.get(strategy, ""),
    }


# Where PyTorch's implementation of a strategy departs from the paper's accounting, measured as such.
_KNOWN_DIFFERENCES = {
    "zero1": (
        "ZeroRedundancyOptimizer assigns whole parameters to ranks, so optimizer bytes per rank are near, "
        "not exactly, 8Ψ/N (they sum to 8Ψ); it all-reduces gradients (2Ψ) and broadcasts parameters (Ψ)."
    ),
    "zero2": (
        "FSDP2 with reshard_after_forward=False keeps only a parameter shard between steps (stage 3's "
        "params bytes); the full parameters exist from each block's forward to its backward."
    ),
    "zero3": "FSDP2 does not reshard the root after forward, so backward all-gathers the blocks only.",
}


# --- one rank's side -----------------------------------------------------------------------------------


def _measure_on_rank(ctx: RankContext, specs: list[dict]) -> list[dict]:
    import torch

    if ctx.device.type == "cpu":
        torch.set_num_threads(1)  # ranks share the machine's cores; oversubscription only adds noise
    results = []
    for index, spec in enumerate(specs):
        results.append(_measure_one(ctx, spec, index, len(specs)))
        torch.distributed.barrier()
    return results


def _build(ctx: RankContext, spec: dict):
    import torch

    from sharding_lab.engine.model import GPT, config_for
    from sharding_lab.engine.parallelize import ParallelOptions, is_fully_sharded, parallelize

    config = config_for(spec["size"], **(spec["model_overrides"] or {}))
    options = ParallelOptions(
        prefetch=spec["prefetch"],
        mixed_precision=spec["mixed_precision"],
        reshard_after_forward=spec["reshard_after_forward"],
        lr=spec["lr"],
    )
    torch.manual_seed(spec["seed"])
    if is_fully_sharded(spec["strategy"]):
        # torchtitan's order: shard on meta, then give each rank storage for its shard only.
        with torch.device("meta"):
            model = GPT(config)
        model, make_optimizer = parallelize(model, spec["strategy"], ctx.mesh, options)
        model.to_empty(device=ctx.device)
        with torch.no_grad(), warnings.catch_warnings():
            # On a CPU mesh DTensor fills each local shard from this rank's own generator (it warns
            # so): the values differ from an unsharded init, but they are GPT-2's distribution.
            warnings.filterwarnings("ignore", message="DTensor random operators")
            model.init_weights()
        if spec["gradient_divide_factor"] is not None:
            _set_gradient_divide_factor(model, spec["gradient_divide_factor"])
    else:
        with torch.device(ctx.device):
            model = GPT(config)
        with torch.no_grad():
            model.init_weights()
        model, make_optimizer = parallelize(model, spec["strategy"], ctx.mesh, options)
    return config, model, make_optimizer()


def _set_gradient_divide_factor(model, factor: float) -> None:
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            # Plain sums on the wire, then a division by `factor`: gloo has no pre-multiplied sum.
            module.set_force_sum_reduction_for_comms(True)
            module.set_gradient_divide_factor(factor)


def _batch(config, spec: dict, rank: int, step: int, device):
    """Rank `rank`'s batch for `step`, the same whichever process makes it (the reference needs all)."""
    import torch

    seq_len = spec["seq_len"] or config.block_size
    generator = torch.Generator().manual_seed(spec["seed"] * 1_000_003 + step * 1_009 + rank)
    tokens = torch.randint(0, config.vocab_size, (spec["batch_size"], seq_len + 1), generator=generator)
    return tokens[:, :-1].contiguous().to(device), tokens[:, 1:].contiguous().to(device)


def _measure_one(ctx: RankContext, spec: dict, index: int, count: int) -> dict:
    import torch

    from sharding_lab.engine.comm import CommTracker
    from sharding_lab.engine.memory import MemoryTracker, model_state_bytes
    from sharding_lab.engine.parity import MIXED_PRECISION_TOLERANCE, TOLERANCE, gradient_parity

    label = f"{spec['strategy']} ({index + 1}/{count})"
    ctx.mark(f"{label}: build")
    config, model, optimizer = _build(ctx, spec)
    inner = getattr(model, "module", model)

    def train_step(step: int, tracker: CommTracker | None = None, memory: MemoryTracker | None = None) -> float:
        idx, targets = _batch(config, spec, ctx.rank, step, ctx.device)
        optimizer.zero_grad(set_to_none=True)
        ctx.mark(f"{label}: step {step} forward")
        with tracker.phase("forward") if tracker else nullcontext():
            loss = model(idx, targets)
        if memory:
            memory.mark_after_forward()
        ctx.mark(f"{label}: step {step} backward")
        with tracker.phase("backward") if tracker else nullcontext():
            loss.backward()
        ctx.mark(f"{label}: step {step} optimizer")
        with tracker.phase("optimizer") if tracker else nullcontext():
            optimizer.step()
        return loss.item()

    parity = None
    for step in range(spec["warmup_steps"]):
        if step == 0 and spec["check_gradients"]:
            tolerance = MIXED_PRECISION_TOLERANCE if spec["mixed_precision"] else TOLERANCE
            parity = gradient_parity(
                ctx, model, optimizer, config, lambda r: _batch(config, spec, r, 0, ctx.device), tolerance
            )
        else:
            train_step(step)

    # The measured step.
    step = spec["warmup_steps"]
    memory = MemoryTracker(model, optimizer, ctx.device)
    with memory:
        # Hooks go on after the memory tracker has re-registered FSDP's own (it wraps them), so the
        # timeline's module events sit where they should relative to FSDP's.
        comm = CommTracker(model, ctx.world_size)
        with comm:
            loss = train_step(step, comm, memory)
            memory.mark_persistent()
        comm.remove_hooks()
    # Read now: gradients are still present (no zero_grad yet) and the CUDA peak is this step's.
    memory_result = {"rank": ctx.rank, **model_state_bytes(model, optimizer, ctx.world_size), **memory.result()}

    step_time, overlap = _time_steps(ctx, spec, train_step, step + 1)
    return {
        "config": {
            "backend": ctx.backend,
            "device": str(ctx.device),
            "torch_version": str(torch.__version__),  # a TorchVersion would need torch to unpickle
            "reshard_after_forward": _reshard_after_forward(spec),
            "num_params": inner.num_params(),  # a DTensor's numel is its global size
            "padded_num_params": _padded_numel(inner, ctx.world_size),
            "n_blocks": len(inner.blocks),
            "model": config.to_dict(),
            "seq_len": spec["seq_len"] or config.block_size,
        },
        "memory": memory_result,
        "comm": comm.summary(),
        "step_time_s": step_time,
        "loss": loss,
        "gradient_parity": parity,
        "overlap": overlap,
    }


def _time_steps(ctx: RankContext, spec: dict, train_step, first_step: int) -> tuple[float, dict | None]:
    import torch

    def synchronize():
        if ctx.device.type == "cuda":
            torch.cuda.synchronize(ctx.device)

    durations = []
    for i in range(spec["timed_steps"]):
        synchronize()
        started = time.perf_counter()
        train_step(first_step + i)
        synchronize()
        durations.append(time.perf_counter() - started)
    overlap = None
    if ctx.device.type == "cuda":
        from sharding_lab.engine.overlap import profile_overlap

        overlap = profile_overlap(lambda: train_step(first_step + spec["timed_steps"]), ctx.device)
    return (statistics.median(durations) if durations else 0.0), overlap


def _reshard_after_forward(spec: dict) -> bool | None:
    if spec["strategy"] not in ("zero2", "zero3"):
        return None
    if spec["reshard_after_forward"] is not None:
        return spec["reshard_after_forward"]
    return spec["strategy"] == "zero3"


def _padded_numel(model, world_size: int) -> int:
    """Elements after FSDP2 pads each sharded parameter's dim 0 to a multiple of N (others as they are)."""
    from torch.distributed.tensor import DTensor

    total = 0
    for p in model.parameters():
        if isinstance(p, DTensor):
            shape = tuple(p.shape) or (1,)
            total += math.ceil(shape[0] / world_size) * world_size * math.prod(shape[1:])
        else:
            total += p.numel()
    return total
