"""Simulate the step `measure` runs, for any configuration and any scale, on one CPU process, without
allocating it.

`simulate(config)` takes the `RunConfig` that `sharding_lab.engine.measure.measure` takes (zero2 or
zero3, any world size, HSDP's replicas, mixed precision, activation checkpointing, CPU offload,
gradient accumulation) and runs what measure runs: the same model, the same `parallelize`, the same
training step, but every tensor a FakeTensor (shapes and dtypes, no storage) and every collective
answered by torch's `fake` process group, with FSDPMemTracker counting the bytes each category
would occupy on rank 0. It returns a `Simulation`.

Fast by default. The blocks are identical, so a model of L blocks is simulated with 3 and with 4 and
its step worked out from those two, exactly (sharding_lab.engine.simulate_extrapolate proves it and
checks the structure it rests on; a test holds it byte-equal to simulating every block). When the
runs lack that structure the simulation simulates every block instead and its `method` says so.

Speed, against torchtitan's former estimation method (which this follows otherwise):
- the device mesh is built outside FakeTensorMode (inside it, mesh setup crawls);
- `parallelize` shards the model while it is still on the meta device, outside FakeTensorMode: FSDP2
  splits every parameter into N chunks, and 1024 FakeTensor chunks per parameter take ~50 s for a
  70B model where meta chunks take ~2 s. `to_empty` then materializes the shards as FakeTensors;
- the warm-up is not a whole step (`Warmup.STATES`): FSDP2's lazy initialization and one Adam step on
  zero gradients leave what a warm-up step leaves (FSDP initialized, Adam's state made, a step's
  first-time dispatch paths taken) without its forward and backward. A test holds the tracked step
  after it byte-equal to the one after a whole warm-up step (`Warmup.STEP`, as measure runs) for every
  engine option; it saves about a tenth of a 70B extrapolation (1.30 against 1.45 CPU s);
- the tracker keeps no per-module statistics: after every op it hands this module the bytes by
  category (`_torch_internals.observing_each_op`).
"""

from __future__ import annotations

import enum
import math
import re
import resource
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from sharding_lab.analytic import fsdp_padded_numel, model_states_bytes_per_rank
from sharding_lab.engine import _torch_internals as internals
from sharding_lab.engine import forked
from sharding_lab.engine import simulate_extrapolate as extrapolation
from sharding_lab.engine.measure import gradient_sync, training_batch
from sharding_lab.engine.model import GPT, config_for
from sharding_lab.engine.parallelize import data_parallel_mesh, parallelize
from sharding_lab.model_config import GPTConfig, parameter_shapes
from sharding_lab.run_config import RunConfig
from sharding_lab.strategies import Strategy

SIMULATED_RANK = 0  # rank 0 holds the largest shard of every parameter (torch.chunk puts the remainder last)
# torch.optim.Adam keeps a float32 scalar `step` tensor per parameter beside exp_avg and exp_avg_sq;
# the paper's 8 bytes per parameter do not count it.
ADAM_STEP_COUNTER_BYTES = 4
FULL, EXTRAPOLATED = "full", "extrapolated"
T = TypeVar("T")

# The tracker's categories, under the names the rest of sharding_lab uses, in the order of a Vector
# (sharding_lab.engine.simulate_extrapolate); the total comes last.
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
_TOTAL_KEY = "Total"
_REF_ORDER = tuple(CATEGORY_NAMES)
_ObservingTracker = internals.observing_each_op(internals.fsdp_mem_tracker_class())
_BLOCK_NAME = re.compile(r"(?:^|\.)blocks\.(\d+)$")


class Warmup(enum.Enum):
    """What runs before the tracked step."""

    STATES = "states"  # FSDP2's lazy init, then one Adam step on zero gradients: a step's leftovers, quickly
    STEP = "step"  # one whole training step, as measure's warm-up


