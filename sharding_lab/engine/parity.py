"""Gradient parity: a distributed step's full gradient against one process on the same global batch.

Every data-parallel strategy promises the gradient of the mean loss over the global batch. Rank 0
rebuilds the model unsharded from the gathered parameters, runs the concatenation of every rank's
batch through it, and compares gradients parameter by parameter. A reduction that sums instead of
averaging (reported for FSDP2 on gloo) shows up as a relative error of N - 1.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor

TOLERANCE = 1e-5  # fp32; different reduction orders stay far below it
MIXED_PRECISION_TOLERANCE = 5e-2  # bf16 compute keeps 8 bits of mantissa: errors of 1e-2 are normal


def relative_error(measured: torch.Tensor, reference: torch.Tensor) -> float:
    """||measured - reference|| / ||reference|| (Frobenius norms), in float64."""
    measured, reference = measured.double(), reference.double()
    denominator = reference.norm().item()
    difference = (measured - reference).norm().item()
    return difference / denominator if denominator else difference


def _full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor on this rank; gathering a DTensor is a collective every rank must join."""
    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()


def gradient_parity(
    ctx,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    config,
    batch_for_rank: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
    tolerance: float = TOLERANCE,
) -> dict | None:
    """Run one training step on `model` and check its gradient; rank 0 returns the comparison."""
    from sharding_lab.engine.model import GPT

    inner = getattr(model, "module", model)  # DDP keeps the model in .module
    before_step = {name: _full(p) for name, p in inner.named_parameters()}
    idx, targets = batch_for_rank(ctx.rank)
    optimizer.zero_grad(set_to_none=True)
    loss = model(idx, targets)
    loss.backward()
    gradients = {name: _full(p.grad) for name, p in inner.named_parameters()}
    optimizer.step()
    if ctx.rank != 0:
        return None

    reference = GPT(config).to(ctx.device)
    # strict=False only for a tied head, which named_parameters() lists once, as wte.weight.
    missing, unexpected = reference.load_state_dict(before_step, strict=False)
    if unexpected or set(missing) - ({"lm_head.weight"} if config.tied else set()):
        raise RuntimeError(f"the reference model does not match: missing {missing}, unexpected {unexpected}")
    batches = [batch_for_rank(rank) for rank in range(ctx.world_size)]
    global_idx = torch.cat([b[0] for b in batches])
    global_targets = torch.cat([b[1] for b in batches])
    reference_loss = reference(global_idx, global_targets)
    reference_loss.backward()
    errors = {name: relative_error(gradients[name], p.grad) for name, p in reference.named_parameters()}
    worst = max(errors, key=errors.get)
    return {
        "max_relative_error": errors[worst],
        "worst_parameter": worst,
        "tolerance": tolerance,
        "holds": errors[worst] <= tolerance,
        "global_batch_size": int(global_idx.shape[0]),
        "reference_loss": reference_loss.item(),
    }
