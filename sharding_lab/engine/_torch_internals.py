"""Every private torch internal the engine uses, reached from here and nowhere else.

The trackers, FSDP2's explicit prefetch control, DDP's mixed precision and the simulation's fake
process group all rest on names torch does not promise to keep. Each one is fetched by an accessor
below; if a torch release renames or drops it, the accessor raises `TorchInternalMissing`, naming
the torch version and the feature lost, instead of a lab quietly reporting "NOT ...". Importing this
module checks the torch version against the range the project has run on.
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from sharding_lab import torch_versions


class TorchInternalMissing(RuntimeError):
    """A private torch name the engine needs is not in this torch."""


def torch_version() -> tuple[int, int]:
    """(major, minor) of this torch; a build string that does not read as one counts as new."""
    return torch_versions.minor(torch.__version__) or (99, 0)


def _tested_on() -> str:
    return ", ".join(build for build, _ in torch_versions.RUN_ON)


# The parent checked the installed torch before starting ranks; a rank checks the torch it imported.
if (_warning := torch_versions.check(torch.__version__)) is not None:
    print(f"sharding_lab: {_warning}", file=sys.stderr)


def _missing(what: str, feature: str, error: Exception) -> TorchInternalMissing:
    return TorchInternalMissing(
        f"torch {torch.__version__} has no {what} ({type(error).__name__}: {error}); "
        f"without it {feature} cannot work. Run on torch {_tested_on()}."
    )


def _load(module: str, name: str, feature: str) -> Any:
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as error:
        raise _missing(f"{module}.{name}", feature, error) from error


def _attribute(obj: Any, name: str, feature: str) -> Any:
    try:
        return getattr(obj, name)
    except AttributeError as error:
        raise _missing(f"{type(obj).__name__}.{name}", feature, error) from error


# --- generic machinery: dispatch modes, pytrees, autograd callbacks ---------------------------------------


def dispatch_mode_class() -> type:
    """torch.utils._python_dispatch.TorchDispatchMode: sees every op (the reference comm tracker)."""
    return _load("torch.utils._python_dispatch", "TorchDispatchMode", "recording collectives by dispatch")


def tree_flatten(obj: Any) -> tuple[list[Any], Any]:
    """torch.utils._pytree.tree_flatten: the tensors inside nested arguments."""
    return _load("torch.utils._pytree", "tree_flatten", "finding tensors in a collective's arguments")(obj)


def op_name(func: Any) -> str:
    """A dispatched op's schema name, e.g. 'c10d::allreduce_'."""
    return _attribute(func, "_schema", "naming dispatched collectives").name


def queue_autograd_callback(callback: Callable[[], None]) -> None:
    """Run `callback` when the current backward pass ends (the root module's backward_end event)."""
    engine = _attribute(torch.autograd.Variable, "_execution_engine", "the end-of-backward timeline event")
    _attribute(engine, "queue_callback", "the end-of-backward timeline event")(callback)


# --- FSDP2 ---------------------------------------------------------------------------------------------------

_PREFETCH = "FSDP2's prefetch control and collective attribution"
# Where FSDP2 issues its all-gathers: the parameter group's methods, in this file.
FSDP_PARAM_GROUP_FILE = "_fsdp_param_group.py"
FSDP_PREFETCH_METHODS: tuple[str, ...] = ("_prefetch_unshard", "_backward_prefetch")


def fsdp_param_group_class() -> type:
    """FSDP2's FSDPParamGroup: the unit whose all-gather or reduce-scatter is running."""
    return _load("torch.distributed.fsdp._fully_shard._fsdp_param_group", "FSDPParamGroup", _PREFETCH)


def fsdp_group_module_name(group: Any) -> str:
    """The qualified name of the module a parameter group belongs to ('' for the root)."""
    return _attribute(group, "_module_fqn", _PREFETCH) or ""


def _fsdp_param_groups(state: Any) -> list[Any]:
    """A module's parameter groups: a list from torch 2.13 on; one group, or None, before (2.11)."""
    if hasattr(state, "_fsdp_param_groups"):
        return list(state._fsdp_param_groups)
    group = _attribute(state, "_fsdp_param_group", _PREFETCH)
    return [] if group is None else [group]


def disable_implicit_backward_prefetch(fsdp_module: Any) -> None:
    """Switch off FSDP2's default backward prefetch for one module (an empty explicit list keeps it)."""
    state = _attribute(fsdp_module, "_get_fsdp_state", _PREFETCH)()
    for group in _fsdp_param_groups(state):
        _attribute(group, "_backward_prefetch", _PREFETCH)
        group._backward_prefetch = lambda: None  # an instance attribute shadows the method


