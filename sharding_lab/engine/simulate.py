"""Simulate one FSDP2 (zero3) training step at any scale, on one CPU process, without allocating it.

torchtitan's former estimation method: the real model and the real `fully_shard` calls, but every
tensor a FakeTensor (shapes and dtypes, no storage) and every collective answered by the `fake`
process group, with FSDPMemTracker counting the bytes each category would occupy on rank 0. So a
70B-shaped model at 1024 ranks runs in seconds on a 2-core CPU machine, in about 350 MB of RAM.

Three deviations from torchtitan's estimation.py, all for speed at large world sizes:
- The device mesh is built outside FakeTensorMode (inside it, mesh setup crawls).
- `parallelize` (the same function the measured runs use: fully_shard per block, then the root)
  shards the model while it is still on the meta device, outside FakeTensorMode: FSDP2 splits every
  parameter into N chunks, and 1024 FakeTensor chunks per parameter take ~50 s for a 70B model where
  meta chunks take ~2 s. `to_empty` then materializes the sharded parameters as FakeTensors.
- The tracker keeps only the global peak (`_torch_internals.global_peak_only`).
"""

from __future__ import annotations

import resource
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from sharding_lab.analytic import fsdp_padded_numel, model_states_bytes_per_rank
from sharding_lab.engine import _torch_internals as internals
from sharding_lab.engine.model import GPT, config_for
from sharding_lab.engine.parallelize import parallelize
from sharding_lab.run_config import ParallelOptions
from sharding_lab.strategies import Strategy

SIMULATED_STRATEGY = Strategy.ZERO3
SIMULATED_RANK = 0  # rank 0 holds the largest shard of every parameter (torch.chunk puts the remainder last)
# torch.optim.Adam keeps a float32 scalar `step` tensor per parameter beside exp_avg and exp_avg_sq;
# the paper's 8 bytes per parameter do not count it.
ADAM_STEP_COUNTER_BYTES = 4
# Short enough that a 70B model at 1024 ranks simulates in seconds; activations grow with it.
DEFAULT_SEQ = 128

# The tracker's categories, under the names the rest of sharding_lab uses.
_REF = internals.fsdp_ref_types()
CATEGORY_NAMES: dict = {
    _REF.SHARDED_PARAM: "params",
    _REF.SHARDED_GRAD: "grads",
    _REF.OPT: "optimizer",
    _REF.ACT: "activations",
    _REF.TEMP: "temporaries",
    _REF.UNSHARDED_PARAM: "unsharded_params",
    _REF.UNSHARDED_GRAD: "unsharded_grads",
    _REF.ALL_GATHER: "all_gather_buffers",
    _REF.REDUCE_SCATTER: "reduce_scatter_buffers",
    _REF.BUFFER: "module_buffers",
    _REF.INP: "inputs",
}
# FSDPMemTracker keeping only the global peak: its per-module peaks walk every tracked module on every
# dispatched op, a third of the run time for 80 blocks, for figures the simulation never reads.
_GlobalPeakMemTracker = internals.global_peak_only(internals.fsdp_mem_tracker_class())


def _by_category(snapshot: dict) -> dict[str, int]:
    """One device's tracker snapshot with our category names (the simulation has one device)."""
    (device_snapshot,) = snapshot.values()
    named = {name: device_snapshot.get(ref_type, 0) for ref_type, name in CATEGORY_NAMES.items()}
    named["total"] = device_snapshot["Total"]
    return named


