"""The data-parallel strategies by name, with what each does; no torch, so the CLI and the parent
process that starts ranks can check names without importing it. `sharding_lab.engine.parallelize` applies them.
"""

from __future__ import annotations

STRATEGY_DESCRIPTIONS: dict[str, str] = {
    "ddp": (
        "DistributedDataParallel: every rank holds the full parameters, gradients and Adam state. "
        "In backward, gradients are all-reduced in buckets (an average across ranks), so every rank "
        "steps the same full optimizer on the same full gradient."
    ),
    "zero1": (
        "DDP plus torch.distributed.optim.ZeroRedundancyOptimizer: each rank keeps Adam state only for "
        "the parameters it owns (whole tensors, assigned greedily by size, so the split is close to 1/N "
        "but not exact). Unlike the ZeRO paper, which reduce-scatters gradients and all-gathers the "
        "updated parameters, PyTorch's version still all-reduces the full gradient through DDP and then "
        "broadcasts each updated parameter from its owner: same optimizer-state saving, and gradients "
        "and parameters stay replicated."
    ),
    "zero2": (
        "FSDP2 fully_shard per block and on the root with reshard_after_forward=False: parameters, "
        "gradients and Adam state are sharded between steps; a block's parameters are all-gathered "
        "once before its forward and stay unsharded until its backward, and gradients are "
        "reduce-scattered per block. DeepSpeed's ZeRO-2 instead keeps the full parameters replicated "
        "on every rank at all times and only shards gradients and optimizer state (reduce-scatter of "
        "gradients, all-gather of the updated parameters after the step). FSDP2 in this mode holds all "
        "blocks unsharded only from forward to backward, and is sharded again between steps."
    ),
    "zero3": (
        "FSDP2 fully_shard per block and on the root with reshard_after_forward=True (ZeRO stage 3): "
        "parameters, gradients and Adam state are sharded. Each block's parameters are all-gathered "
        "just before its forward, freed after it, all-gathered again before its backward, and its "
        "gradients reduce-scattered so each rank keeps its 1/N slice. The root stays unsharded from "
        "forward to backward because backward needs it first."
    ),
}
STRATEGY_ALIASES: dict[str, str] = {"fsdp": "zero3"}
STRATEGIES: tuple[str, ...] = tuple(STRATEGY_DESCRIPTIONS)  # canonical names, in ZeRO-stage order


def canonical_strategy(strategy: str) -> str:
    """The strategy's canonical name; raises ValueError naming the valid ones."""
    name = STRATEGY_ALIASES.get(strategy, strategy)
    if name not in STRATEGY_DESCRIPTIONS:
        valid = ", ".join([*STRATEGIES, *STRATEGY_ALIASES])
        raise ValueError(f"unknown strategy {strategy!r}; choose one of {valid}")
    return name


def describe(strategy: str) -> str:
    return STRATEGY_DESCRIPTIONS[canonical_strategy(strategy)]


def is_fully_sharded(strategy: str) -> bool:
    """Whether the strategy shards parameters with FSDP2 (and so can start on the meta device)."""
    return canonical_strategy(strategy) in ("zero2", "zero3")