@dataclass(frozen=True)
class Simulation:
    """Rank 0's bytes over the step `measure` would measure for `config`."""

    config: RunConfig
    num_params: int
    padded_num_params: int  # with FSDP2's padding of each parameter's dim 0 to a multiple of the shards
    peak_bytes: int
    peak_breakdown: dict[str, int]  # the peak moment by category: these add up to peak_bytes
    category_peaks: dict[str, int]  # each category's own maximum over the step (not at one moment)
    after_forward: dict[str, int]  # by category, after the (last micro-batch's) forward
    after_step: dict[str, int]  # by category, after optimizer.step(): every model state at once
    predicted_model_states: dict[str, int]  # analytic, FSDP padding and Adam's step counters included
    wall_s: float
    peak_rss_bytes: int  # this process's high-water mark, torch included
    method: str  # how: every block simulated, or extrapolated (and from what)
    extrapolated: bool = False
    notes: tuple[str, ...] = field(default=())  # why extrapolation was not used, when it was not

    @property
    def model_states(self) -> dict[str, int]:
        """Sharded parameters, gradients and optimizer state (Adam's step counters included) after the step."""
        parts = {name: self.after_step[name] for name in ("params", "grads", "optimizer")}
        return {**parts, "total": sum(parts.values())}

    @property
    def activations_after_forward(self) -> int:
        return self.after_forward["activations"]

    @property
    def model_states_match_prediction(self) -> bool:
        return all(self.model_states[k] == self.predicted_model_states[k] for k in ("params", "grads", "optimizer"))

    @property
    def seq_len(self) -> int:
        return self.config.seq_len or _model_config(self.config).block_size

    def to_json(self) -> dict:
        data = asdict(self)
        data["config"] = {
            "strategy": str(self.config.strategy),
            "world_size": self.config.world_size,
            "size": self.config.size,
            "model_overrides": dict(self.config.model_overrides),
            "batch_size": self.config.batch_size,
            "seq_len": self.seq_len,
            **self.config.changed_options(),
        }
        data["notes"] = list(self.notes)
        data["model_states"] = self.model_states
        data["activations_after_forward"] = self.activations_after_forward
        data["model_states_match_prediction"] = self.model_states_match_prediction
        return data


def simulate(config: RunConfig, *, method: str = EXTRAPOLATED, warmup: Warmup = Warmup.STATES) -> Simulation:
    """Simulate rank 0 of `config` (zero2 or zero3). `method`: EXTRAPOLATED (from 3 and 4 blocks,
    exact; every block when the model has 4 or fewer, or when the structure is missing) or FULL.
    `warmup`: what runs before the tracked step (the same bytes either way).

    Needs a process without a default process group (it starts and ends a fake one).
    """
    if not config.strategy.fully_sharded:
        raise ValueError(f"the simulation runs FSDP2 (zero2, zero3); {config.strategy} is not one")
    if config.steps_before_tracked < 1:
        # The first step creates Adam's state, and which temporaries that takes on fake tensors depends on
        # what ran before in the process (DTensor's dispatch takes a longer path the first time).
        raise ValueError("the simulation tracks a step after warm-up: warmup_steps must be at least 1")
    if method not in (FULL, EXTRAPOLATED):
        raise ValueError(f"method must be {FULL!r} or {EXTRAPOLATED!r}, got {method!r}")
    model_config = _model_config(config)  # RunConfig has held the sequence to its block_size
    if dist.is_initialized():
        raise RuntimeError("simulate starts its own fake process group; this process already has one")

    started = time.perf_counter()
    runs = (extrapolation.SMALLEST, extrapolation.SMALLEST + 1)
    memory, notes = None, []
    if method == EXTRAPOLATED and model_config.n_layer > runs[-1]:
        short = _timelines(config, model_config, runs, warmup)
        try:
            memory = extrapolation.extrapolate(*short, model_config.n_layer)
        except extrapolation.NotExtrapolable as error:
            notes.append(f"not extrapolated: {error}")
    elif method == EXTRAPOLATED:
        notes.append(f"{model_config.n_layer} blocks: simulating each is as fast as extrapolating")
    extrapolated = memory is not None
    if not extrapolated:
        memory = _in_fake_group(config, lambda mesh: _full_step(config, model_config, mesh, warmup))
    wall_s = time.perf_counter() - started

    shapes = [shape for _, shape in parameter_shapes(model_config)]
    num_params = sum(math.prod(s) for s in shapes)
    padded_num_params = fsdp_padded_numel(shapes, config.shards)
    # FSDP2 keeps fp32 sharded parameters, gradients and Adam state even with bf16 compute, and between
    # steps all three are sharded under zero2 as under zero3 (zero2 only keeps blocks gathered from
    # forward to backward): after the step, both hold ZeRO-3's model states.
    predicted = model_states_bytes_per_rank(
        num_params, config.shards, Strategy.ZERO3, padded_num_params=padded_num_params
    )
    predicted["optimizer_step_counters"] = ADAM_STEP_COUNTER_BYTES * len(shapes)
    predicted["optimizer"] += predicted["optimizer_step_counters"]
    predicted["total"] += predicted["optimizer_step_counters"]
    return Simulation(
        config=config,
        num_params=num_params,
        padded_num_params=padded_num_params,
        peak_bytes=memory.peak[-1],
        peak_breakdown=_named(memory.peak),
        category_peaks=_named(memory.category_peaks),
        after_forward=_named(memory.marks["after_forward"]),
        after_step=_named(memory.marks["after_step"]),
        predicted_model_states=predicted,
        wall_s=wall_s,
        peak_rss_bytes=_peak_rss_bytes(),
        method="FSDP2 under FakeTensorMode on the fake process group, FSDPMemTracker; " + (
            f"simulated with {runs[0]} and {runs[1]} blocks, extrapolated exactly to {model_config.n_layer} "
            "(the blocks are identical)" if extrapolated else f"every one of the {model_config.n_layer} blocks simulated"
        ),
        extrapolated=extrapolated,
        notes=tuple(notes),
    )


