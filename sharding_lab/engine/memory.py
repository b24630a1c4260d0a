"""Per-rank memory: exact bytes of the local model-state tensors, and memory by category over a step.

Two sources, kept apart:

- `model_state_bytes(model, optimizer, world_size)` reads the tensors themselves between steps: the
  local shard of every parameter (FSDP's DTensors through `to_local()`), its gradient, and the
  optimizer's state. Exact to the byte; this is what the analytic model predicts.
- `MemoryTracker` wraps torch's `MemTracker` (DDP) or `FSDPMemTracker` (FSDP), TorchDispatchModes that
  see every allocation, and reports peak and persistent bytes by category: parameters, gradients,
  optimizer state, activations, temporaries, all-gather and reduce-scatter buffers. It also keeps
  each category's own maximum, so "the most gathered parameters held at once" is exact, not sampled.
  On CUDA, `torch.cuda.max_memory_allocated` is reported beside it as a cross-check (the caching
  allocator rounds blocks up, so it reads somewhat higher).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from sharding_lab.analytic import fsdp_shard_numel
from sharding_lab.engine import _torch_internals as internals
from sharding_lab.measurement import CATEGORIES, block_index

# Tracker category -> ours. FSDP's tracker splits parameters and gradients into sharded and unsharded.
_CATEGORY_NAMES: dict[str, str] = {
    "Parameter": "params",
    "Sharded Param": "params",
    "Unsharded Param": "params",
    "Gradient": "grads",
    "Sharded Grad": "grads",
    "Unsharded Grad": "grads",
    "Optstate": "optimizer",
    "OptState": "optimizer",
    "Activation": "activations",
    "Temp": "temporaries",
    "All Gather": "all_gather_buffers",
    "Reduce Scatter": "reduce_scatter_buffers",
    "Buffer": "buffers",
    "Inputs": "inputs",
    "Other": "other",
}
_TOTAL = "Total"


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _padded_local_numel(p: torch.Tensor, world_size: int) -> int:
    """A sharded parameter's padded shard on every rank; an unsharded one is whole."""
    return fsdp_shard_numel(tuple(p.shape), world_size) if isinstance(p, DTensor) else p.numel()


def padded_numel(model: nn.Module, world_size: int) -> int:
    """Elements after FSDP2 pads each sharded parameter's dim 0 to a multiple of N (others as they are)."""
    return sum(
        world_size * _padded_local_numel(p, world_size) if isinstance(p, DTensor) else p.numel()
        for p in model.parameters()
    )


def model_state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer, world_size: int) -> dict[str, int | str]:
    """Exact bytes of this rank's parameters, gradients and optimizer state, read off the tensors.

    `optimizer_bytes` counts per-element state (Adam's exp_avg and exp_avg_sq); Adam's scalar `step`
    counters are in `optimizer_scalar_bytes`, since the ZeRO model leaves them out.
    `padding_elements` is how many elements short of FSDP's padded shard this rank's parameters are
    (rank 0's shard is never short); `padding_bytes` is what they would cost across params, grads and
    optimizer state at this run's element sizes, so `model_states_bytes + padding_bytes` is the padded
    prediction.
    """
    params = grads = padding_elements = 0
    param_element_size = grad_element_size = 4
    devices: set[str] = set()  # where the states live: the device, or the host under CPU offload
    for p in model.parameters():
        local = _local(p)
        devices.add(local.device.type)
        params += _nbytes(local)
        param_element_size = local.element_size()
        padding_elements += _padded_local_numel(p, world_size) - local.numel()
        if p.grad is not None:
            local_grad = _local(p.grad)
            devices.add(local_grad.device.type)
            grads += _nbytes(local_grad)
            grad_element_size = local_grad.element_size()
    optimizer_bytes = scalar_bytes = 0
    elements_with_state = 0
    local_optimizer = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer keeps its shard in .optim
    for param, state in local_optimizer.state.items():
        elements_with_state += _local(param).numel()
        for key, value in state.items():
            if not isinstance(value, torch.Tensor):
                continue
            local = _local(value)
            if key == "step":
                scalar_bytes += _nbytes(local)
            else:
                devices.add(local.device.type)
                optimizer_bytes += _nbytes(local)
    optimizer_per_element = optimizer_bytes / elements_with_state if elements_with_state else 8
    return {
        "params_bytes": params,
        "grads_bytes": grads,
        "optimizer_bytes": optimizer_bytes,
        "optimizer_scalar_bytes": scalar_bytes,
        "model_states_bytes": params + grads + optimizer_bytes,
        "padding_elements": padding_elements,
        "padding_bytes": int(padding_elements * (param_element_size + grad_element_size + optimizer_per_element)),
        "states_device": "+".join(sorted(devices)),
    }


