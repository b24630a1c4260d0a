"""What one engine run is: a strategy, its options, the model and the training loop, typed and hashable.

`RunConfig` is the input of `sharding_lab.engine.measure` and the key labs share measurements by: two
labs that need the same configuration get the same measurement. No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from sharding_lab.model_config import config_for
from sharding_lab.strategies import Strategy

DEVICES: tuple[str, ...] = ("cpu", "cuda")  # cpu: gloo; cuda: NCCL, one GPU per rank


class Placement(str, Enum):
    """Where the N ranks of a run live."""

    AUTO = "auto"  # real ranks when the devices suffice; otherwise a rank view (see resolve_placement)
    RANKS = "ranks"  # N processes: gloo on CPU, NCCL with one GPU each on CUDA
    RANK_VIEW = "rank-view"  # one process as rank 0 of N on torch's fake process group: real memory,
    #                          collectives issued with their logical bytes but answered without moving data
    SHARED_GPU = "shared-gpu"  # N processes on one GPU, over gloo: every collective makes a host round trip

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class PlacementChoice:
    placement: Placement
    note: str  # what was asked, what the machine has, what is done: "" when it is what was asked


def resolve_placement(
    requested: Placement, device: str, world_size: int, gpus: int, *, every_rank: bool = False
) -> PlacementChoice:
    """Where to run `world_size` ranks on `device` on a machine with `gpus` GPUs. `every_rank`: the caller
    reads every rank's figures (labs), so with too few GPUs it gets real ranks sharing one GPU instead
    of rank 0's view. ValueError, naming the counts, for what cannot run."""
    if device == "cpu":
        if requested is Placement.SHARED_GPU:
            raise ValueError("--placement shared-gpu needs --device cuda")
        return PlacementChoice(Placement.RANKS if requested is Placement.AUTO else requested, "")
    if gpus < 1:
        raise ValueError(
            f"--device cuda asked for {world_size} rank(s), but torch sees no CUDA GPU on this machine; "
            "use --device cpu"
        )
    plural = "GPU" if gpus == 1 else "GPUs"
    if requested is Placement.RANKS and gpus < world_size:
        raise ValueError(
            f"{world_size} ranks with one GPU each need {world_size} GPUs; this machine has {gpus} {plural}. "
            "Use --placement rank-view (rank 0's real memory, collectives not moved) or shared-gpu "
            "(real ranks on one GPU over gloo)"
        )
    if requested is not Placement.AUTO:
        return PlacementChoice(requested, "")
    if gpus >= world_size:
        return PlacementChoice(Placement.RANKS, "")
    if every_rank:
        return PlacementChoice(
            Placement.SHARED_GPU,
            f"{world_size} ranks asked on cuda; this machine has {gpus} {plural}: running {world_size} real ranks "
            "on cuda:0 over gloo (each collective makes a host round trip; memory per rank is real)",
        )
    return PlacementChoice(
        Placement.RANK_VIEW,
        f"{world_size} ranks asked on cuda; this machine has {gpus} {plural}: measuring a rank view, rank 0 of "
        f"{world_size} on cuda:0 with torch's fake process group (its memory is real; collectives are issued "
        "with their logical bytes but move no data, so there are no communication timings)",
    )


@dataclass(frozen=True)
class ParallelOptions:
    """How `parallelize` applies a strategy."""

    prefetch: bool = True
    """FSDP: explicit prefetching. On, each unit issues the next unit's all-gather right after its own
    (forward: the next block; backward: the previous block). Off, no prefetching at all (FSDP's
    implicit backward prefetch is switched off too): every all-gather is issued by the unit that
    needs it."""
    mixed_precision: bool = False
    """bf16 parameters for compute, fp32 gradient reduction; the sharded/master copies stay fp32."""
    reshard_after_forward: bool | None = None
    """FSDP: override the strategy's choice (zero2: False, zero3: True) for the blocks."""
    lr: float = 1e-3
    """Adam's learning rate."""
    gradient_divide_factor: float | None = None
    """FSDP: what summed gradients are divided by (None: FSDP's choice, the world size). 1 makes FSDP
    sum instead of average: the regression the gradient-parity check must catch."""
    activation_checkpointing: bool = False
    """Every block's forward runs under `torch.utils.checkpoint` (non-reentrant): only its input is
    saved, and backward recomputes the block's forward to get the rest."""
    cpu_offload: bool = False
    """FSDP: `CPUOffloadPolicy`. Sharded parameters, gradients and Adam state live in host memory;
    each all-gather copies the shard to the device first, each reduce-scatter's output goes back to the
    host, and the optimizer steps on the host. On CPU ranks the device is the host: nothing moves."""
    replicas: int = 1
    """FSDP: HSDP when above 1. The ranks form a 2-D mesh, replicas x shards: parameters are sharded
    within a shard group (reduce-scatter there) and replicated across groups (all-reduce there)."""