# --- DDP -------------------------------------------------------------------------------------------------------


def ddp_mixed_precision(param_dtype: torch.dtype, reduce_dtype: torch.dtype) -> Any:
    """DDP's (private) mixed precision config: low-precision copies for compute, reduce in `reduce_dtype`."""
    config = _load("torch.nn.parallel.distributed", "_MixedPrecision", "DDP with mixed precision")
    return config(param_dtype=param_dtype, reduce_dtype=reduce_dtype)


def ddp_comm_hooks(model: Any) -> list[Callable]:
    """The comm hooks already registered on a DDP model."""
    return [hook for hook, _state in _attribute(model, "_comm_hooks", "recording DDP's all-reduce")]


# --- the memory trackers (torch.distributed._tools) ------------------------------------------------------------

_TRACKING = "memory tracking by category"


def mem_tracker_class() -> type:
    return _load("torch.distributed._tools.mem_tracker", "MemTracker", _TRACKING)


def fsdp_mem_tracker_class() -> type:
    return _load("torch.distributed._tools.fsdp2_mem_tracker", "FSDPMemTracker", _TRACKING)


def fsdp_ref_types() -> Any:
    """FSDPMemTracker's category enum (_FSDPRefType): sharded and unsharded params, all-gather buffers, ..."""
    return _load("torch.distributed._tools.fsdp2_mem_tracker", "_FSDPRefType", _TRACKING)


def tracker_current_snapshot(tracker: Any) -> dict:
    """The tracker's live {device: {category: bytes}}, updated on every allocation."""
    return _attribute(tracker, "_curr_mem_snap", _TRACKING)


# DTensor derives an op's output shape by running the op on fake tensors it makes on the spot
# (ShardingPropagator._propagate_tensor_meta_non_cached). A tracker's dispatch mode sees those and
# counts them as memory, though they have no storage. When that happens depends on DTensor's caches:
# on torch 2.11, Adam's ops miss them in the first tracked step of a process (their Python scalars,
# such as the step size, change each step), so the first configuration measured in a process gained
# 32-41 KB of "optimizer" memory on `tiny` that a second did not, and the simulation's 3- and 4-block
# runs differed. Tensors made inside that method are never tracked.
_SCRATCH = "leaving DTensor's shape-propagation scratch out of the memory figures"
_scratch_depth = 0  # > 0 while DTensor propagates an op's tensor metadata
_scratch_patches = 0  # trackers active with the marking method in place


def _sharding_propagator() -> type | None:
    """DTensor's ShardingPropagator if it has the method to mark, else None (nothing to leave out)."""
    try:
        propagator = importlib.import_module("torch.distributed.tensor._sharding_prop").ShardingPropagator
    except (ImportError, AttributeError):
        return None
    return propagator if "_propagate_tensor_meta_non_cached" in vars(propagator) else None


def _mark_scratch(on: bool) -> None:
    global _scratch_patches
    propagator = _sharding_propagator()
    if propagator is None:
        return
    if on:
        _scratch_patches += 1
        if _scratch_patches == 1:
            original = vars(propagator)["_propagate_tensor_meta_non_cached"]

            @functools.wraps(original)
            def marked(self: Any, *args: Any, **kwargs: Any) -> Any:
                global _scratch_depth
                _scratch_depth += 1
                try:
                    return original(self, *args, **kwargs)
                finally:
                    _scratch_depth -= 1

            marked.__wrapped_original__ = original  # type: ignore[attr-defined]
            propagator._propagate_tensor_meta_non_cached = marked
    else:
        _scratch_patches -= 1
        if _scratch_patches == 0:
            propagator._propagate_tensor_meta_non_cached = vars(propagator)[
                "_propagate_tensor_meta_non_cached"].__wrapped_original__


def _ignoring_propagation_scratch(tracker_class: type) -> type:
    """A subclass of a torch tracker that does not track DTensor's shape-propagation scratch."""
    _attribute(tracker_class, "_track", _SCRATCH)

    class IgnoresPropagationScratch(tracker_class):
        def __enter__(self) -> Any:
            _mark_scratch(True)
            try:
                return super().__enter__()
            except BaseException:
                _mark_scratch(False)
                raise

        def __exit__(self, *args: Any) -> Any:
            try:
                return super().__exit__(*args)
            finally:
                _mark_scratch(False)

        def _track(self, reftype: Any, t: torch.Tensor) -> None:
            if _scratch_depth == 0:
                super()._track(reftype, t)

    return IgnoresPropagationScratch