def _our_category(tracker_category: str) -> str | None:
    """Ours for one of the tracker's category names (None for its total)."""
    return None if tracker_category == _TOTAL else _CATEGORY_NAMES.get(tracker_category, "other")


def _normalise(snapshot: dict[str, int]) -> dict[str, int]:
    categories = dict.fromkeys(CATEGORIES, 0)
    for name, value in snapshot.items():
        if (ours := _our_category(getattr(name, "value", name))) is not None:
            categories[ours] += value
    return categories


def _gathered_param_category(fsdp: bool) -> str:
    return "Unsharded Param" if fsdp else "Parameter"  # DDP's parameters are never sharded


def _unsharded_params(snapshot: dict[str, int], fsdp: bool) -> int:
    wanted = _gathered_param_category(fsdp)
    return sum(v for k, v in snapshot.items() if getattr(k, "value", k) == wanted)


def _a_later_block_runs(open_modules: set[str]) -> bool:
    """Whether a block after the first is running (forward or backward). The first block's all-gather is
    waited on while the root's output is still alive, and the root's can outweigh many blocks."""
    return any((index := block_index(name)) is not None and index > 0 for name in open_modules)


class MemoryTracker:
    """Track one rank's memory over the steps run inside `with tracker:`."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device):
        self.device = device
        self.fsdp = isinstance(model, FSDPModule)
        # Gathered parameters and the all-gather buffers they are copied out of, held together: what
        # explicit prefetching adds to (the next block waits in its buffer), whatever temporaries do.
        gathered = (_gathered_param_category(self.fsdp), "All Gather")
        if self.fsdp:
            tracker_class = internals.with_category_peaks(internals.fsdp_mem_tracker_class(), gathered,
                                                          _a_later_block_runs, _our_category)
            self._tracker = tracker_class(model, optimizer)
        else:
            self._tracker = internals.with_category_peaks(internals.mem_tracker_class(), gathered,
                                                          _a_later_block_runs, _our_category)()
            self._tracker.track_external(model, getattr(optimizer, "optim", optimizer))
        self.after_forward: dict[str, int] | None = None
        self.persistent: dict[str, int] | None = None

    def __enter__(self) -> MemoryTracker:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self._hooks = internals.multi_grad_hooks_removed_on_exit()
        self._hooks.__enter__()
        self._tracker.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self._tracker.__exit__(*exc)
        finally:
            self._hooks.__exit__(*exc)

    def _current(self) -> dict:
        return self._tracker.get_tracker_snapshot("current").get(self._device_key(), {})

    def _device_key(self) -> torch.device:
        return torch.device("cpu") if self.device.type == "cpu" else self.device

    def next_micro_batch(self) -> None:
        """Call before each forward after the first in one tracked step (gradient accumulation): the
        tracker's per-module statistics start over (FSDP's refuses a second root forward otherwise);
        the step's peak and categories carry on."""
        self._tracker.reset_mod_stats()

    def mark_after_forward(self) -> None:
        self.after_forward = self._current()

    def mark_persistent(self) -> None:
        """Call between steps (after `optimizer.step()`): what stays allocated until the next step."""
        self.persistent = self._current()

    def result(self) -> dict:
        key = self._device_key()
        peak = self._tracker.get_tracker_snapshot("peak").get(key, {})
        category_peaks = self._tracker.__dict__.get("category_peaks", {}).get(key, {})
        group_peaks = self._tracker.__dict__.get("group_peaks", {}).get(key, {})
        persistent = self.persistent or {}
        return {
            "peak_bytes": int(peak.get(_TOTAL, 0)),
            "persistent_bytes": int(persistent.get(_TOTAL, 0)),
            # The breakdown of the peak moment: these add up to peak_bytes.
            "categories": _normalise(peak),
            # Each category's own maximum over the step (they need not coincide in time). Ours that join
            # two of the tracker's (sharded and unsharded parameters, or gradients) are the maximum of
            # the two's sum at one moment: the sum of their own maxima counted bytes never held at once.
            "category_peaks": {**dict.fromkeys(CATEGORIES, 0), **group_peaks},
            "unsharded_params_peak_bytes": int(_unsharded_params(category_peaks, self.fsdp)),
            "unsharded_params_after_forward_bytes": int(_unsharded_params(self.after_forward or {}, self.fsdp)),
            "gathered_with_buffers_peak_bytes": int(self._tracker.__dict__.get("joint_peaks", {}).get(key, 0)),
            "gathered_with_buffers_later_blocks_peak_bytes": int(
                self._tracker.__dict__.get("window_joint_peaks", {}).get(key, 0)),
            "activations_after_forward_bytes": _normalise(self.after_forward or {})["activations"],
            "cuda_max_memory_allocated": (
                int(torch.cuda.max_memory_allocated(self.device)) if self.device.type == "cuda" else None
            ),
        }