@dataclass(frozen=True)
class RunConfig:
    """One configuration to measure: `world_size` ranks on `device` train `size` with `strategy`."""

    strategy: Strategy
    world_size: int = 2
    options: ParallelOptions = field(default_factory=ParallelOptions)
    size: str = "tiny"  # a named model size (sharding_lab.engine.model.SIZES)
    model_overrides: tuple[tuple[str, Any], ...] = ()  # GPTConfig fields to change, e.g. (("vocab_size", 131),)
    batch_size: int = 2  # per rank; the global batch is world_size times this
    seq_len: int | None = None  # None: the model's block_size
    warmup_steps: int | None = None
    """Steps before the tracked one; None: as many as the strategy needs to be steady
    (`steps_before_tracked`)."""
    timed_steps: int = 3
    check_gradients: bool = False  # compare the first step's gradient with a single-process reference
    seed: int = 0
    device: str = "cpu"
    placement: Placement = Placement.AUTO
    grad_accum_steps: int = 1
    """Micro-batches per optimizer step, each of batch_size. Only the last one synchronizes gradients:
    FSDP skips the reduce-scatter (keeping unsharded gradients) and DDP its all-reduce (`no_sync`)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "strategy", Strategy.parse(self.strategy))
        object.__setattr__(self, "model_overrides", tuple(sorted(dict(self.model_overrides).items())))
        object.__setattr__(self, "placement", Placement(self.placement))
        if self.world_size < 1:
            raise ValueError(f"world_size must be at least 1, got {self.world_size}")
        if self.device not in DEVICES:
            raise ValueError(f"unknown device {self.device!r}; choose one of {', '.join(DEVICES)}")
        if self.warmup_steps is not None and self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be at least 0, got {self.warmup_steps}")
        if self.steps_before_tracked < 1 and self.check_gradients:
            raise ValueError("check_gradients needs at least one warm-up step")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {self.batch_size}")
        block_size = config_for(self.size, **dict(self.model_overrides)).block_size
        if self.seq_len is not None and not 1 <= self.seq_len <= block_size:
            raise ValueError(f"seq {self.seq_len} must be from 1 to {self.size}'s block_size {block_size}")
        if self.grad_accum_steps < 1:
            raise ValueError(f"grad_accum_steps must be at least 1, got {self.grad_accum_steps}")
        if self.check_gradients and self.grad_accum_steps > 1:
            raise ValueError("check_gradients compares one micro-batch's gradient: use grad_accum_steps=1")
        options = self.options
        if options.replicas < 1:
            raise ValueError(f"replicas must be at least 1, got {options.replicas}")
        if self.world_size % options.replicas:
            raise ValueError(
                f"replicas={options.replicas} must divide the world size {self.world_size} "
                "(HSDP's mesh is replicas x shards)"
            )
        if not self.strategy.fully_sharded:
            for name, on in (("cpu_offload", options.cpu_offload), ("replicas", options.replicas > 1)):
                if on:
                    raise ValueError(f"{name} is an FSDP option: {self.strategy} does not shard parameters")

    @property
    def shards(self) -> int:
        """Ranks in one shard group: the world size, or world_size / replicas under HSDP."""
        return self.world_size // self.options.replicas

    @classmethod
    def of(cls, strategy: Strategy | str, **fields: Any) -> RunConfig:
        """A RunConfig from flat keywords: ParallelOptions' fields go into `options`."""
        option_names = ParallelOptions.__dataclass_fields__
        options = ParallelOptions(**{k: v for k, v in fields.items() if k in option_names})
        rest = {k: v for k, v in fields.items() if k not in option_names}
        if isinstance(rest.get("model_overrides"), dict):
            rest["model_overrides"] = tuple(rest["model_overrides"].items())
        unknown = set(rest) - set(cls.__dataclass_fields__)
        if unknown:
            valid = sorted({*cls.__dataclass_fields__, *option_names} - {"options", "strategy"})
            raise ValueError(f"unknown options {sorted(unknown)}; valid: {valid}")
        return cls(strategy, options=options, **rest)

    def replace(self, **fields: Any) -> RunConfig:
        """This configuration with some fields changed (ParallelOptions' too)."""
        option_names = ParallelOptions.__dataclass_fields__
        options = replace(self.options, **{k: v for k, v in fields.items() if k in option_names})
        return replace(self, options=options, **{k: v for k, v in fields.items() if k not in option_names})

    @property
    def reshard_after_forward(self) -> bool | None:
        """The blocks' reshard-after-forward this run uses; None for DDP strategies."""
        return self.strategy.reshard_after_forward(self.options.reshard_after_forward)

    @property
    def steps_before_tracked(self) -> int:
        """The warm-up steps, so that the tracked step is a steady one: FSDP's lazy init and Adam's state
        come with the first step; DDP (ddp, zero1) rebuilds its gradient buckets in its second forward,
        by the order the first backward produced gradients in. Measured on CPU ranks, a tracked FSDP
        step's figures are the same after one warm-up step as after two (a test holds them so)."""
        if self.warmup_steps is not None:
            return self.warmup_steps
        return 2 if self.strategy.uses_ddp else 1

    def changed_options(self) -> dict[str, Any]:
        """The options that differ from the defaults, flat, as `RunConfig.of` takes them (the run's
        strategy, world size, size and device left out: they are reported on their own)."""
        changed = {
            name: getattr(self.options, name)
            for name, spec in ParallelOptions.__dataclass_fields__.items()
            if getattr(self.options, name) != spec.default
        }
        for name, spec in RunConfig.__dataclass_fields__.items():
            if name in ("strategy", "world_size", "options", "size", "device", "placement"):
                continue
            default = () if name == "model_overrides" else spec.default
            if getattr(self, name) != default:
                changed[name] = dict(self.model_overrides) if name == "model_overrides" else getattr(self, name)
        return changed

    @property
    def label(self) -> str:
        """Short and readable: the strategy and whatever differs from the defaults in what is trained
        (how many steps are timed is left out: it changes no figure but the step time)."""
        changed = ", ".join(
            f"{name}={value}" for name, value in self.changed_options().items() if name != "timed_steps"
        )
        return f"{self.strategy}({changed})" if changed else str(self.strategy)