# FSDPMemTracker wraps each FSDPParamGroup.post_backward to file the group's unsharded gradients first,
# in a loop whose variable then holds the last parameter's unsharded gradient through the whole
# post-backward: past FSDP2's reduce-scatter copy-in, which frees the others. On two or more shards FSDP2
# holds that one gradient itself until its reduce returns (a loop variable in foreach_reduce, which the
# planner counts). On one it does not, so a tracked one-GPU step held, and counted, a gradient an
# untracked one had freed (the root's last parameter's: lm_head's V x C untied), beside a reduce output
# as big as the whole unit: the simulation's peak was that much above the step's own. The same wrapper,
# holding no gradient:
_POST_BACKWARD = "counting a post-backward without holding a gradient FSDP2 freed"


def _holding_no_gradient(tracker_class: type) -> type:
    """A subclass of FSDPMemTracker whose post-backward wrapper keeps no reference to a gradient."""
    for name in ("_fsdp_param_group_post_backward", "_update_and_maybe_create_winfos", "get_tracker_snapshot"):
        _attribute(tracker_class, name, _POST_BACKWARD)
    module = "torch.distributed._tools.fsdp2_mem_tracker"
    ref_types, mod_states, states = (_load(module, name, _POST_BACKWARD)
                                     for name in ("_FSDPRefType", "_FSDPModState", "_FSDPState"))

    class HoldsNoGradient(tracker_class):
        def _fsdp_param_group_post_backward(self, fsdp_mod: Any, post_backward: Callable) -> Callable:
            def file_grads(attribute: str, ref_type: Any, **options: Any) -> None:
                if group := fsdp_mod._get_fsdp_state()._fsdp_param_group:
                    for fsdp_param in group.fsdp_params:
                        if (grad := getattr(fsdp_param, attribute).grad) is not None:
                            self._update_and_maybe_create_winfos(grad, ref_type, **options)

            @functools.wraps(post_backward)
            def tracked(*args: Any, **kwargs: Any) -> None:
                file_grads("_unsharded_param", ref_types.UNSHARDED_GRAD, update_existing=True)
                snapshots = self.memory_tracking[fsdp_mod].snapshots
                snapshots.setdefault(mod_states.BEF_POST_BW, []).append(self.get_tracker_snapshot())
                self._fsdp_state = states.POST_BW
                post_backward(*args, **kwargs)
                file_grads("sharded_param", ref_types.SHARDED_GRAD)
                snapshots.setdefault(mod_states.AFT_POST_BW, []).append(self.get_tracker_snapshot())

            return tracked

    return HoldsNoGradient


# FSDPMemTracker files an all-gather's output under "All Gather" only while it thinks a parameter group's
# own pre-forward or pre-backward hook is running. FSDP2 issues an explicit backward prefetch
# (set_modules_to_backward_prefetch) from FSDPState._pre_backward after the group's pre_backward has
# returned, so that block's all-gather buffer was counted as a backward temporary. In backward every
# all-gather is an FSDP unshard: it is filed as one.
_PREFETCH_LABEL = "filing an explicit backward prefetch's all-gather buffer as one"


def _labelling_backward_prefetch(tracker_class: type) -> type:
    """A subclass of FSDPMemTracker that files every all-gather output in backward as an all-gather buffer
    (another tracker, DDP's MemTracker, is only kept clear of DTensor's scratch)."""
    if not issubclass(tracker_class, fsdp_mem_tracker_class()):
        return _ignoring_propagation_scratch(tracker_class)
    module = "torch.distributed._tools.fsdp2_mem_tracker"
    states = _load(module, "_FSDPState", _PREFETCH_LABEL)
    all_gather = _attribute(torch.ops.c10d, "_allgather_base_", _PREFETCH_LABEL).default

    class LabelsBackwardPrefetch(_holding_no_gradient(_ignoring_propagation_scratch(tracker_class))):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if func is not all_gather or _attribute(self, "_fsdp_state", _PREFETCH_LABEL) is not states.BW:
                return super().__torch_dispatch__(func, types, args, kwargs)
            self._fsdp_state = states.PRE_BW
            try:
                return super().__torch_dispatch__(func, types, args, kwargs)
            finally:
                self._fsdp_state = states.BW

    return LabelsBackwardPrefetch


