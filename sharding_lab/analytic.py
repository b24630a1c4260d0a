"""The ZeRO paper's analytic model: model-state memory and communication per rank.

Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models" (SC 2020), sections 3 and 7. Pure arithmetic on integers, no
torch, so the CLI can answer for a trillion parameters instantly and every
measured run can show its prediction beside it.

Model states per parameter (Ψ parameters, Adam):
- fp32 training:        params 4 B, grads 4 B, optimizer 8 B (exp_avg, exp_avg_sq).
- mixed precision (§3.1): params 2 B (fp16), grads 2 B, optimizer K = 12 B
  (fp32 master copy, exp_avg, exp_avg_sq).

Each stage shards more of them over the N data-parallel ranks:
ddp nothing, zero1 (P_os) the optimizer, zero2 (P_os+g) also the gradients,
zero3 (P_os+g+p, alias fsdp) also the parameters.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

STRATEGIES: tuple[str, ...] = ("ddp", "zero1", "zero2", "zero3")
ALIASES: dict[str, str] = {"fsdp": "zero3"}

MODEL_STATE_PARTS: tuple[str, ...] = ("params", "grads", "optimizer")

# Which model-state parts each strategy shards across ranks.
SHARDED_PARTS: dict[str, frozenset[str]] = {
    "ddp": frozenset(),
    "zero1": frozenset({"optimizer"}),
    "zero2": frozenset({"grads", "optimizer"}),
    "zero3": frozenset({"params", "grads", "optimizer"}),
}

# Bytes per parameter for each part: fp32 Adam, and the paper's mixed-precision Adam.
FP32_ADAM_BYTES: dict[str, int] = {"params": 4, "grads": 4, "optimizer": 8}
ADAM_OPTIMIZER_MULTIPLIER_K = 12
MIXED_PRECISION_ADAM_BYTES: dict[str, int] = {"params": 2, "grads": 2, "optimizer": ADAM_OPTIMIZER_MULTIPLIER_K}

# Paper's communication volume per step, in units of Ψ (§7): a DP all-reduce is a
# reduce-scatter plus an all-gather (2Ψ); stages 1-2 do exactly that; stage 3
# all-gathers parameters in forward and again in backward, then reduce-scatters (3Ψ).
COMMUNICATION_MULTIPLE: dict[str, int] = {"ddp": 2, "zero1": 2, "zero2": 2, "zero3": 3}

# The collectives behind those volumes, each moving Ψ elements: (op, phase, ring factor).
# The ring factor is the per-rank wire traffic in units of (N-1)/N·S for a buffer of S bytes.
COLLECTIVES_PER_STEP: dict[str, tuple[tuple[str, str, int], ...]] = {
    "ddp": (("all_reduce", "backward", 2),),
    "zero1": (("reduce_scatter", "backward", 1), ("all_gather", "optimizer", 1)),
    "zero2": (("reduce_scatter", "backward", 1), ("all_gather", "optimizer", 1)),
    "zero3": (("all_gather", "forward", 1), ("all_gather", "backward", 1), ("reduce_scatter", "backward", 1)),
}


def canonical_strategy(strategy: str) -> str:
    """`strategy` as one of STRATEGIES (aliases resolved); ValueError naming the valid ones otherwise."""
    name = ALIASES.get(strategy, strategy)
    if name not in SHARDED_PARTS:
        valid = ", ".join(STRATEGIES + tuple(ALIASES))
        raise ValueError(f"unknown strategy {strategy!r}; valid strategies: {valid}")
    return name


def _check_counts(num_params: int, world_size: int) -> None:
    if num_params < 0:
        raise ValueError(f"num_params must be >= 0, got {num_params}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")


def bytes_per_param(*, mixed_precision: bool = False) -> dict[str, int]:
    """Bytes each model-state part costs per parameter."""
    return dict(MIXED_PRECISION_ADAM_BYTES if mixed_precision else FP32_ADAM_BYTES)


def model_states_bytes_per_rank(
    num_params: int,
    world_size: int,
    strategy: str,
    *,
    mixed_precision: bool = False,
    padded_num_params: int | None = None,
) -> dict:
    """Model-state bytes one rank holds between steps: `params`, `grads`, `optimizer`, `total`.

    A sharded part holds ceil(Ψ/N) elements per rank (a flat buffer padded to a
    multiple of N, so every rank's shard is the same size). With
    `padded_num_params` (see `fsdp_padded_numel`), a sharded part holds exactly
    padded_num_params/N elements: FSDP2 pads each parameter's dim 0 to a multiple
    of N, and that padding is what a measured run allocates.
    """
    _check_counts(num_params, world_size)
    name = canonical_strategy(strategy)
    if padded_num_params is None:
        sharded_numel = -(-num_params // world_size)
    else:
        if padded_num_params < num_params or padded_num_params % world_size:
            raise ValueError(
                f"padded_num_params ({padded_num_params}) must be >= num_params ({num_params}) "
                f"and a multiple of world_size ({world_size})"
            )
        sharded_numel = padded_num_params // world_size
    per_param = bytes_per_param(mixed_precision=mixed_precision)
    result = {
        part: per_param[part] * (sharded_numel if part in SHARDED_PARTS[name] else num_params)
        for part in MODEL_STATE_PARTS
    }
    result["total"] = sum(result.values())
    return result


def communication_bytes_per_step(
    num_params: int, world_size: int, strategy: str, *, bytes_per_element: int = 4
) -> dict:
    """Communication one rank takes part in per training step.

    `elements` and `bytes` follow the paper's accounting (2Ψ for DDP and stages
    1-2, 3Ψ for stage 3, whatever N). `wire_bytes` is derived from ring
    algorithms: all-gather and reduce-scatter send (N-1)/N·S per rank, all-reduce
    2(N-1)/N·S; it is 0 on one rank. `collectives` lists what runs, in order.
    """
    _check_counts(num_params, world_size)
    name = canonical_strategy(strategy)
    buffer_bytes = num_params * bytes_per_element
    elements = COMMUNICATION_MULTIPLE[name] * num_params
    collectives = []
    wire_bytes = 0
    for op, phase, ring_factor in COLLECTIVES_PER_STEP[name]:
        op_wire_bytes = ring_factor * (world_size - 1) * buffer_bytes // world_size
        wire_bytes += op_wire_bytes
        collectives.append(
            {"op": op, "phase": phase, "elements": num_params, "bytes": buffer_bytes, "wire_bytes": op_wire_bytes}
        )
    return {
        "elements": elements,
        "bytes": elements * bytes_per_element,
        "multiple_of_params": COMMUNICATION_MULTIPLE[name],
        "wire_bytes": wire_bytes,
        "wire_bytes_derived_from": "ring all-gather/reduce-scatter (N-1)/N*S, all-reduce 2(N-1)/N*S",
        "collectives": collectives,
    }


def fsdp_padded_numel(shapes: Iterable[Sequence[int]], world_size: int) -> int:
    """Total elements after FSDP2 pads each parameter's dim 0 up to a multiple of world_size.

    Per rank that is exactly padded_numel / world_size elements. A 0-dim
    parameter counts as shape (1,).
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    total = 0
    for shape in shapes:
        dims = tuple(shape) or (1,)
        padded_dim0 = -(-dims[0] // world_size) * world_size
        total += padded_dim0 * math.prod(dims[1:])
    return total