def _in_fake_group(config: RunConfig, work: Callable[[Any], T]) -> T:
    """`work(mesh)` inside a fake process group of the config's world size, ended afterwards.
    The fake backend answers every collective at once (fetching its store registers it)."""
    dist.init_process_group("fake", rank=SIMULATED_RANK, world_size=config.world_size, store=internals.fake_store())
    try:
        return work(data_parallel_mesh("cpu", config.world_size, config.options.replicas))
    finally:
        dist.destroy_process_group()


def _timelines(
    config: RunConfig, model_config: GPTConfig, runs: tuple[int, ...], warmup: Warmup
) -> list[extrapolation.Timeline]:
    """The short runs' timelines. The last runs in a forked copy of this process beside the others, when
    this process can fork safely: the pair then takes the longer run's time rather than the sum (on two
    cores, 70b at 1024 ranks: two runs of ~1.1 s each). Each run has its own warm-up, so its bytes do
    not depend on what ran before it (a test holds both ways byte-equal)."""
    global _fork_unusable

    def timeline(n_blocks: int) -> extrapolation.Timeline:
        return _in_fake_group(config, lambda mesh: _step_timeline(config, model_config, mesh, n_blocks, warmup))

    if not _can_fork():
        return [timeline(n) for n in runs]
    *here, there = runs

    def checked_timeline() -> extrapolation.Timeline:
        _check_autograd_runs()
        return timeline(there)

    child = forked.start(checked_timeline)
    try:
        ours = [timeline(n) for n in here]
    except BaseException:
        child.abandon()
        raise
    try:
        theirs = child.result(f"the {there}-block simulation run")
    except AutogradUnusableInFork:
        _fork_unusable = True  # for good: the engine's threads stay started in this process
        theirs = timeline(there)
    return [*ours, theirs]


class AutogradUnusableInFork(RuntimeError):
    """A forked copy of this process cannot run a backward: torch's autograd engine had started its
    device threads before the fork (https://github.com/pytorch/pytorch/wiki/Autograd-and-Fork)."""


def _check_autograd_runs() -> None:
    """In the forked copy, before its run: one tiny backward. Torch gives no way to ask beforehand
    whether the engine's device threads have started (a CUDA build starts them on the first backward,
    even on a machine without a GPU; a CPU build never does)."""
    try:
        torch.ones(1, requires_grad=True).sum().backward()
    except RuntimeError as error:
        raise AutogradUnusableInFork(str(error)) from None


_fork_unusable = False  # set once a forked copy could not run a backward


def _can_fork() -> bool:
    """Forking copies only the calling thread: safe while this process runs no other thread (Python's or
    CUDA's), only where fork exists, and only while a forked copy can still run a backward."""
    return (
        not _fork_unusable
        and forked.available()
        and threading.active_count() == 1
        and not torch.cuda.is_initialized()
    )


def _model_config(config: RunConfig) -> GPTConfig:
    return config_for(config.size, **dict(config.model_overrides))


def _named(vector: extrapolation.Vector) -> dict[str, int]:
    named = {name: vector[i] for i, name in enumerate(CATEGORY_NAMES.values())}
    named["total"] = vector[-1]
    return named


def _vector(snapshot: dict) -> extrapolation.Vector:
    """One device's tracker snapshot as a Vector (the simulation has one device)."""
    (device_snapshot,) = snapshot.values()
    return (*(device_snapshot.get(ref, 0) for ref in _REF_ORDER), device_snapshot[_TOTAL_KEY])


def _peak_rss_bytes() -> int:
    # ru_maxrss is in KiB on Linux: the high-water mark of this whole process.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# --- one simulated run: build as measure does, a warm-up step, then the tracked step ----------------------


