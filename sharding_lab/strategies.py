"""The data-parallel strategies: the one place that names them and states their rules.

`Strategy` is read by the analytic model, `parallelize`, the measurement, the lab catalogue and the
CLI; nothing else spells a strategy's name or its rules. No torch here, so the CLI and the parent
process that starts ranks can check names without importing it.

The rules are the ZeRO paper's (Rajbhandari et al., SC 2020) where the paper has one: which model
states a stage shards (§5) and the communication volume per step (§7). Where PyTorch's
implementation departs from the paper, `known_differences` says how.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

# The three model states the ZeRO paper counts, in its order.
MODEL_STATE_PARTS: tuple[str, ...] = ("params", "grads", "optimizer")
# The collectives a step issues, and the training phases they are issued in.
OPS: tuple[str, ...] = ("all_gather", "reduce_scatter", "all_reduce", "broadcast")
PHASES: tuple[str, ...] = ("forward", "backward", "optimizer")


@dataclass(frozen=True)
class CollectivePlan:
    """One collective of the paper's step, moving Ψ elements."""

    op: str
    phase: str
    ring_factor: int  # per-rank wire traffic in units of (N-1)/N·S for a buffer of S bytes


@dataclass(frozen=True)
class _Rules:
    sharded_parts: frozenset[str]
    uses_ddp: bool  # DDP wraps the model (ddp, zero1); otherwise FSDP2 fully_shard does
    default_reshard_after_forward: bool | None  # FSDP only: the blocks' choice; None for DDP
    communication_multiple: int  # the paper's volume per step, in units of Ψ (§7)
    collectives_per_step: tuple[CollectivePlan, ...]  # what the paper's step runs, in order
    paper_name: str  # the paper's column name in Table 1
    description: str
    memory_differences: str  # where PyTorch's implementation departs from the paper's memory accounting
    collective_differences: str  # where the engine's collectives depart from the paper's step ("" where they match)


class Strategy(str, Enum):
    """ddp, zero1, zero2, zero3 (alias fsdp), in ZeRO-stage order. Compares equal to its name."""

    DDP = "ddp"
    ZERO1 = "zero1"
    ZERO2 = "zero2"
    ZERO3 = "zero3"

    @classmethod
    def parse(cls, name: str | Strategy) -> Strategy:
        """The strategy called `name` (aliases resolved); ValueError naming the valid names otherwise."""
        if isinstance(name, Strategy):
            return name
        canonical = ALIASES.get(name, name)
        try:
            return cls(canonical)
        except ValueError:
            valid = ", ".join(NAMES)
            raise ValueError(f"unknown strategy {name!r}; choose one of {valid}") from None

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @property
    def _rules(self) -> _Rules:
        return _RULES[self]

    @property
    def sharded_parts(self) -> frozenset[str]:
        """Which of MODEL_STATE_PARTS each rank holds only 1/N of between steps."""
        return self._rules.sharded_parts

    @property
    def uses_ddp(self) -> bool:
        return self._rules.uses_ddp

    @property
    def fully_sharded(self) -> bool:
        """Whether FSDP2 shards the parameters (so the model can be built on the meta device)."""
        return not self._rules.uses_ddp

    @property
    def default_reshard_after_forward(self) -> bool | None:
        return self._rules.default_reshard_after_forward

    @property
    def communication_multiple(self) -> int:
        return self._rules.communication_multiple

    @property
    def collectives_per_step(self) -> tuple[CollectivePlan, ...]:
        return self._rules.collectives_per_step

    @property
    def paper_name(self) -> str:
        return self._rules.paper_name

    @property
    def description(self) -> str:
        return self._rules.description

    @property
    def known_differences(self) -> str:
        """Everything PyTorch's implementation does otherwise than the paper counts: memory, then collectives."""
        return " ".join(part for part in (self._rules.memory_differences, self._rules.collective_differences) if part)

    @property
    def collective_differences(self) -> str:
        return self._rules.collective_differences

    def reshard_after_forward(self, override: bool | None = None) -> bool | None:
        """The blocks' reshard-after-forward: `override` if given, else the strategy's; None for DDP."""
        if self.uses_ddp:
            return None
        return self.default_reshard_after_forward if override is None else override


_ALL_REDUCE = (CollectivePlan("all_reduce", "backward", 2),)
# The paper's stages 1-2: a reduce-scatter of gradients, an all-gather of the updated parameters.
_SCATTER_THEN_GATHER = (CollectivePlan("reduce_scatter", "backward", 1), CollectivePlan("all_gather", "optimizer", 1))