def with_category_peaks(
    tracker_class: type, joint: tuple[str, ...] = (), window: Callable[[set[str]], bool] | None = None,
    group: Callable[[str], str | None] | None = None,
) -> type:
    """A subclass of a torch tracker that also keeps each category's own maximum, per device, in
    `category_peaks`; each group's maximum (the sum of the tracker categories `group` maps to it, at
    one moment) in `group_peaks`; the maximum of the `joint` categories' sum (tracker category names)
    in `joint_peaks`, and that maximum only while `window(names of the open modules)` holds in
    `window_joint_peaks`: the snapshot update and the module tracker are private, so the hooks into
    them live here. Like every tracker made here, it leaves DTensor's shape-propagation scratch out."""
    _attribute(tracker_class, "_update_snap", _TRACKING)

    class KeepsCategoryPeaks(_labelling_backward_prefetch(tracker_class)):
        def _update_snap(self, *args: Any, **kwargs: Any) -> None:
            super()._update_snap(*args, **kwargs)
            peaks = self.__dict__.setdefault("category_peaks", {})
            group_peaks = self.__dict__.setdefault("group_peaks", {})
            joint_peaks = self.__dict__.setdefault("joint_peaks", {})
            window_peaks = self.__dict__.setdefault("window_joint_peaks", {})
            in_window = window is not None and window(_attribute(self, "_mod_tracker", _TRACKING).parents)
            for device, snapshot in tracker_current_snapshot(self).items():
                device_peaks = peaks.setdefault(device, {})
                together, grouped = 0, {}
                for key, value in snapshot.items():
                    if value > device_peaks.get(key, 0):
                        device_peaks[key] = value
                    name = getattr(key, "value", key)
                    if name in joint:
                        together += value
                    if group is not None and (ours := group(name)) is not None:
                        grouped[ours] = grouped.get(ours, 0) + value
                device_group_peaks = group_peaks.setdefault(device, {})
                for ours, value in grouped.items():
                    if value > device_group_peaks.get(ours, 0):
                        device_group_peaks[ours] = value
                if together > joint_peaks.get(device, 0):
                    joint_peaks[device] = together
                if in_window and together > window_peaks.get(device, 0):
                    window_peaks[device] = together

    KeepsCategoryPeaks.__name__ = f"{tracker_class.__name__}WithCategoryPeaks"
    return KeepsCategoryPeaks


def mod_tracker_multi_grad_hook() -> Callable:
    """The `register_multi_grad_hook` ModTracker calls, looked up in its module's namespace."""
    return _load("torch.distributed._tools.mod_tracker", "register_multi_grad_hook", _TRACKING)


@contextmanager
def multi_grad_hooks_removed_on_exit() -> Iterator[None]:
    """Remove, on exit, every multi-grad hook the trackers' ModTracker registered inside.

    ModTracker registers them on module inputs and outputs and never removes them. A hook whose grads
    do not all arrive stays on its autograd node, and the node and the hook's closure hold each other
    through C++, where `gc` cannot see the cycle; the closure reaches the tracker and so the model and
    optimizer, which then outlive their configuration (and, on CUDA, keep their memory).
    """
    module = importlib.import_module("torch.distributed._tools.mod_tracker")
    original = mod_tracker_multi_grad_hook()
    handles = []

    def recording(*args: Any, **kwargs: Any) -> Any:
        handle = original(*args, **kwargs)
        handles.append(handle)
        return handle

    module.register_multi_grad_hook = recording
    try:
        yield
    finally:
        module.register_multi_grad_hook = original
        for handle in handles:
            handle.remove()


def observing_each_op(tracker_class: type) -> type:
    """A subclass of FSDPMemTracker that, in place of its own peak bookkeeping, calls
    `tracker.observe(snapshot, open_modules, backward, in_optimizer)` after every op it tracks: the
    current {device: {category: bytes}}, the names of the modules the module tracker has open, whether
    autograd's backward is running and whether `optimizer.step()` is. The simulation keeps its own
    peaks (and, to extrapolate, every event) from these; the tracker's own peak figures stay unset."""
    feature = "the simulation's view of each op"
    _attribute(tracker_class, "_update_peak_stats", feature)

    class ObservingEachOp(_labelling_backward_prefetch(tracker_class)):
        def _update_peak_stats(self, peak_state: Any) -> None:
            modules = _attribute(self, "_mod_tracker", feature)
            self.observe(
                _attribute(self, "_curr_mem_snap", feature),
                modules.parents,
                modules.is_bw,
                _attribute(self, "_in_opt", feature),
            )

    return ObservingEachOp


