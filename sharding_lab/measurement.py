"""One engine measurement, typed: what `sharding_lab.engine.measure` returns and every lab reads.

`Measurement.to_json()` is the `sharding-lab measure --json` object and `Measurement.from_json()`
reads it back, so stored and doctored measurements go through the same types. The methods are the
readings labs take from a run (shares, what was sharded, the collectives by op and phase, the
timeline); they are the one place that knows the layout. Pure Python, no torch. All sizes in bytes.

    config     MeasuredConfig: strategy, world size, size, backend, device, torch version, options,
               Ψ (num_params) and Ψ after FSDP's dim-0 padding, blocks, model shape, steps, seed
    memory     one RankMemory per rank: the exact local model-state tensors between steps, and the
               tracker's peak and persistent bytes by category over the measured step
    comm       CommSummary of rank 0's step (every rank issues the same collectives): each Collective
               in issue order and a timeline that interleaves them with module start/end events
    predicted  the analytic model's figures for this run (sharding_lab.analytic), and where PyTorch
               departs from the paper
    step_time_s, loss, gradient_parity (with check_gradients), overlap (CUDA only)
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from sharding_lab.analytic import FP32_ADAM_BYTES
from sharding_lab.strategies import MODEL_STATE_PARTS, OPS, Strategy

PARTS = MODEL_STATE_PARTS  # ("params", "grads", "optimizer")
# Memory categories, as the trackers' categories are named here. The peak's breakdown adds up to peak_bytes.
CATEGORIES: tuple[str, ...] = (
    "params",
    "grads",
    "optimizer",
    "activations",
    "temporaries",
    "all_gather_buffers",
    "reduce_scatter_buffers",
    "buffers",
    "inputs",
    "other",
)
ROOT = "root"  # the name events use for the model itself
_BLOCK_NAME = re.compile(r"(?:^|\.)blocks\.(\d+)$")  # the engine names blocks "blocks.<i>"


def block_index(module: str | None) -> int | None:
    """The block number in a module name like 'blocks.3', or None for the root and others."""
    match = _BLOCK_NAME.search(module or "")
    return int(match.group(1)) if match else None


def paper_units(op: str) -> int:
    """Buffers an op moves in the ZeRO paper's accounting: all-reduce = reduce-scatter + all-gather."""
    return 2 if op == "all_reduce" else 1


def _build(cls, data: Mapping[str, Any]):
    """A flat dataclass from a JSON object: its own fields only, so old extra keys are ignored."""
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True)
class MeasuredConfig:
    strategy: Strategy
    world_size: int
    size: str
    backend: str  # gloo, nccl, or fake in a rank view
    device: str  # "cpu", "cuda:0", ...
    torch_version: str
    prefetch: bool
    mixed_precision: bool
    reshard_after_forward: bool | None  # None for DDP strategies
    num_params: int  # Ψ: every parameter element of the unsharded model
    padded_num_params: int  # Ψ after FSDP pads each parameter's dim 0 to a multiple of N
    n_blocks: int
    model: dict[str, Any]  # the GPTConfig's fields
    seq_len: int
    batch_size_per_rank: int
    warmup_steps: int
    timed_steps: int
    seed: int
    cuda_version: str | None = None  # torch's CUDA build, on CUDA
    gpu_name: str | None = None  # e.g. "NVIDIA H200", on CUDA
    placement: str = "ranks"  # ranks, rank-view (rank 0's memory only) or shared-gpu (run_config.Placement)
    placement_note: str = ""  # what was asked, what the machine had, what was done instead
    activation_checkpointing: bool = False  # each block's forward recomputed in backward
    cpu_offload: bool = False  # FSDP2's CPUOffloadPolicy: model states in host memory
    replicas: int = 1  # HSDP: replicas x (world_size / replicas) shards; 1 is full sharding
    grad_accum_steps: int = 1  # micro-batches per optimizer step; only the last syncs gradients

    def __post_init__(self) -> None:
        object.__setattr__(self, "strategy", Strategy.parse(self.strategy))