_RULES: dict[Strategy, _Rules] = {
    Strategy.DDP: _Rules(
        paper_name="baseline",
        sharded_parts=frozenset(),
        uses_ddp=True,
        default_reshard_after_forward=None,
        communication_multiple=2,
        collectives_per_step=_ALL_REDUCE,
        description=(
            "DistributedDataParallel: every rank holds the full parameters, gradients and Adam state. "
            "In backward, gradients are all-reduced in buckets (an average across ranks), so every rank "
            "steps the same full optimizer on the same full gradient."
        ),
        memory_differences="",
        collective_differences="",
    ),
    Strategy.ZERO1: _Rules(
        paper_name="Pos",
        sharded_parts=frozenset({"optimizer"}),
        uses_ddp=True,
        default_reshard_after_forward=None,
        communication_multiple=2,
        collectives_per_step=_SCATTER_THEN_GATHER,
        description=(
            "DDP plus torch.distributed.optim.ZeroRedundancyOptimizer: each rank keeps Adam state only for "
            "the parameters it owns (whole tensors, assigned greedily by size, so the split is close to 1/N "
            "but not exact). Unlike the ZeRO paper, which reduce-scatters gradients and all-gathers the "
            "updated parameters, PyTorch's version still all-reduces the full gradient through DDP and then "
            "broadcasts each updated parameter from its owner: same optimizer-state saving, and gradients "
            "and parameters stay replicated."
        ),
        memory_differences=(
            "ZeroRedundancyOptimizer assigns whole parameters to ranks, so optimizer bytes per rank are near, "
            "not exactly, 8Ψ/N (they sum to 8Ψ)."
        ),
        collective_differences=(
            "It all-reduces the gradients through DDP (2Ψ) and then broadcasts each updated parameter from its "
            "owner (Ψ), not the paper's reduce-scatter and all-gather."
        ),
    ),
    Strategy.ZERO2: _Rules(
        paper_name="Pos+g",
        sharded_parts=frozenset({"grads", "optimizer"}),
        uses_ddp=False,
        default_reshard_after_forward=False,
        communication_multiple=2,
        collectives_per_step=_SCATTER_THEN_GATHER,
        description=(
            "FSDP2 fully_shard per block and on the root with reshard_after_forward=False: parameters, "
            "gradients and Adam state are sharded between steps; a block's parameters are all-gathered "
            "once before its forward and stay unsharded until its backward, and gradients are "
            "reduce-scattered per block. DeepSpeed's ZeRO-2 instead keeps the full parameters replicated "
            "on every rank at all times and only shards gradients and optimizer state (each gradient slice "
            "reduced to its owner, by default since v0.12.4 as an all-reduce of each bucket, then an all-gather "
            "of the updated parameters after the step). FSDP2 in this mode holds all "
            "blocks unsharded only from forward to backward, and is sharded again between steps."
        ),
        memory_differences=(
            "FSDP2 with reshard_after_forward=False keeps only a parameter shard between steps (stage 3's "
            "params bytes); the full parameters exist from each block's forward to its backward."
        ),
        collective_differences=(
            "It moves the paper's bytes (plus FSDP's padding), but all-gathers each unit's parameters before "
            "its forward, not after the optimizer step."
        ),
    ),
    Strategy.ZERO3: _Rules(
        paper_name="Pos+g+p",
        sharded_parts=frozenset(MODEL_STATE_PARTS),
        uses_ddp=False,
        default_reshard_after_forward=True,
        communication_multiple=3,
        collectives_per_step=(
            CollectivePlan("all_gather", "forward", 1),
            CollectivePlan("all_gather", "backward", 1),
            CollectivePlan("reduce_scatter", "backward", 1),
        ),
        description=(
            "FSDP2 fully_shard per block with reshard_after_forward=True (ZeRO stage 3), and on the root "
            "with False: parameters, gradients and Adam state are sharded. Each block's parameters are all-gathered "
            "just before its forward, freed after it, all-gathered again before its backward, and its "
            "gradients reduce-scattered so each rank keeps its 1/N slice. The root stays unsharded from "
            "forward to backward because backward needs it first."
        ),
        memory_differences="",
        collective_differences=(
            "FSDP2 does not reshard the root after forward, so backward all-gathers the blocks only: less than "
            "the paper's Ψ, short by the root unit's parameters (embeddings and head)."
        ),
    ),
}
ALIASES: dict[str, Strategy] = {"fsdp": Strategy.ZERO3}
STRATEGIES: tuple[Strategy, ...] = tuple(Strategy)  # in ZeRO-stage order
NAMES: tuple[str, ...] = (*(s.value for s in Strategy), *ALIASES)  # what the CLI accepts