# --- the simulation --------------------------------------------------------------------------------------------


def fake_tensor_mode(**kwargs: Any) -> Any:
    """torch._subclasses.FakeTensorMode: tensors with shapes and dtypes but no storage."""
    return _load("torch._subclasses.fake_tensor", "FakeTensorMode", "the FakeTensorMode simulation")(**kwargs)


def fsdp_lazy_init(root: Any) -> None:
    """Run FSDP2's lazy initialization of a root and every module under it, as its first forward would."""
    feature = "the simulation's warm-up"
    state = _attribute(root, "_get_fsdp_state", feature)()
    _attribute(state, "_lazy_init", feature)()


def fake_store() -> Any:
    """The store for torch's `fake` process group (importing its module registers the backend)."""
    return _load("torch.testing._internal.distributed.fake_pg", "FakeStore", "the fake process group")()


# --- CUDA ----------------------------------------------------------------------------------------------------


def clear_cublas_workspaces() -> None:
    """Free the cuBLAS workspaces torch keeps in the caching allocator, one per handle and stream, from the
    first matmul on. They are torch's, not a configuration's, and would read as a leak: PyTorch's own CUDA
    leak check (CudaMemoryLeakCheck in torch.testing._internal.common_utils) clears them before comparing
    torch.cuda.memory_allocated for the same reason. CUDA builds only."""
    _load("torch._C", "_cuda_clearCublasWorkspaces", "telling a configuration's CUDA memory from torch's own")()



_LEAK_FEATURE = "naming where a configuration's leaked CUDA memory was allocated"


def record_cuda_allocation_stacks() -> None:
    """Keep each live CUDA block's allocating Python stack (torch.cuda.memory._record_memory_history), so a
    configuration that leaves memory behind can say where it was allocated. Python stacks only: cheap
    enough to leave on for a whole run."""
    record = _load("torch.cuda.memory", "_record_memory_history", _LEAK_FEATURE)
    record("state", context="alloc", stacks="python")


def cuda_live_blocks() -> dict[tuple[int, int], list[str]]:
    """Every allocated CUDA block as (address, size) -> its allocating stack, innermost frame first (empty
    where recording was off when it was allocated)."""
    snapshot = _load("torch.cuda.memory", "_snapshot", _LEAK_FEATURE)()
    blocks: dict[tuple[int, int], list[str]] = {}
    for segment in snapshot["segments"]:
        address = segment["address"]
        for block in segment["blocks"]:
            if block["state"] == "active_allocated":
                frames = block.get("frames") or []
                blocks[(address, block["size"])] = [f"{f['filename']}:{f['line']} {f['name']}" for f in frames]
            address += block["size"]
    return blocks


# Every accessor that fetches a name, for a check of this torch (tests call each; clear_cublas_workspaces
# exists in CUDA builds only and has a test of its own).
ACCESSORS: dict[str, Callable[[], Any]] = {
    "TorchDispatchMode": dispatch_mode_class,
    "tree_flatten": lambda: tree_flatten([]),
    "FSDPParamGroup": fsdp_param_group_class,
    "DDP _MixedPrecision": lambda: ddp_mixed_precision(torch.bfloat16, torch.float32),
    "MemTracker": mem_tracker_class,
    "FSDPMemTracker": fsdp_mem_tracker_class,
    "_FSDPRefType": fsdp_ref_types,
    "MemTracker with category peaks": lambda: with_category_peaks(mem_tracker_class()),
    "FSDPMemTracker with category peaks": lambda: with_category_peaks(fsdp_mem_tracker_class()),
    "FSDPMemTracker observing each op": lambda: observing_each_op(fsdp_mem_tracker_class()),
    "ModTracker's register_multi_grad_hook": mod_tracker_multi_grad_hook,
    "FakeTensorMode": lambda: fake_tensor_mode(),
    "FakeStore": fake_store,
    # Resolved, not called: recording needs a GPU.
    "CUDA allocation history": lambda: _load("torch.cuda.memory", "_record_memory_history", _LEAK_FEATURE),
    "CUDA allocator snapshot": lambda: _load("torch.cuda.memory", "_snapshot", _LEAK_FEATURE),
    "autograd execution engine": lambda: _attribute(
        _attribute(torch.autograd.Variable, "_execution_engine", "end of backward"), "queue_callback", "end of backward"
    ),
}