def _peak_rss_bytes() -> int:
    # ru_maxrss is in KiB on Linux: the high-water mark of this whole process.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def simulate(
    size: str,
    world_size: int,
    *,
    batch: int = 1,
    seq: int | None = None,
    prefetch: bool = True,
    mixed_precision: bool = False,
    steps: int = 2,
) -> dict:
    """Simulate `steps` zero3 training steps of the named GPT over `world_size` fake ranks.

    `seq` defaults to DEFAULT_SEQ, or the model's block_size if that is shorter.

    Returns rank 0's bytes: `per_rank` (model states after the last optimizer step, activations at
    the end of the last forward, the peak and its breakdown) beside `predicted`, the analytic zero3
    model states with FSDP2's padding (its optimizer part plus Adam's 4-byte step counters), plus
    wall time and the process's peak host RSS.
    The first step creates Adam's state, so only the later steps' peak includes it (hence 2 steps).
    Needs a process without a default process group (it starts and ends a fake one).
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    config = config_for(size)
    seq = min(DEFAULT_SEQ, config.block_size) if seq is None else seq
    if seq > config.block_size:
        raise ValueError(f"seq {seq} exceeds {size}'s block_size {config.block_size}")
    if dist.is_initialized():
        raise RuntimeError("simulate starts its own fake process group; this process already has one")

    started = time.perf_counter()
    # The fake backend answers every collective at once (fetching its store registers it).
    dist.init_process_group("fake", rank=SIMULATED_RANK, world_size=world_size, store=internals.fake_store())
    try:
        mesh = init_device_mesh("cpu", (world_size,))
        with torch.device("meta"):
            model = GPT(config)
        num_params = model.num_params()
        num_param_tensors = len(list(model.parameters()))
        padded_num_params = fsdp_padded_numel([tuple(p.shape) for p in model.parameters()], world_size)
        model, make_optimizer = parallelize(
            model, SIMULATED_STRATEGY, mesh, ParallelOptions(prefetch=prefetch, mixed_precision=mixed_precision)
        )
        # allow_non_fake_inputs: `to_empty` reads the meta parameters once to make their fake twins.
        with internals.fake_tensor_mode(allow_non_fake_inputs=True):
            model.to_empty(device="cpu")  # no init_weights(): fake tensors have no values to set
            optimizer = make_optimizer()
            idx = torch.randint(0, config.vocab_size, (batch, seq))
            targets = torch.randint(0, config.vocab_size, (batch, seq))
            tracker = _GlobalPeakMemTracker(mod=model, optm=optimizer)
            tracker.track_inputs((idx, targets))
            with tracker:
                for step in range(steps):
                    loss = model(idx, targets)
                    after_forward = _by_category(tracker.get_tracker_snapshot("current"))
                    loss.backward()
                    optimizer.step()
                    # Between optimizer step and zero_grad every model state exists at once.
                    after_step = _by_category(tracker.get_tracker_snapshot("current"))
                    optimizer.zero_grad()
                    if step == 0 and steps > 1:
                        tracker.reset_mod_stats()  # the first step has no Adam state during forward
                peak = _by_category(tracker.get_tracker_snapshot("peak"))
    finally:
        dist.destroy_process_group()
    wall_s = time.perf_counter() - started

    per_rank = {
        "params": after_step["params"],
        "grads": after_step["grads"],
        "optimizer": after_step["optimizer"],
        "model_states": after_step["params"] + after_step["grads"] + after_step["optimizer"],
        "activations": after_forward["activations"],
        "peak": peak["total"],
    }
    # FSDP2 keeps fp32 sharded parameters, gradients and Adam state even with bf16 compute.
    predicted = model_states_bytes_per_rank(
        num_params, world_size, SIMULATED_STRATEGY, padded_num_params=padded_num_params
    )
    predicted["optimizer_step_counters"] = ADAM_STEP_COUNTER_BYTES * num_param_tensors
    predicted["optimizer"] += predicted["optimizer_step_counters"]
    predicted["total"] += predicted["optimizer_step_counters"]
    return {
        "size": size,
        "config": config.to_dict(),
        "strategy": str(SIMULATED_STRATEGY),
        "rank": SIMULATED_RANK,
        "world_size": world_size,
        "batch": batch,
        "seq": seq,
        "prefetch": prefetch,
        "mixed_precision": mixed_precision,
        "steps": steps,
        "num_params": num_params,
        "padded_num_params": padded_num_params,
        "per_rank": per_rank,
        "peak_breakdown": peak,
        "after_forward": after_forward,
        "predicted": predicted,
        "model_states_match_prediction": all(per_rank[k] == predicted[k] for k in ("params", "grads", "optimizer")),
        "wall_s": wall_s,
        "peak_rss_bytes": _peak_rss_bytes(),
        "method": "FSDP2 fully_shard (per block, then root) under FakeTensorMode, fake process group, "
        "FSDPMemTracker",
    }
