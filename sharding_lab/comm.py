"""Record every collective a training step issues, in order, beside module forward/backward events.

`CommTracker` is a TorchDispatchMode: every collective reaches the dispatcher as a `c10d` op (DDP's
all-reduce from its C++ reducer, FSDP2's all-gather and reduce-scatter, ZeroRedundancyOptimizer's
broadcasts), so watching those ops sees them all without patching anything. For each it records:

- `op`: all_gather, reduce_scatter, all_reduce or broadcast;
- `bytes`: logical bytes at the API, the full (unsharded) buffer S: the all-gather's output, the
  reduce-scatter's input, the all-reduced or broadcast tensor;
- `wire_bytes_derived`: bytes each rank sends, derived from ring-algorithm formulas, not measured:
  all-gather and reduce-scatter (N-1)/N * S, all-reduce 2(N-1)/N * S, broadcast (N-1)/N * S (a
  pipelined broadcast crosses each of a ring's N-1 links once, (N-1) * S over N ranks). Backends do
  differ: gloo, for one, emulates reduce-scatter with an all-reduce;
- `phase` (forward, backward, optimizer: set by the training loop through `tracker.phase(...)`);
- `module`: the unit whose parameters or gradients move (FSDP's parameter group), else the tensor's
  own module (a broadcast parameter), else the tracked module whose forward or backward is running;
  `prefetch` says FSDP issued it ahead, from another unit's hook.

Module events join the same ordered `timeline`: `forward_start` once FSDP has gathered the module's
parameters and its own compute begins, `forward_end` after FSDP's post-forward; `backward_start` after
FSDP's pre-backward (its all-gather), `backward_end` once gradients for the module's input exist,
which is after FSDP's reduce-scatter for that module.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

# Dispatcher op name -> the collective it is. Functional (_c10d_functional) ops take one local tensor.
_COLLECTIVES: dict[str, str] = {
    "allreduce_": "all_reduce",
    "allreduce_coalesced_": "all_reduce",
    "all_reduce": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "_allgather_base_": "all_gather",
    "allgather_": "all_gather",
    "allgather_coalesced_": "all_gather",
    "allgather_into_tensor_coalesced_": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather",
    "_reduce_scatter_base_": "reduce_scatter",
    "reduce_scatter_": "reduce_scatter",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "broadcast_": "broadcast",
    "broadcast": "broadcast",
}
_NOT_COMMUNICATION = {"wait_tensor", "barrier", "monitored_barrier_"}  # synchronisation, no payload
OPS: tuple[str, ...] = ("all_gather", "reduce_scatter", "all_reduce", "broadcast")
PHASES: tuple[str, ...] = ("forward", "backward", "optimizer")
ROOT = "root"  # the name events use for the model itself
_IS_COLLECTIVE: dict = {}  # op overload -> whether it is a c10d collective


def ring_wire_bytes(op: str, logical_bytes: int, world_size: int) -> int | None:
    """Bytes each rank sends for a collective of `logical_bytes`, by the ring formulas (derived)."""
    n = world_size
    if op in ("all_gather", "reduce_scatter", "broadcast"):
        return (n - 1) * logical_bytes // n
    if op == "all_reduce":
        return 2 * (n - 1) * logical_bytes // n
    return None


def _tensor_bytes(obj: Any) -> int:
    leaves, _ = tree_flatten(obj)
    return sum(t.numel() * t.element_size() for t in leaves if isinstance(t, torch.Tensor))


def _logical_bytes(op: str, functional: bool, args: tuple, world_size: int) -> int:
    if functional:
        local = _tensor_bytes(args[0])
        return local * world_size if op == "all_gather" else local
    if op in ("all_gather", "reduce_scatter"):
        # (output, input, ...): the full buffer is the larger side, the shard the smaller.
        return max(_tensor_bytes(args[0]), _tensor_bytes(args[1]))
    return _tensor_bytes(args[0])


class CommTracker(TorchDispatchMode):
    """Use as `with CommTracker(model, world_size) as tracker:` around exactly the steps to record."""

    def __init__(self, model: nn.Module, world_size: int):
        super().__init__()
        self.world_size = world_size
        self.collectives: list[dict] = []
        self.timeline: list[dict] = []
        self._phase: str | None = None
        self._recording = False
        self._active_modules: list[str] = []  # started and not yet ended, innermost last
        self._units = _tracked_units(model)
        self._param_owner = {
            p.data_ptr(): _unit_of(name, self._units) for name, p in _unwrap(model).named_parameters()
        }
        self._handles = [h for name, module in self._units.items() for h in self._hook(name, module)]

    # -- the training loop's side ---------------------------------------------------------------------

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        assert name in PHASES, name
        previous, self._phase = self._phase, name
        try:
            yield
        finally:
            self._phase = previous

    def remove_hooks(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def __enter__(self):
        self._recording = True
        return super().__enter__()

    def __exit__(self, *exc):
        self._recording = False
        return super().__exit__(*exc)

    # -- results --------------------------------------------------------------------------------------

    def totals(self) -> dict[str, dict[str, int]]:
        totals = {op: {"count": 0, "bytes": 0, "wire_bytes_derived": 0} for op in OPS}
        for c in self.collectives:
            entry = totals.setdefault(c["op"], {"count": 0, "bytes": 0, "wire_bytes_derived": 0})
            entry["count"] += 1
            entry["bytes"] += c["bytes"]
            entry["wire_bytes_derived"] += c["wire_bytes_derived"] or 0
        return totals

    def summary(self, steps: int = 1) -> dict:
        """The `comm` section of a measurement, for `steps` recorded steps."""
        return {
            "collectives": self.collectives,
            "totals": self.totals(),
            "bytes_per_step": sum(c["bytes"] for c in self.collectives) // steps,
            "wire_bytes_per_step_derived": sum(c["wire_bytes_derived"] or 0 for c in self.collectives) // steps,
            "timeline": self.timeline,
        }

    # -- the dispatcher's side ------------------------------------------------------------------------

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        # Every op in the step passes through here; `func.namespace` is slow, so remember the answer.
        is_collective = _IS_COLLECTIVE.get(func)
        if is_collective is None:
            is_collective = _IS_COLLECTIVE[func] = func.namespace in ("c10d", "_c10d_functional")
        if is_collective and self._recording:
            self._record(func, args)
        return out

    def _record(self, func, args: tuple) -> None:
        name = func._schema.name.split("::", 1)[1]
        if name in _NOT_COMMUNICATION:
            return
        op = _COLLECTIVES.get(name, name)
        functional = func.namespace == "_c10d_functional"
        size = _logical_bytes(op, functional, args, self.world_size) if op in OPS else _tensor_bytes(args)
        module, prefetch = self._attribute(op, args)
        event = {
            "seq": len(self.collectives),
            "op": op,
            "phase": self._phase,
            "module": module,
            "prefetch": prefetch,
            "bytes": size,
            "wire_bytes_derived": ring_wire_bytes(op, size, self.world_size),
            "dtype": str(tree_flatten(args[0])[0][0].dtype).removeprefix("torch.") if args else None,
        }
        self.collectives.append(event)
        self.timeline.append({"event": "collective", **event})

    def _attribute(self, op: str, args: tuple) -> tuple[str | None, bool]:
        group, prefetch = _calling_fsdp_group()
        if group is not None:
            return group._module_fqn or ROOT, prefetch
        if op == "broadcast":
            owner = self._param_owner.get(tree_flatten(args[0])[0][0].data_ptr())
            if owner:
                return owner, False
        return (self._active_modules[-1] if self._active_modules else None), False

    # -- module events ----------------------------------------------------------------------------------

    def _event(self, kind: str, module: str) -> None:
        if not self._recording:
            return
        pass_name, edge = kind.split("_")  # "forward_start" -> ("forward", "start")
        self.timeline.append({"event": kind, "module": module, "pass": pass_name, "edge": edge, "phase": self._phase})

    def _hook(self, name: str, module: nn.Module) -> list:
        def first_grad_tensor(obj) -> torch.Tensor | None:
            leaves = tree_flatten(obj)[0]
            return next((t for t in leaves if isinstance(t, torch.Tensor) and t.requires_grad), None)

        def watching() -> bool:
            return self._recording and torch.is_grad_enabled()

        def mark_output(_module, _args, output):
            # Before FSDP's post-forward registers its pre-backward hook on this tensor, so the next
            # module's backward_end (queued on it later) is emitted before FSDP gathers for this one.
            if watching() and (t := first_grad_tensor(output)) is not None:
                self._arrival_queue(t)

        def capture_inputs(_module, args):
            # Before FSDP's pre-forward wraps the input: its gradient arrives after FSDP's post-backward.
            if watching() and (t := first_grad_tensor(args)) is not None:
                self._arrival_queue(t).append(name)

        def forward_start(_module, _args):
            self._active_modules.append(name)
            self._event("forward_start", name)

        def forward_end(_module, _args, output):
            self._event("forward_end", name)
            if name in self._active_modules:
                self._active_modules.remove(name)
            # After FSDP's pre-backward hook on the output: backward_start follows its all-gather.
            if watching() and (t := first_grad_tensor(output)) is not None:
                t.register_hook(self._on_backward_start(name, has_input_grad=name != ROOT))

        return [
            module.register_forward_pre_hook(capture_inputs, prepend=True),
            module.register_forward_pre_hook(forward_start),
            module.register_forward_hook(mark_output, prepend=True),
            module.register_forward_hook(forward_end),
        ]

    def _arrival_queue(self, t: torch.Tensor) -> list[str]:
        """Modules whose backward ends when `t`'s gradient arrives; one hook per tensor, made on first use."""
        queue = getattr(t, "_sharding_lab_backward_ends", None)
        if queue is None:
            queue = []
            t._sharding_lab_backward_ends = queue

            def hook(_grad):
                for module_name in queue:
                    self._on_backward_end(module_name)()

            t.register_hook(hook)
        return queue

    def _on_backward_start(self, name: str, *, has_input_grad: bool) -> Callable:
        def hook(grad):
            self._active_modules.append(name)
            self._event("backward_start", name)
            if not has_input_grad:
                # The root's input (token ids) has no gradient: its backward ends with the whole
                # backward, after FSDP's own final callback (queued earlier, so run earlier).
                torch.autograd.Variable._execution_engine.queue_callback(self._on_backward_end(name))

        return hook

    def _on_backward_end(self, name: str) -> Callable:
        def hook(*_):
            self._event("backward_end", name)
            if name in self._active_modules:
                self._active_modules.remove(name)

        return hook