def _full_step(config: RunConfig, model_config: GPTConfig, mesh, warmup: Warmup) -> extrapolation.StepMemory:
    keeper = extrapolation.PeakKeeper()
    marks = _run(config, model_config, mesh, lambda snapshot, *_: keeper.add(_vector(snapshot)), warmup)
    return keeper.result(marks)


def _step_timeline(
    config: RunConfig, model_config: GPTConfig, mesh, n_blocks: int, warmup: Warmup
) -> extrapolation.Timeline:
    events: list[extrapolation.Event] = []
    block_of: dict[str, int | None] = {}

    def record(snapshot, open_modules, backward, in_optimizer):
        blocks = []
        for name in open_modules:
            if name not in block_of:
                match = _BLOCK_NAME.search(name)
                block_of[name] = int(match.group(1)) if match else None
            if block_of[name] is not None:
                blocks.append(block_of[name])
        # Backward enters the next block before it leaves the last: the lowest open is the current one.
        block = (min(blocks) if backward else max(blocks)) if blocks else None
        events.append(extrapolation.Event(block, backward, in_optimizer, _vector(snapshot)))

    shorter = GPTConfig(**{**model_config.to_dict(), "n_layer": n_blocks})
    marks = _run(config, shorter, mesh, record, warmup)
    optimizer_start = marks.pop("optimizer_start")
    return extrapolation.cut(events, n_blocks, optimizer_start, marks)


def _run(config: RunConfig, model_config: GPTConfig, mesh, observe, warmup: Warmup) -> dict[str, extrapolation.Vector]:
    """Build, warm up and run one tracked step as measure does; `observe` sees every op of that step.
    Returns the bytes at the marked moments."""
    with torch.device("meta"):
        model = GPT(model_config)
    model, make_optimizer = parallelize(model, config.strategy, mesh, config.options)
    marks: dict[str, extrapolation.Vector] = {}
    # allow_non_fake_inputs: `to_empty` reads the meta parameters once to make their fake twins.
    with internals.fake_tensor_mode(allow_non_fake_inputs=True):
        model.to_empty(device="cpu")  # no init_weights(): fake tensors have no values to set
        optimizer = make_optimizer()
        if warmup is Warmup.STEP:
            _train_step(config, model_config, model, optimizer, 0)  # one is as good as any number
        else:
            _initialize_states(model, optimizer)
        tracker = _ObservingTracker(mod=model, optm=optimizer)
        tracker.observe = observe
        handle = optimizer.register_step_pre_hook(
            lambda *_: marks.__setitem__("optimizer_start", _vector(internals.tracker_current_snapshot(tracker)))
        )
        with internals.multi_grad_hooks_removed_on_exit(), tracker:
            _train_step(config, model_config, model, optimizer, config.steps_before_tracked, tracker, marks)
            marks["after_step"] = _vector(internals.tracker_current_snapshot(tracker))
        handle.remove()
    if "optimizer_start" not in marks:
        raise RuntimeError("the optimizer's step pre-hook did not run")
    return marks


def _initialize_states(model, optimizer) -> None:
    """What a warm-up step leaves behind, without its forward and backward (`Warmup.STATES`)."""
    internals.fsdp_lazy_init(model)  # what the first forward starts with
    for parameter in model.parameters():
        parameter.grad = torch.zeros_like(parameter)  # a sharded gradient, as the reduce-scatter leaves
    optimizer.step()  # Adam's state, and the first step's one-time dispatch paths
    optimizer.zero_grad(set_to_none=True)


def _train_step(config, model_config, model, optimizer, step: int, tracker=None, marks=None) -> None:
    """measure's training step (sharding_lab.engine.measure), on fake tensors: zero the gradients, then
    each micro-batch's forward and backward (gradients synchronized on the last only), then Adam."""
    optimizer.zero_grad(set_to_none=True)
    micro_batches = config.grad_accum_steps
    for micro in range(micro_batches):
        last = micro == micro_batches - 1
        idx, targets = training_batch(model_config, config, SIMULATED_RANK, step, "cpu", micro)
        if tracker is not None and micro > 0:
            tracker.reset_mod_stats()  # as measure's MemoryTracker.next_micro_batch
        with gradient_sync(model, config, enabled=last):
            loss = model(idx, targets)
            if micro_batches > 1:
                loss = loss / micro_batches
            if tracker is not None and last:
                marks["after_forward"] = _vector(internals.tracker_current_snapshot(tracker))
            loss.backward()
    optimizer.step()
