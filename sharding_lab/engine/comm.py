"""Record every collective a training step issues, in order, beside module forward/backward events.

`CommTracker` intercepts the collectives themselves, nothing else, so a tracked step costs about what
a plain one does. While it is active it swaps in recording wrappers for the `torch.distributed`
functions the strategies call (FSDP2's all-gathers and reduce-scatters, ZeroRedundancyOptimizer's
broadcasts, anyone's all-reduce), in `torch.distributed` and in `distributed_c10d`, whose deprecated
aliases (`all_gather_into_tensor`, ...) call through its own globals; it puts the originals back on
exit. DDP's all-reduce comes from its C++ reducer, so the tracker gives a DDP model the default
all-reduce hook (`allreduce_hook`: the same division and all-reduce, now through `dist.all_reduce`).
With `wait_for_gloo` (a memory tracker beside it), each wrapper also waits after a blocking gloo collective
for gloo's worker threads to let go of its tensors (`GlooWorkers`), so the memory tracker sees them freed
where the program frees them.
`method="dispatch"` is the reference: a TorchDispatchMode that sees every `c10d` op, collectives
included, but costs a Python call on every op of the step (1.2-1.5x a `tiny` step). It is used where
the wrappers cannot see everything (a DDP model that already has a comm hook, or broadcasts buffers).

For each collective it records:

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

import functools
import inspect
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import CodeType
from typing import Any, Literal

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from sharding_lab.analytic import ring_wire_bytes
from sharding_lab.engine import _torch_internals as internals
from sharding_lab.measurement import ROOT
from sharding_lab.proc_stat import own_threads, read_stat
from sharding_lab.strategies import OPS, PHASES

_FSDPParamGroup = internals.fsdp_param_group_class()
tree_flatten = internals.tree_flatten

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
_IS_COLLECTIVE: dict = {}  # op overload -> whether it is a c10d collective


def _leaf(*names: str) -> str:
    """The first of `names` this torch defines. torch 2.13 renamed `all_gather_into_tensor` and
    `reduce_scatter_tensor` to `*_single` and left the old names as aliases calling the new; before
    it (2.11 on our GPU machine) the old names are the functions FSDP2 calls."""
    return next(name for name in names if hasattr(c10d, name))


# torch.distributed function -> the collective it is, and the names of its first two parameters: the
# first holds what the c10d op takes first (its dtype and owner are recorded), the second the other
# side of a gather or scatter. Only these "leaf" functions are wrapped: the deprecated aliases and
# `broadcast_object_list` call them, so each collective is recorded once.
_WRAPPED: dict[str, tuple[str, tuple[str, ...]]] = {
    _leaf("all_gather_single", "all_gather_into_tensor"): ("all_gather", ("output_tensor", "input_tensor")),
    "all_gather": ("all_gather", ("tensor_list", "tensor")),
    _leaf("reduce_scatter_single", "reduce_scatter_tensor"): ("reduce_scatter", ("output", "input")),
    "reduce_scatter": ("reduce_scatter", ("output", "input_list")),
    "all_reduce": ("all_reduce", ("tensor",)),
    "broadcast": ("broadcast", ("tensor",)),
}
Method = Literal["wrap", "dispatch"]
# Code object -> (may hold an FSDPParamGroup as `self`, issues prefetches): the stack walk behind each
# collective's attribution then costs a dict lookup per frame.
_FRAME_ROLES: dict[CodeType, tuple[bool, bool]] = {}


class GlooWorkers:
    """gloo runs each collective on a worker thread, which wakes the caller first and lets go of the
    collective's tensors after (its arguments and gloo's own copies, such as a reduce-scatter's): on a
    loaded machine, a scheduler's time slice later. A buffer the caller has dropped is then freed, and seen
    freed by the memory tracker, at a moment the scheduler picks: an all-gather buffer still alive beside
    the next unit's, or a reduce-scatter's copy counted as persistent after the optimizer step (seen with
    the workers starved of CPU). `wait_until_idle` after a blocking collective waits, up to `timeout_s`,
    until every worker of this process is asleep, back waiting for work, so a step's memory follows its
    program order alone. Linux only (it reads /proc); elsewhere it returns at once. NCCL is left alone:
    its watchdog's hold on a collective's tensors is memory a GPU run really holds."""

    THREAD_NAME = "pt_gloo_runloop"  # as torch names them (2.11 and 2.13)

    def __init__(self, timeout_s: float = 1.0):
        self.timeout_s = timeout_s
        self._tids: list[int] | None = None  # found on the first collective: gloo starts them with its group

    def wait_until_idle(self) -> None:
        if self._tids is None:
            self._tids = own_threads(self.THREAD_NAME)
        deadline = None
        while not all(_asleep(tid) for tid in self._tids):
            now = time.monotonic()
            deadline = deadline or now + self.timeout_s
            if now > deadline:
                return
            time.sleep(0.0001)  # off the CPU and the GIL, so the worker can run


def _asleep(tid: int) -> bool:
    stat = read_stat(tid)
    return stat is None or stat.state in ("S", "D")  # None: gone


def _tensor_bytes(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    leaves, _ = tree_flatten(obj)
    return sum(t.numel() * t.element_size() for t in leaves if isinstance(t, torch.Tensor))


def _first_leaf(obj: Any) -> Any:
    """The first pytree leaf of `obj` (the tensor a collective's dtype and owner are read from)."""
    while isinstance(obj, (list, tuple)) and obj:
        obj = obj[0]
    return obj


def _logical_bytes(op: str, functional: bool, args: tuple, world_size: int) -> int:
    if functional:
        local = _tensor_bytes(args[0])
        return local * world_size if op == "all_gather" else local
    if op in ("all_gather", "reduce_scatter"):
        # (output, input, ...): the full buffer is the larger side, the shard the smaller.
        return max(_tensor_bytes(args[0]), _tensor_bytes(args[1]))
    return _tensor_bytes(args[0])


class CommTracker:
    """Use as `with CommTracker(model, world_size) as tracker:` around exactly the steps to record.

    `method="dispatch"` records through the reference TorchDispatchMode instead of the wrappers.
    """

    def __init__(self, model: nn.Module, world_size: int, method: Method = "wrap", mesh: Any = None,
                 wait_for_gloo: bool = False):
        assert method in ("wrap", "dispatch"), method
        self.world_size = world_size
        # Process group -> (its size, the mesh dimension it is): HSDP's collectives run on two groups.
        self._group_dims: dict[Any, tuple[int, str]] = {}
        for name in (mesh.mesh_dim_names or ()) if mesh is not None else ():
            group = mesh.get_group(name)
            self._group_dims[group] = (dist.get_world_size(group), name)
        self.collectives: list[dict] = []
        self.timeline: list[dict] = []
        if method == "wrap" and not _route_ddp_all_reduce_through_python(model):
            method = "dispatch"  # some collective would bypass the wrappers: see every op instead
        self.method: Method = method
        self._phase: str | None = None
        self._recording = False
        self._active_modules: list[str] = []  # started and not yet ended, innermost last
        self._model = model
        self._param_owner: dict[int, str] | None = None  # made at the first broadcast: only ZeRO needs it
        self._units = _tracked_units(model)
        self._handles = [h for name, module in self._units.items() for h in self._hook(name, module)]
        self._originals: list[tuple[Any, str, Callable]] = []
        self._mode: _DispatchInterceptor | None = None
        # For a memory tracker beside it: each blocking gloo collective returns once gloo has let go of its
        # tensors (GlooWorkers). Off, comm tracking costs no wait.
        self._gloo_workers = GlooWorkers() if wait_for_gloo else None

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

    def __enter__(self) -> CommTracker:
        self._recording = True
        if self.method == "dispatch":
            self._mode = _DispatchInterceptor(self)
            self._mode.__enter__()
        else:
            self._wrap_collectives()
        return self

    def __exit__(self, *exc) -> None:
        self._recording = False
        if self._mode is not None:
            self._mode.__exit__(*exc)
            self._mode = None
        # Put back exactly what was there on entry (another tool's wrapper, say), last wrapped first.
        while self._originals:
            namespace, name, original = self._originals.pop()
            setattr(namespace, name, original)

    # -- results --------------------------------------------------------------------------------------

    def summary(self) -> dict:
        """The `comm` section of a measurement (plain JSON: it crosses from the rank to the parent)."""
        return {"collectives": self.collectives, "timeline": self.timeline}

    # -- interception -----------------------------------------------------------------------------------

    def _wrap_collectives(self) -> None:
        # torch.distributed re-exports distributed_c10d's functions: callers reach them through
        # either namespace (FSDP2 and ZeRO through `dist.`, the deprecated aliases through c10d's globals).
        for namespace in (dist, c10d):
            for name, (op, params) in _WRAPPED.items():
                original = getattr(namespace, name, None)
                if original is not None:
                    self._originals.append((namespace, name, original))
                    setattr(namespace, name, self._recording_wrapper(original, op, params))

    def _recording_wrapper(self, original: Callable, op: str, params: tuple[str, ...]) -> Callable:
        gathers_or_scatters = op in ("all_gather", "reduce_scatter")
        signature = inspect.signature(original)

        @functools.wraps(original)
        def collective(*args: Any, **kwargs: Any) -> Any:
            out = original(*args, **kwargs)
            group = kwargs["group"] if "group" in kwargs else signature.bind_partial(*args).arguments.get("group")
            # `out is None`: it blocked until done (an async_op's tensors are its work's until waited on).
            if self._gloo_workers is not None and out is None and dist.get_backend(group) == "gloo":
                self._gloo_workers.wait_until_idle()
            first = args[0] if args else kwargs.get(params[0])
            size = _tensor_bytes(first)
            if gathers_or_scatters:
                # The full buffer is the larger side (the output of a gather, the input of a scatter).
                size = max(size, _tensor_bytes(args[1] if len(args) > 1 else kwargs.get(params[1])))
            self._record(op, size, _first_leaf(first), group)
            return out

        return collective

    def _record_dispatched(self, func, args: tuple) -> None:
        name = internals.op_name(func).split("::", 1)[1]
        if name in _NOT_COMMUNICATION:
            return
        op = _COLLECTIVES.get(name, name)
        functional = func.namespace == "_c10d_functional"
        size = _logical_bytes(op, functional, args, self.world_size) if op in OPS else _tensor_bytes(args)
        self._record(op, size, _first_leaf(args[0]) if args else None)

    def _record(self, op: str, size: int, first: Any, group: Any = None) -> None:
        module, prefetch = self._attribute(op, first)
        group_size, mesh_dim = self._group_dims.get(group, (self.world_size, None))
        if mesh_dim is None and len(self._group_dims) == 1:
            (group_size, mesh_dim), = self._group_dims.values()  # one dimension: every collective runs on it
        event = {
            "seq": len(self.collectives),
            "op": op,
            "phase": self._phase,
            "module": module,
            "prefetch": prefetch,
            "bytes": size,
            "wire_bytes_derived": ring_wire_bytes(op, size, group_size),
            "dtype": str(first.dtype).removeprefix("torch.") if isinstance(first, torch.Tensor) else None,
            "group_size": group_size,
            "mesh_dim": mesh_dim,
        }
        self.collectives.append(event)
        self.timeline.append({"event": "collective", **event})

    def _attribute(self, op: str, first: Any) -> tuple[str | None, bool]:
        group, prefetch = _calling_fsdp_group()
        if group is not None:
            return internals.fsdp_group_module_name(group) or ROOT, prefetch
        if op == "broadcast" and isinstance(first, torch.Tensor):
            if self._param_owner is None:
                self._param_owner = {
                    p.data_ptr(): _unit_of(name, self._units) for name, p in _unwrap(self._model).named_parameters()
                }
            owner = self._param_owner.get(first.data_ptr())
            if owner:
                return owner, False
        return (self._active_modules[-1] if self._active_modules else None), False

    # -- module events ----------------------------------------------------------------------------------

    def _event(self, kind: str, module: str) -> None:
        if not self._recording:
            return
        self.timeline.append({"event": kind, "module": module, "phase": self._phase})

    def _hook(self, name: str, module: nn.Module) -> list:
        def watching() -> bool:
            return self._recording and torch.is_grad_enabled()

        def mark_output(_module, _args, output):
            # Before FSDP's post-forward registers its pre-backward hook on this tensor, so the next
            # module's backward_end (queued on it later) is emitted before FSDP gathers for this one.
            if watching() and (t := _first_grad_tensor(output)) is not None:
                self._arrival_queue(t)

        def capture_inputs(_module, args):
            # Before FSDP's pre-forward wraps the input: its gradient arrives after FSDP's post-backward.
            if watching() and (t := _first_grad_tensor(args)) is not None:
                self._arrival_queue(t).append(name)

        def forward_start(_module, _args):
            self._active_modules.append(name)
            self._event("forward_start", name)

        def forward_end(_module, _args, output):
            self._event("forward_end", name)
            if name in self._active_modules:
                self._active_modules.remove(name)
            # After FSDP's pre-backward hook on the output: backward_start follows its all-gather.
            if watching() and (t := _first_grad_tensor(output)) is not None:
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
                internals.queue_autograd_callback(self._on_backward_end(name))

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
    frame = sys._getframe(2)
    group = None
    prefetch = False
    while frame is not None:
        code = frame.f_code
        role = _FRAME_ROLES.get(code)
        if role is None:
            # Only FSDPParamGroup's own methods can hold it as `self`; reading f_locals elsewhere is slow.
            role = _FRAME_ROLES[code] = (
                code.co_filename.endswith(internals.FSDP_PARAM_GROUP_FILE) and "self" in code.co_varnames,
                code.co_name in internals.FSDP_PREFETCH_METHODS,
            )
        holds_group, prefetches = role
        if holds_group and group is None:
            candidate = frame.f_locals.get("self")
            if isinstance(candidate, _FSDPParamGroup):
                group = candidate
        prefetch = prefetch or prefetches
        frame = frame.f_back
    return group, prefetch


def _first_grad_tensor(obj: Any) -> torch.Tensor | None:
    """The first tensor in `obj` (pytree order) that requires grad; hooks call this on every forward."""
    if isinstance(obj, torch.Tensor):
        return obj if obj.requires_grad else None
    if type(obj) is tuple:  # a module's positional inputs: no pytree walk unless something is nested
        for item in obj:
            if isinstance(item, torch.Tensor):
                if item.requires_grad:
                    return item
            elif isinstance(item, (list, tuple, dict)):
                break
        else:
            return None
    leaves = tree_flatten(obj)[0]
    return next((t for t in leaves if isinstance(t, torch.Tensor) and t.requires_grad), None)


def synchronous_allreduce_hook(process_group, bucket):  # noqa: ANN001 - DDP rejects string annotations
    """DDP's average as `allreduce_hook` computes it, waited for and returned as a finished future: for
    torch's fake process group (a rank view), whose works carry no result for DDP to read."""
    tensor = bucket.buffer()
    tensor.div_(dist.get_world_size(process_group))
    dist.all_reduce(tensor, group=process_group)
    future = torch.futures.Future()
    future.set_result(tensor)
    return future


def _route_ddp_all_reduce_through_python(model: nn.Module) -> bool:
    """Give a DDP model the default all-reduce as a comm hook, so its all-reduce calls `dist.all_reduce`.

    `allreduce_hook` divides and all-reduces exactly as DDP's built-in path does. A comm hook cannot
    be removed, so it stays (one Python call per bucket). False where the wrappers would miss a
    collective: another comm hook already set, or buffers DDP broadcasts from C++ every forward.
    """
    if not isinstance(model, DistributedDataParallel):
        return True
    hooks = internals.ddp_comm_hooks(model)
    if hooks:
        return hooks in ([allreduce_hook], [synchronous_allreduce_hook])
    if model.broadcast_buffers and next(model.module.buffers(), None) is not None:
        return False
    model.register_comm_hook(model.process_group, allreduce_hook)
    return True


class _DispatchInterceptor(internals.dispatch_mode_class()):
    """The reference method: sees every op of the step and records the `c10d` collectives among them."""

    def __init__(self, tracker: CommTracker):
        super().__init__()
        self._tracker = tracker

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        # Every op in the step passes through here; `func.namespace` is slow, so remember the answer.
        is_collective = _IS_COLLECTIVE.get(func)
        if is_collective is None:
            is_collective = _IS_COLLECTIVE[func] = func.namespace in ("c10d", "_c10d_functional")
        if is_collective:
            self._tracker._record_dispatched(func, args)
        return out
