"""The ZeRO paper's analytic model: model-state memory and communication per rank.

Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models" (SC 2020), sections 3 and 7. Pure arithmetic on integers, no
torch, so the CLI can answer for a trillion parameters instantly and every
measured run can show its prediction beside it.

Model states per parameter (Ψ parameters, Adam):
- fp32 training:        params 4 B, grads 4 B, optimizer 8 B (exp_avg, exp_avg_sq).
- mixed precision (§3.1): params 2 B (fp16), grads 2 B, optimizer K = 12 B
  (fp32 master copy, exp_avg, exp_avg_sq).

Each stage shards more of them over the N data-parallel ranks (`Strategy.sharded_parts`):
ddp nothing, zero1 (P_os) the optimizer, zero2 (P_os+g) also the gradients,
zero3 (P_os+g+p, alias fsdp) also the parameters.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence

from sharding_lab.strategies import MODEL_STATE_PARTS, Strategy

# Bytes per parameter for each part: fp32 Adam, and the paper's mixed-precision Adam.
FP32_ADAM_BYTES: dict[str, int] = {"params": 4, "grads": 4, "optimizer": 8}
ADAM_OPTIMIZER_MULTIPLIER_K = 12
MIXED_PRECISION_ADAM_BYTES: dict[str, int] = {"params": 2, "grads": 2, "optimizer": ADAM_OPTIMIZER_MULTIPLIER_K}


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
    strategy: Strategy | str,
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
    sharded_parts = Strategy.parse(strategy).sharded_parts
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
        part: per_param[part] * (sharded_numel if part in sharded_parts else num_params)
        for part in MODEL_STATE_PARTS
    }
    result["total"] = sum(result.values())
    return result


# Element sizes on the wire. The paper's mixed precision moves fp16 everywhere (2 B); FSDP2's
# MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32), as this engine runs it, all-gathers bf16
# parameters (2 B) but reduce-scatters fp32 gradients (4 B); DDP's mixed precision reduces in fp32 too.
# reduce_dtype=fp32 is this engine's choice: FSDP2's default (None) reduces in param_dtype, bf16.
FP32_WIRE = {"gather": 4, "reduce": 4}
PAPER_MIXED_PRECISION_WIRE = {"gather": 2, "reduce": 2}
PYTORCH_MIXED_PRECISION_WIRE = {"gather": 2, "reduce": 4}


def communication_bytes_per_step(
    num_params: int,
    world_size: int,
    strategy: Strategy | str,
    *,
    bytes_per_element: int | None = None,
    gather_bytes_per_element: int = 4,
    reduce_bytes_per_element: int = 4,
) -> dict:
    """Communication one rank takes part in per training step.

    `elements` follow the paper's accounting (2Ψ for DDP and stages 1-2, 3Ψ for stage 3, whatever N).
    Each collective's bytes use its element size: all-gathers (and broadcasts) move parameters at
    `gather_bytes_per_element`, reduce-scatters and all-reduces move gradients at
    `reduce_bytes_per_element`; `bytes_per_element` sets both. `wire_bytes` is derived from ring
    algorithms: all-gather and reduce-scatter send (N-1)/N·S per rank, all-reduce 2(N-1)/N·S; it is 0
    on one rank. `collectives` lists what runs, in order.
    """
    _check_counts(num_params, world_size)
    if bytes_per_element is not None:
        gather_bytes_per_element = reduce_bytes_per_element = bytes_per_element
    plan = Strategy.parse(strategy)
    collectives = []
    for collective in plan.collectives_per_step:
        reduces = collective.op in ("reduce_scatter", "all_reduce")
        buffer_bytes = num_params * (reduce_bytes_per_element if reduces else gather_bytes_per_element)
        collectives.append(
            {
                "op": collective.op,
                "phase": collective.phase,
                "elements": num_params,
                "bytes": buffer_bytes,
                "wire_bytes": ring_wire_bytes(collective.op, buffer_bytes, world_size),
            }
        )
    return {
        "elements": plan.communication_multiple * num_params,
        # The paper counts an all-reduce twice: a reduce-scatter plus an all-gather.
        "bytes": sum((2 if c["op"] == "all_reduce" else 1) * c["bytes"] for c in collectives),
        "multiple_of_params": plan.communication_multiple,
        "wire_bytes": sum(c["wire_bytes"] for c in collectives),
        "wire_bytes_derived_from": "ring all-gather/reduce-scatter (N-1)/N*S, all-reduce 2(N-1)/N*S",
        "collectives": collectives,
    }


def zero1_partition(numels: Sequence[int], world_size: int) -> list[int]:
    """Elements of optimizer state each rank owns under PyTorch's ZeroRedundancyOptimizer: whole
    tensors, largest first (a stable sort), each to the rank with the fewest elements so far (the
    lowest rank on a tie). DeepSpeed's ZeRO-1 instead splits one flat buffer into N equal parts."""
    return [sum(tensors) for tensors in zero1_placement(numels, world_size)]


