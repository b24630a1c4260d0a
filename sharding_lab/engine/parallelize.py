"""One `parallelize` function that applies a data-parallel strategy to a model, torchtitan style.

The model knows nothing of parallelism. `parallelize(model, strategy, mesh, options)` wraps or shards
it and returns the model with a factory for the optimizer that strategy needs, because ZeRO-1 shards
the optimizer itself while the FSDP strategies shard the parameters the optimizer sees.

Order for a model built on the meta device: FSDP strategies shard first and materialize after
(`to_empty`, then `init_weights()`), so no rank ever holds the full model; DDP strategies need real
parameters before wrapping, because DDP broadcasts rank 0's parameters when it is constructed.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel

from sharding_lab.engine import _torch_internals as internals
from sharding_lab.run_config import ParallelOptions
from sharding_lab.strategies import Strategy

OptimizerFactory = Callable[[], torch.optim.Optimizer]
HSDP_DIMS = ("replicate", "shard")  # HSDP's mesh: FSDP2 reads dim 0 as replicate, dim 1 as shard


def data_parallel_mesh(device_type: str, world_size: int, replicas: int = 1) -> DeviceMesh:
    """The mesh a strategy runs on: 1-D over every rank ("dp"), or HSDP's replicas x shards.

    Needs the default process group. Under HSDP, ranks r*shards .. (r+1)*shards-1 form replica r's
    shard group, so a shard group's ranks are neighbours (one node, in a real cluster).
    """
    if replicas == 1:
        return init_device_mesh(device_type, (world_size,), mesh_dim_names=("dp",))
    return init_device_mesh(device_type, (replicas, world_size // replicas), mesh_dim_names=HSDP_DIMS)


def parallelize(
    model: nn.Module, strategy: Strategy | str, mesh: DeviceMesh, options: ParallelOptions | None = None
) -> tuple[nn.Module, OptimizerFactory]:
    """Apply `strategy` over `mesh` (from `data_parallel_mesh`); return the model and its optimizer factory.

    The model must expose `model.blocks` (the units FSDP shards one at a time) and
    `model.activation_checkpointing` (whether each block's forward is recomputed in backward).
    """
    options = options or ParallelOptions()
    strategy = Strategy.parse(strategy)
    if mesh.ndim != (1 if options.replicas == 1 else 2):
        raise ValueError(f"replicas={options.replicas} needs a {1 if options.replicas == 1 else 2}-D mesh, got {mesh}")
    # Checkpointing is the model's own business (it wraps each block's call); set before any wrapper.
    model.activation_checkpointing = options.activation_checkpointing
    if strategy.uses_ddp:
        return _apply_ddp(model, strategy, mesh, options)
    reshard = strategy.reshard_after_forward(options.reshard_after_forward)
    return _apply_fsdp(model, mesh, options, reshard_after_forward=reshard)


def _adam(params, lr: float) -> torch.optim.Optimizer:
    # foreach=False: one plain loop, so optimizer state is exactly two fp32 tensors per parameter
    # and no hidden temporaries; fused kernels do not exist for every device we run on.
    return torch.optim.Adam(params, lr=lr, foreach=False)


def _apply_ddp(
    model: nn.Module, strategy: Strategy, mesh: DeviceMesh, options: ParallelOptions
) -> tuple[nn.Module, OptimizerFactory]:
    device = next(model.parameters()).device
    mixed_precision = None
    if options.mixed_precision:
        # DDP's own (still private) mixed precision: bf16 copies for compute, fp32 reduction. It
        # records CUDA events to order its parameter copies, so it runs on CUDA only.
        if device.type != "cuda":
            raise ValueError(f"{strategy} with mixed precision needs CUDA (DDP's mixed precision uses CUDA events)")
        mixed_precision = internals.ddp_mixed_precision(torch.bfloat16, torch.float32)
    ddp_model = DistributedDataParallel(
        model,
        device_ids=[device.index] if device.type == "cuda" else None,
        process_group=mesh.get_group(),
        # Gradients live inside DDP's all-reduce buckets instead of beside them: one copy, not two.
        gradient_as_bucket_view=True,
        mixed_precision=mixed_precision,
    )
    if strategy is Strategy.DDP:
        return ddp_model, lambda: _adam(ddp_model.parameters(), options.lr)

    def make_zero1_optimizer() -> torch.optim.Optimizer:
        # Imported here: torch.distributed.optim takes 0.23 s to import, which the FSDP strategies
        # (and so every `plan --simulate`) would pay for nothing.
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(
            ddp_model.parameters(),
            optimizer_class=torch.optim.Adam,
            process_group=mesh.get_group(),
            lr=options.lr,
            foreach=False,
        )

    return ddp_model, make_zero1_optimizer


def _apply_fsdp(
    model: nn.Module, mesh: DeviceMesh, options: ParallelOptions, *, reshard_after_forward: bool
) -> tuple[nn.Module, OptimizerFactory]:
    # One config shared by every fully_shard call, as torchtitan does.
    # A 2-D mesh makes it HSDP: shard on dim 1, replicate on dim 0.
    fsdp_config: dict = {"mesh": mesh}
    if options.mixed_precision:
        fsdp_config["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if options.cpu_offload:
        # Pinned host memory needs CUDA; on a CPU mesh the "host" copies are plain CPU tensors anyway.
        fsdp_config["offload_policy"] = CPUOffloadPolicy(pin_memory=mesh.device_type == "cuda")

    # 1. Each block is its own unit: one all-gather and one reduce-scatter per block.
    blocks = list(model.blocks)
    for block in blocks:
        fully_shard(block, **fsdp_config, reshard_after_forward=reshard_after_forward)
    # 2. The root takes what is left (embeddings, final norm, head). Backward needs it first, so it
    #    is never resharded after forward (FSDP's own default for the root).
    fully_shard(model, **fsdp_config, reshard_after_forward=False)

    # 3. Prefetching, explicit either way so the measurements do not depend on FSDP's defaults. The
    #    forward order is root, blocks[0], ..., blocks[-1]; backward runs it in reverse.
    order = [model, *blocks]
    for i, module in enumerate(order):
        if options.prefetch:
            module.set_modules_to_forward_prefetch(blocks[i : i + 1])  # the module after this one
            module.set_modules_to_backward_prefetch(blocks[i - 2 : i - 1] if i >= 2 else [])
        else:
            # An empty explicit list means "FSDP's default", which still prefetches in backward.
            internals.disable_implicit_backward_prefetch(module)
    if options.prefetch:
        model.set_modules_to_backward_prefetch([blocks[-1]])  # backward starts at the root

    # 4. Only to show the gradient-parity check can fail: sum instead of average.
    if options.gradient_divide_factor is not None:
        for module in order:
            # Plain sums on the wire, then a division by the factor: gloo has no pre-multiplied sum.
            module.set_force_sum_reduction_for_comms(True)
            module.set_gradient_divide_factor(options.gradient_divide_factor)

    return model, lambda: _adam(model.parameters(), options.lr)