@dataclass(frozen=True)
class RankMemory:
    rank: int
    # Exact local tensors between steps (FSDP's shards through to_local()).
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int  # per-element state (Adam's exp_avg, exp_avg_sq)
    model_states_bytes: int
    optimizer_scalar_bytes: int  # Adam's `step` counters, outside the ZeRO model
    padding_elements: int  # how far this rank's shard is short of FSDP's padded shard
    padding_bytes: int  # what that padding would cost across params, grads and optimizer state
    # The tracker over the measured step.
    peak_bytes: int
    persistent_bytes: int  # after optimizer.step(): what stays until the next step
    categories: dict[str, int]  # the peak moment by category; adds up to peak_bytes
    category_peaks: dict[str, int]  # each category's own maximum over the step
    unsharded_params_peak_bytes: int  # the most gathered parameters alive at once
    unsharded_params_after_forward_bytes: int  # gathered parameters alive when forward returns
    cuda_max_memory_allocated: int | None  # torch.cuda's figure on CUDA, None on CPU
    activations_after_forward_bytes: int = 0  # what forward saved for backward, when the (last) forward returns
    # The most gathered parameters and all-gather output buffers alive at once (0 in files from before it).
    gathered_with_buffers_peak_bytes: int = 0
    # The same while a block after the first runs: the root's own all-gather, often heavier, left out.
    gathered_with_buffers_later_blocks_peak_bytes: int = 0
    # The device type(s) the parameter shards, gradients and Adam state are on between steps: "cuda", or
    # "cpu" under CPU offload ("cpu" on CPU ranks either way); "" in files from before it.
    states_device: str = ""

    def part_bytes(self, part: str) -> int:
        return {"params": self.params_bytes, "grads": self.grads_bytes, "optimizer": self.optimizer_bytes}[part]


@dataclass(frozen=True)
class Collective:
    seq: int
    op: str  # one of OPS
    phase: str | None  # forward, backward, optimizer
    module: str | None  # the unit whose parameters or gradients move
    prefetch: bool  # FSDP issued it ahead, from another unit's hook
    bytes: int  # logical bytes at the API: the full (unsharded) buffer
    wire_bytes_derived: int | None  # per-rank bytes by the ring formulas: derived, not measured
    dtype: str | None
    group_size: int | None = None  # ranks in the collective's process group
    mesh_dim: str | None = None  # the mesh dimension it ran on: "dp", or HSDP's "shard" / "replicate"


@dataclass(frozen=True)
class Event:
    """One timeline entry: a collective, or a module's forward/backward start or end."""

    position: int  # index in the ordered timeline
    kind: str  # "collective", "start" or "end"
    module: str
    phase: str  # forward, backward, optimizer (for module events: the pass they bound)
    collective: Collective | None = None  # for kind == "collective"

    @property
    def op(self) -> str:
        return self.collective.op if self.collective else ""

    @property
    def bytes(self) -> int:
        return self.collective.bytes if self.collective else 0

    def to_json(self) -> dict:
        if self.collective is not None:
            return {"event": "collective", **asdict(self.collective)}
        return {"event": f"{self.phase}_{self.kind}", "module": self.module, "phase": self.phase}

    @classmethod
    def from_json(cls, position: int, raw: Mapping[str, Any]) -> Event:
        module = raw.get("module") or ""
        if raw["event"] == "collective":
            return cls(position, "collective", module, raw.get("phase") or "", _build(Collective, raw))
        phase, _, edge = raw["event"].partition("_")
        return cls(position, edge, module, phase)


@dataclass(frozen=True)
class OpTotal:
    count: int = 0
    bytes: int = 0
    wire_bytes_derived: int = 0