def _unwrap(model: nn.Module) -> nn.Module:
    return getattr(model, "module", model)  # DDP keeps the model in `.module`


def _tracked_units(model: nn.Module) -> dict[str, nn.Module]:
    """The root and each block: the units FSDP shards, named as FSDP names them."""
    inner = _unwrap(model)
    units = {ROOT: inner}
    for index, block in enumerate(inner.blocks):
        units[f"blocks.{index}"] = block
    return units


def _unit_of(param_name: str, units: dict[str, nn.Module]) -> str:
    matches = [u for u in units if u != ROOT and param_name.startswith(u + ".")]
    return max(matches, key=len) if matches else ROOT


def _calling_fsdp_group() -> tuple[Any, bool]:
    """The FSDP parameter group issuing the current collective, read from the Python stack."""
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup
    except ImportError:  # a torch without FSDP2: nothing to find
        return None, False
    frame = sys._getframe(2)
    group = None
    prefetch = False
    while frame is not None:
        code = frame.f_code
        # Only FSDPParamGroup's own methods can hold it as `self`; reading f_locals elsewhere is slow.
        if group is None and code.co_filename.endswith("_fsdp_param_group.py") and "self" in code.co_varnames:
            candidate = frame.f_locals.get("self")
            if isinstance(candidate, FSDPParamGroup):
                group = candidate
        if code.co_name in ("_prefetch_unshard", "_backward_prefetch"):
            prefetch = True
        frame = frame.f_back
    return group, prefetch
