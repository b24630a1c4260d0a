"""The planner's communication model: the collectives one rank takes part in per optimizer step.

Counted as PyTorch issues them for the engine's strategies (not the ZeRO paper's 2Ψ/3Ψ accounting, which
`analytic.communication_bytes_per_step` keeps): each collective's logical bytes (the buffer at the API),
on the mesh dimension it runs on, with its dtype, how many calls, and wire bytes per rank DERIVED from
ring formulas (`analytic.ring_wire_bytes`), never measured. No torch here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from sharding_lab.analytic import fsdp_padded_numel, ring_wire_bytes
from sharding_lab.strategies import Strategy

WIRE_DERIVATION = "derived from ring formulas: all-gather, reduce-scatter, broadcast (n-1)/n·S; all-reduce 2(n-1)/n·S"
# What a plan with no collective says instead (FSDP2 on one GPU: a shard group of one rank, no replicas).
NO_COLLECTIVES = ("none (on a shard group of one GPU FSDP2 gathers and reduce-scatters nothing: it copies each "
                  "shard into its parameter and each gradient into its shard)")


class MeshDim(str, Enum):
    """The mesh dimension a collective runs over."""

    DATA_PARALLEL = "dp"  # the 1-D mesh: every rank
    SHARD = "shard"  # HSDP: the ranks one replica is sharded over
    REPLICATE = "replicate"  # HSDP: the same shard's ranks across replicas

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Collective:
    """One kind of collective in an optimizer step, summed over its calls."""

    op: str  # all_gather, reduce_scatter, all_reduce, broadcast
    phase: str  # forward, backward, optimizer
    mesh_dim: MeshDim
    ranks: int  # ranks on that dimension
    dtype: str  # bf16 or fp32
    calls: int | None  # calls per optimizer step (None: DDP's buckets, sized by DDP)
    logical_bytes: int  # per rank per optimizer step, at the API
    wire_bytes_derived: int  # per rank per optimizer step, from the ring formula for `ranks` ranks
    holds: str


def _collective(op, phase, dim, ranks, element_bytes, numel, calls, holds) -> Collective:
    logical = numel * element_bytes
    return Collective(
        op=op, phase=phase, mesh_dim=dim, ranks=ranks, dtype="bf16" if element_bytes == 2 else "fp32",
        calls=calls, logical_bytes=logical, wire_bytes_derived=ring_wire_bytes(op, logical, ranks), holds=holds,
    )


def collectives_per_step(
    strategy: Strategy,
    shards: int,
    replicas: int,
    parameter_shapes: Sequence[tuple[str, tuple[int, ...]]],
    *,
    mixed_precision: bool = False,
    grad_accum_steps: int = 1,
    cpu_offload: bool = False,
) -> tuple[Collective, ...]:
    """Every collective per optimizer step of `grad_accum_steps` micro-batches.

    FSDP2 (zero2, zero3): per micro-batch, forward all-gathers every unit (the blocks and the root) in
    the compute dtype; zero3 gathers the blocks again in backward (the root is not resharded after
    forward). Gradients are reduce-scattered in fp32 only on the last micro-batch (earlier ones keep
    unsharded gradients); under HSDP the reduced shard is then all-reduced across replicas. On a shard
    group of one rank (one GPU, or a mesh Rx1) FSDP2 issues neither: only HSDP's all-reduce is left. DDP
    all-reduces fp32 gradient buckets once per step (`no_sync` before); PyTorch's ZeRO-1 adds a
    broadcast of every updated parameter from the rank that owns it. CPU offload moves shards between
    host and device but adds no collective.
    """
    del cpu_offload  # same collectives; the host copies are not collectives
    k = grad_accum_steps
    gather_bytes = 2 if mixed_precision else 4
    shapes = [s for _, s in parameter_shapes]
    blocks = [s for n, s in parameter_shapes if n.startswith("blocks.")]
    units = 1 + len({n.split(".")[1] for n, _ in parameter_shapes if n.startswith("blocks.")})
    if not strategy.fully_sharded:
        numel = sum(math.prod(s) for s in shapes)
        holds = "PyTorch DDP (fp32 buckets, also under its mixed precision); any model of this size"
        result = [_collective("all_reduce", "backward", MeshDim.DATA_PARALLEL, shards, 4, numel, None, holds)]
        if strategy is Strategy.ZERO1:
            holds = ("PyTorch ZeroRedundancyOptimizer: each owner broadcasts its updated fp32 parameters; wire "
                     "bytes are the mean over ranks (a ring's forwarding ranks send a whole buffer)")
            result.append(_collective("broadcast", "optimizer", MeshDim.DATA_PARALLEL, shards, 4, numel,
                                      len(shapes), holds))
        return tuple(result)

    shard_dim = MeshDim.SHARD if replicas > 1 else MeshDim.DATA_PARALLEL
    padded = fsdp_padded_numel(shapes, shards)
    holds = (f"PyTorch FSDP2 as the engine runs it, this model's shapes with FSDP2's padding to {shards} "
             f"shards; {'bf16 all-gathers, fp32 reductions' if mixed_precision else 'fp32'}")
    result = []
    # A shard group of one rank issues neither: FSDPParamGroup.unshard returns before its all-gather and
    # wait_for_unshard copies each shard into its parameter; foreach_reduce copies the gradients instead
    # of reduce-scattering them (torch 2.11-2.13). HSDP's all-reduce across replicas still runs.
    if shards > 1:
        result.append(_collective("all_gather", "forward", shard_dim, shards, gather_bytes, k * padded, k * units,
                                  holds))
        if strategy is Strategy.ZERO3:
            padded_blocks = fsdp_padded_numel(blocks, shards)
            result.append(_collective("all_gather", "backward", shard_dim, shards, gather_bytes,
                                      k * padded_blocks, k * (units - 1), holds))
        result.append(_collective("reduce_scatter", "backward", shard_dim, shards, 4, padded, units, holds))
    if replicas > 1:
        result.append(_collective("all_reduce", "backward", MeshDim.REPLICATE, replicas, 4, padded // shards,
                                  units, holds + "; HSDP: the reduced shard across replicas"))
    return tuple(result)