@dataclass(frozen=True)
class CommSummary:
    collectives: tuple[Collective, ...]
    timeline: tuple[Event, ...]

    def totals(self) -> dict[str, OpTotal]:
        """Per op: count, logical bytes and derived wire bytes (every op in OPS, zero when absent)."""
        totals = {op: OpTotal() for op in OPS}
        for c in self.collectives:
            t = totals.get(c.op, OpTotal())
            totals[c.op] = OpTotal(t.count + 1, t.bytes + c.bytes, t.wire_bytes_derived + (c.wire_bytes_derived or 0))
        return totals

    @property
    def bytes_per_step(self) -> int:
        return sum(c.bytes for c in self.collectives)

    @property
    def bytes_per_step_paper(self) -> int:
        """Bytes per step in the ZeRO paper's accounting: an all-reduce counts twice."""
        return sum(paper_units(c.op) * c.bytes for c in self.collectives)

    @property
    def wire_bytes_per_step_derived(self) -> int:
        return sum(c.wire_bytes_derived or 0 for c in self.collectives)

    def to_json(self) -> dict:
        return {
            "collectives": [asdict(c) for c in self.collectives],
            "totals": {op: asdict(t) for op, t in self.totals().items()},
            "bytes_per_step": self.bytes_per_step,
            "wire_bytes_per_step_derived": self.wire_bytes_per_step_derived,
            "timeline": [event.to_json() for event in self.timeline],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CommSummary:
        collectives = tuple(_build(Collective, c) for c in data["collectives"])
        timeline = tuple(Event.from_json(i, raw) for i, raw in enumerate(data.get("timeline") or ()))
        return cls(collectives, timeline)


@dataclass(frozen=True)
class GradientParity:
    """The full gradient after one step against a single-process reference on the same global batch."""

    max_relative_error: float
    worst_parameter: str
    tolerance: float
    holds: bool
    global_batch_size: int
    reference_loss: float


@dataclass(frozen=True)
class Overlap:
    """CUDA only, from the profiler's kernel timeline: communication kernel time that overlapped compute."""

    comm_kernel_us: float
    compute_kernel_us: float
    overlapped_us: float
    overlapped_fraction_of_comm: float
    overlapped: bool
    comm_kernels: int = 0
    compute_kernels: int = 0


@dataclass(frozen=True)
class Prediction:
    """sharding_lab.analytic's figures for the run (the paper's accounting), beside what was measured."""

    model_states_bytes_per_rank: dict[str, int]
    communication_bytes_per_step: dict[str, Any]
    accounting: str
    differences: str  # where PyTorch's implementation departs from the paper


# Why a CUDA measurement without NCCL has no overlap figure, by its backend.
NO_NCCL_OVERLAP = {
    "gloo": "the ranks share one GPU over gloo, each collective a round trip through host memory on the "
    "rank's own thread, so no communication kernel runs beside compute; overlap needs one GPU per rank (NCCL)",
    "fake": "a rank view moves no data, so no communication kernel runs; overlap needs one GPU per rank (NCCL)",
    "nccl": "the profiler recorded no kernels",
}


@dataclass(frozen=True)
class Measurement:
    config: MeasuredConfig
    ranks: tuple[RankMemory, ...]
    comm: CommSummary
    predicted: Prediction
    step_time_s: float | None  # the slowest rank's median plain (untracked) step; None: timed_steps=0
    loss: float
    gradient_parity: GradientParity | None = None
    overlap: Overlap | None = None

    # --- JSON ------------------------------------------------------------------------------------------

    def to_json(self) -> dict:
        result = {
            "config": asdict(self.config),
            "memory": {"per_rank": [asdict(r) for r in self.ranks]},
            "comm": self.comm.to_json(),
            "predicted": asdict(self.predicted),
            "step_time_s": self.step_time_s,
            "loss": self.loss,
        }
        result["config"]["strategy"] = str(self.config.strategy)
        if self.gradient_parity is not None:
            result["gradient_parity"] = asdict(self.gradient_parity)
        if self.overlap is not None:
            result["overlap"] = asdict(self.overlap)
        return result

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Measurement:
        parity, overlap = data.get("gradient_parity"), data.get("overlap")
        return cls(
            config=_build(MeasuredConfig, data["config"]),
            ranks=tuple(_build(RankMemory, r) for r in data["memory"]["per_rank"]),
            comm=CommSummary.from_json(data["comm"]),
            predicted=_build(Prediction, data["predicted"]),
            step_time_s=None if data["step_time_s"] is None else float(data["step_time_s"]),
            loss=float(data["loss"]),
            gradient_parity=_build(GradientParity, parity) if parity else None,
            overlap=_build(Overlap, overlap) if overlap else None,
        )

    # --- the run -----------------------------------------------------------------------------------------

    @property
    def strategy(self) -> Strategy:
        return self.config.strategy

    @property
    def world_size(self) -> int:
        return self.config.world_size

    @property
    def num_params(self) -> int:
        """Ψ: every parameter element of the unsharded model."""
        return self.config.num_params

    @property
    def padded_num_params(self) -> int:
        """Ψ after FSDP pads each parameter's dim 0 to a multiple of N (Ψ itself when nothing is padded)."""
        return self.config.padded_num_params or self.config.num_params

    @property
    def n_blocks(self) -> int:
        return self.config.n_blocks

    # --- model states between steps -------------------------------------------------------------------

    def part_bytes(self, part: str) -> list[int]:
        """Bytes of one model-state part (params, grads, optimizer) each rank holds between steps."""
        return [rank.part_bytes(part) for rank in self.ranks]

    def model_states_bytes(self) -> list[int]:
        return [sum(rank.part_bytes(part) for part in PARTS) for rank in self.ranks]

    def full_bytes(self, part: str) -> int:
        """Bytes of one part for the whole unsharded model in fp32 Adam (4Ψ, 4Ψ, 8Ψ)."""
        return FP32_ADAM_BYTES[part] * self.num_params

    def full_model_states_bytes(self) -> int:
        return sum(self.full_bytes(part) for part in PARTS)

    def padded_full_bytes(self, part: str) -> int:
        """Bytes of one part for the whole model including FSDP's padding: what an all-gather moves."""
        return FP32_ADAM_BYTES[part] * self.padded_num_params

    def padded_part_bytes(self, part: str) -> list[int]:
        """Each rank's bytes of `part` plus the padding its shard is short of (FSDP's last ranks)."""
        return [rank.part_bytes(part) + FP32_ADAM_BYTES[part] * rank.padding_elements for rank in self.ranks]

    def held_in_full(self, part: str) -> bool:
        """Whether every rank holds the whole model's `part` (replicated, as under DDP)."""
        return all(b == self.full_bytes(part) for b in self.part_bytes(part))

    def sharded(self, part: str) -> bool:
        """Whether the ranks split `part` with nothing replicated: their bytes add up to one full copy and
        none holds more than 1/N of the padded model (FSDP pads dims that N does not divide)."""
        held = self.part_bytes(part)
        return sum(held) == self.full_bytes(part) and max(held) <= self.padded_full_bytes(part) // self.world_size

    def shares(self, part: str) -> list[float]:
        """Each rank's bytes of `part` as a fraction of the whole model's."""
        full = self.full_bytes(part)
        return [b / full for b in self.part_bytes(part)]

    # --- memory over the step ---------------------------------------------------------------------------

    def unsharded_after_forward(self) -> list[int]:
        """Bytes of gathered (full) parameters still held when forward ends, per rank."""
        return [rank.unsharded_params_after_forward_bytes for rank in self.ranks]

    def unsharded_peak(self) -> list[int]:
        """The most bytes of gathered (full) parameters held at once during the step, per rank."""
        return [rank.unsharded_params_peak_bytes for rank in self.ranks]

    def gathered_with_buffers_later_blocks_peak(self) -> list[int]:
        """The most bytes of gathered parameters and all-gather output buffers held at once while a block
        after the first runs, per rank: a prefetched block's parameters wait in their buffer while the
        current block's are in use; the moment the root's all-gather (on a large vocabulary, many blocks'
        worth) is waited on is left out."""
        return [rank.gathered_with_buffers_later_blocks_peak_bytes for rank in self.ranks]

    def all_gather_buffer_peak(self) -> list[int]:
        """The most bytes held in all-gather output buffers at once, per rank: gathered bytes waiting to be
        copied out into a unit's parameters (a prefetched block waits here until it starts)."""
        return [rank.category_peaks.get("all_gather_buffers", 0) for rank in self.ranks]

    def categories(self, rank: int = 0) -> dict[str, int]:
        return dict(self.ranks[rank].categories)

    # --- communication ------------------------------------------------------------------------------------

    def collectives(self, *, op: str | None = None, phase: str | None = None) -> list[Collective]:
        """The step's collectives in issue order, optionally only one op and/or phase."""
        return [
            c for c in self.comm.collectives if (op is None or c.op == op) and (phase is None or c.phase == phase)
        ]

    def totals_by_op(self) -> dict[str, OpTotal]:
        """Per op that ran: count, logical bytes and derived wire bytes of the step."""
        return {op: total for op, total in self.comm.totals().items() if total.count}

    def gathered_bytes_by_module(self) -> dict[str, int]:
        """Full parameter bytes of each FSDP unit, read off its forward all-gathers (one per unit)."""
        result: dict[str, int] = {}
        for c in self.collectives(op="all_gather", phase="forward"):
            result[c.module or ""] = result.get(c.module or "", 0) + c.bytes
        return result

    def root_and_block_bytes(self) -> tuple[int, int]:
        """(root unit's full parameter bytes, largest block unit's), from the forward all-gathers."""
        by_module = self.gathered_bytes_by_module()
        blocks = [b for name, b in by_module.items() if block_index(name) is not None]
        root = sum(b for name, b in by_module.items() if block_index(name) is None)
        return root, max(blocks, default=0)

    def volume_in_params(self) -> float:
        """The step's communication bytes over the model's fp32 bytes (4Ψ), paper accounting: Ψ elements
        moved in fp32 read 1; in bf16 they read 0.5."""
        return self.comm.bytes_per_step_paper / self.full_bytes("params")

    def timeline(self) -> list[Event]:
        return list(self.comm.timeline)


def module_event(events: list[Event], module_block: int, phase: str, kind: str) -> Event | None:
    """The first `kind` (start/end) event of block `module_block` in `phase`."""
    for event in events:
        if event.kind == kind and event.phase == phase and block_index(event.module) == module_block:
            return event
    return None


def block_collectives(events: list[Event], op: str, phase: str) -> dict[int, list[Event]]:
    """Block number -> its `op` collectives in `phase`, in order."""
    result: dict[int, list[Event]] = {}
    for event in events:
        if event.kind == "collective" and event.op == op and event.phase == phase:
            index = block_index(event.module)
            if index is not None:
                result.setdefault(index, []).append(event)
    return result


Measurements = Mapping[str, Measurement]  # a lab's measurements, by the key its runs give them