def zero1_placement(numels: Sequence[int], world_size: int) -> list[list[int]]:
    """Per rank, the tensors (their elements) `zero1_partition` gives it, in the order it is given
    them: largest first. That is also the order its local optimizer steps them in."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    placed: list[list[int]] = [[] for _ in range(world_size)]
    # A heap of (elements so far, rank): its smallest is the rank with the fewest, the lowest on a tie,
    # in log N per tensor (a 100,000-GPU plan has 1,500 tensors to place).
    least = [(0, rank) for rank in range(world_size)]
    for numel in sorted(numels, reverse=True):
        count, rank = heapq.heappop(least)
        placed[rank].append(numel)
        heapq.heappush(least, (count + numel, rank))
    return placed


def adam_step_temporaries(numels: Sequence[int]) -> int:
    """Elements of the temporaries `torch.optim.Adam(foreach=False)` holds at its step's fullest moment,
    stepping tensors of these sizes in this order. Each tensor's update makes `sqrt(exp_avg_sq)` and its
    quotient (two temporaries its size) while the loop's `denom` still holds the previous tensor's
    quotient: at tensor i, numels[i-1] + 2 * numels[i]. (PyTorch's implementation, torch 2.11-2.13.)"""
    peak, previous = 0, 0
    for numel in numels:
        peak = max(peak, previous + 2 * numel)
        previous = numel
    return peak


def fsdp_shard_numel(shape: Sequence[int], world_size: int) -> int:
    """Elements of one rank's shard of a parameter: FSDP2 pads dim 0 up to a multiple of N, so every
    rank's shard is ceil(dim0/N) rows. A 0-dim parameter counts as shape (1,)."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    dims = tuple(shape) or (1,)
    return -(-dims[0] // world_size) * math.prod(dims[1:])


def fsdp_rank_numel(shape: Sequence[int], world_size: int, rank: int) -> int:
    """Elements rank `rank` really holds of a parameter, padding left out: FSDP2 splits dim 0 as
    torch.chunk does, ceil(dim0/N) rows per rank until the rows run out, so the last ranks may hold
    fewer rows, or none."""
    shard = fsdp_shard_numel(shape, world_size)
    return max(0, min(shard, math.prod(shape) - rank * shard))


def fsdp_padded_numel(shapes: Iterable[Sequence[int]], world_size: int) -> int:
    """Total elements after FSDP2 pads each parameter's dim 0 up to a multiple of world_size.

    Per rank that is exactly padded_numel / world_size elements.
    """
    return sum(world_size * fsdp_shard_numel(shape, world_size) for shape in shapes)


def ring_wire_bytes(op: str, logical_bytes: int, world_size: int) -> int:
    """Bytes each rank sends for one collective over a buffer of `logical_bytes`, by the ring
    algorithms (derived, not measured): all-gather, reduce-scatter and a pipelined broadcast
    (N-1)/N·S, all-reduce 2(N-1)/N·S (a reduce-scatter plus an all-gather)."""
    n = world_size
    if op in ("all_gather", "reduce_scatter", "broadcast"):
        return (n - 1) * logical_bytes // n
    if op == "all_reduce":
        return 2 * (n - 1) * logical_bytes // n
    raise ValueError(f"no ring formula for {op!r}")
