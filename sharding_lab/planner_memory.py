"""The planner's memory model: what one rank holds at each moment a training step can peak.

Derived for our GPT (`sharding_lab/engine/model.py`: nanoGPT's shape, 4x GELU MLP, LayerNorm, SDPA) run as
`sharding_lab/engine/parallelize.py` runs it, and calibrated against the FSDP2 simulation
(`engine/simulate.py`: FakeTensorMode on CPU, FSDPMemTracker), which it matches to the byte on the configs
in tests/test_planner.py. No torch here: the web app imports this.

Notation: B·T tokens per micro-batch, C width, nh heads, V vocabulary, L blocks; `act` the compute
dtype's bytes (4 fp32, 2 bf16 under mixed precision), `param` the gathered parameters' bytes (the same),
S the ranks a parameter is sharded over (N, or N / replicas under HSDP).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sharding_lab.analytic import fsdp_padded_numel, zero1_partition
from sharding_lab.strategies import Strategy

FP32 = 4
INT64 = 8
REDUCE_BYTES = 4  # FSDP2 reduces in fp32 (MixedPrecisionPolicy(reduce_dtype=fp32)); DDP's buckets are fp32
ADAM_STEP_COUNTER_BYTES = 4  # torch.optim.Adam's float32 `step` per parameter tensor


def block_saved_bytes(tokens: int, width: int, heads: int, act: int) -> int:
    """What one Block saves for backward, counted tensor by tensor (per token, at `act` bytes unless said):

        ln_1's input x                                  C   (the block's input; LayerNorm saves it)
        ln_1's output (c_attn's input)                  C
        c_attn's output q, k, v (SDPA saves the views)  3C
        SDPA's output (c_proj's input)                  C   its flash layout is (B, T, nh, hs), so
                                                            `.transpose(1, 2).contiguous()` is the same storage
        x + attn (ln_2's input)                         C
        ln_2's output (c_fc's input)                    C
        c_fc's output (GELU's input)                    4C
        GELU's output (c_proj's input)                  4C
                                                        = 16C
        SDPA's logsumexp                                nh  (fp32)
        ln_1's and ln_2's mean and rstd                 4   (the compute dtype on CPU; fp32 on CUDA, which
                                                            adds 8 B per token per block under bf16)

    The residual adds' other operands and c_proj's outputs are not saved (an add needs nothing).
    """
    return tokens * (16 * width * act + heads * FP32 + 4 * act)


def outside_blocks_saved_bytes(tokens: int, seq: int, width: int, vocab: int, act: int) -> int:
    """Saved for backward outside the blocks: ln_f's input and output (2C) and its mean and rstd (2),
    cross-entropy's log-softmax output (V) per token; the position indices (T, int64), and the loss and
    nll_loss's total weight (two scalars). The logits themselves are not saved (log-softmax's backward
    needs only its output)."""
    return tokens * (2 * width + 2 + vocab) * act + seq * INT64 + 2 * act


def inputs_bytes(tokens: int) -> int:
    """The micro-batch's token ids and targets, int64."""
    return 2 * tokens * INT64


@dataclass(frozen=True)
class Moment:
    """Bytes one rank holds at one moment of the step, by category (what FSDPMemTracker would count)."""

    name: str  # where in the step: "loss backward", "block 30 backward", "end of backward", "optimizer step"
    parameters: int = 0  # sharded fp32 parameters, plus gathered (unsharded) ones in use
    gradients: int = 0  # sharded gradients, and unsharded ones not yet reduced
    optimizer_state: int = 0  # Adam's exp_avg and exp_avg_sq (fp32) and its step counters
    activations: int = 0  # saved for backward, the micro-batch's inputs included
    temporaries: int = 0  # gradients of activations, loss gradients
    all_gather_buffers: int = 0  # a prefetched unit's gathered parameters
    reduce_scatter_buffers: int = 0  # a unit's gradients waiting to be, or being, reduce-scattered
    host: int = 0  # CPU offload: what lives in host memory instead (not part of `total`)

    @property
    def total(self) -> int:
        return (
            self.parameters + self.gradients + self.optimizer_state + self.activations + self.temporaries
            + self.all_gather_buffers + self.reduce_scatter_buffers
        )


@dataclass(frozen=True)
class StepShape:
    """What the memory model needs of a request, reduced to counts (built by `planner.plan_analytic`)."""

    strategy: Strategy
    shard_ranks: int  # S: the ranks parameters are sharded over
    world_size: int
    layers: int
    width: int
    heads: int
    vocab: int
    tied: bool
    bias: bool
    block_shapes: tuple[tuple[int, ...], ...]  # one block's parameter shapes
    root_shapes: tuple[tuple[int, ...], ...]  # wte, wpe, ln_f, lm_head (unless tied)
    micro_batch: int
    seq: int
    mixed_precision: bool
    activation_checkpointing: bool
    cpu_offload: bool
    grad_accum_steps: int
    prefetch: bool

    @property
    def tokens(self) -> int:
        return self.micro_batch * self.seq

    @property
    def act(self) -> int:
        return 2 if self.mixed_precision else FP32

    @property
    def block_numel(self) -> int:
        return sum(math.prod(s) for s in self.block_shapes)

    @property
    def root_numel(self) -> int:
        return sum(math.prod(s) for s in self.root_shapes)

    @property
    def num_params(self) -> int:
        return self.layers * self.block_numel + self.root_numel

    @property
    def num_tensors(self) -> int:
        return self.layers * len(self.block_shapes) + len(self.root_shapes)


def peak_moments(step: StepShape) -> list[Moment]:
    """Every moment the model considers; the peak is the largest `total`."""
    if step.strategy.fully_sharded:
        return _fsdp_moments(step)
    return _ddp_moments(step)


def peak(step: StepShape) -> Moment:
    return max(peak_moments(step), key=lambda moment: moment.total)


def _activations_at_block(step: StepShape, i: int) -> int:
    """Saved bytes while block i's backward runs: blocks below it, block i whole (recomputed under
    checkpointing, where the blocks below keep only their inputs), the position indices, loss scalars."""
    t, act = step.tokens, step.act
    full_block = block_saved_bytes(t, step.width, step.heads, act)
    below = i * (t * step.width * act if step.activation_checkpointing else full_block)
    return below + full_block + step.seq * INT64 + 2 * act + inputs_bytes(t)


def _all_activations(step: StepShape) -> int:
    t, act = step.tokens, step.act
    per_block = t * step.width * act if step.activation_checkpointing else block_saved_bytes(t, step.width, step.heads, act)
    outside = outside_blocks_saved_bytes(t, step.seq, step.width, step.vocab, act)
    return step.layers * per_block + outside + inputs_bytes(t)


def _block_backward_temporaries(step: StepShape) -> int:
    """At c_proj's backward in the MLP: the gradient arriving at the block's output (C per token),
    c_proj's input gradient (4C per token), and c_proj's weight and bias gradients (unsharded)."""
    c = step.width
    return step.tokens * 5 * c * step.act + (4 * c * c + (c if step.bias else 0)) * step.act


def _root_head_grad_numel(step: StepShape) -> int:
    """Root gradients that exist from the head's backward on: lm_head (or the tied wte) and ln_f."""
    return step.vocab * step.width + (2 if step.bias else 1) * step.width


def _fsdp_moments(step: StepShape) -> list[Moment]:
    s, act, param = step.shard_ranks, step.act, step.act
    zero3 = step.strategy is Strategy.ZERO3
    all_shapes = [*step.root_shapes, *step.block_shapes * step.layers]
    sharded = fsdp_padded_numel(all_shapes, s) // s
    block_sharded = fsdp_padded_numel(step.block_shapes, s) // s
    block_gathered = fsdp_padded_numel(step.block_shapes, s)
    root_gathered = step.root_numel * param  # the root stays unsharded from forward to the end of backward
    params_sharded = FP32 * sharded
    optimizer = 2 * FP32 * sharded + ADAM_STEP_COUNTER_BYTES * step.num_tensors
    host = 0
    if step.cpu_offload:  # CPUOffloadPolicy: sharded parameters, gradients and Adam state in host memory
        host = params_sharded + FP32 * sharded + optimizer
        params_sharded = optimizer = 0
    grads_sharded = lambda blocks: 0 if step.cpu_offload else FP32 * block_sharded * blocks  # noqa: E731
    # Gradient accumulation: the micro-batches before the last keep every unsharded gradient, in fp32.
    accumulated = FP32 * step.num_params if step.grad_accum_steps > 1 else 0
    prefetched = block_gathered * param if (zero3 and step.prefetch) else 0
    moments = []

    # 1. Backward starts at the loss: every activation saved, plus two (B·T, V) gradients (nll_loss's and
    #    log-softmax's), the root gathered, and (zero3) the last block's prefetched all-gather.
    moments.append(Moment(
        "loss backward",
        parameters=params_sharded + root_gathered + (0 if zero3 else step.layers * block_gathered * param),
        gradients=accumulated,
        optimizer_state=optimizer,
        activations=_all_activations(step),
        temporaries=2 * step.tokens * step.vocab * act,
        all_gather_buffers=prefetched,
        host=host,
    ))
    # 2. Each block's backward (at its MLP's c_proj): fewer activations, more reduced gradients.
    for i in reversed(range(step.layers)):
        above = step.layers - 1 - i
        moments.append(Moment(
            f"block {i} backward",
            parameters=params_sharded + root_gathered + (1 if zero3 else i + 1) * block_gathered * param,
            gradients=(accumulated or grads_sharded(above)) + _root_head_grad_numel(step) * param,
            optimizer_state=optimizer,
            activations=_activations_at_block(step, i),
            temporaries=_block_backward_temporaries(step),
            all_gather_buffers=prefetched if i > 0 else 0,
            reduce_scatter_buffers=REDUCE_BYTES * block_gathered if above else 0,
            host=host,
        ))
    # 3. The end of backward, at the embeddings: every block reduced, the root's gradients unsharded, the
    #    first block's reduce-scatter buffer not yet freed; of the activations only the loss scalars and
    #    the inputs are left (the position indices went with wpe's backward).
    tail_activations = 2 * act + inputs_bytes(step.tokens)
    moments.append(Moment(
        "end of backward",
        parameters=params_sharded + root_gathered,
        gradients=(accumulated or grads_sharded(step.layers)) + step.root_numel * param,
        optimizer_state=optimizer,
        activations=tail_activations,
        temporaries=step.tokens * step.width * act,
        reduce_scatter_buffers=REDUCE_BYTES * block_gathered,
        host=host,
    ))
    # 4. The root's reduce-scatter: its gradients copied into one fp32 buffer (the unsharded ones freed).
    moments.append(Moment(
        "root reduce-scatter",
        parameters=params_sharded + root_gathered,
        gradients=grads_sharded(step.layers),
        optimizer_state=optimizer,
        activations=tail_activations,
        reduce_scatter_buffers=REDUCE_BYTES * fsdp_padded_numel(step.root_shapes, s),
        host=host,
    ))
    # 5. The optimizer step: every model state at once (Adam's per-tensor temporaries left out).
    moments.append(Moment(
        "optimizer step",
        parameters=params_sharded,
        gradients=0 if step.cpu_offload else FP32 * sharded,
        optimizer_state=optimizer,
        host=host,
    ))
    return moments


def _ddp_moments(step: StepShape) -> list[Moment]:
    """DDP and PyTorch's ZeRO-1 (DDP + ZeroRedundancyOptimizer), not checked against a simulation: full fp32
    parameters (plus DDP's bf16 copies under its mixed precision), fp32 gradients that are the all-reduce
    buckets (gradient_as_bucket_view, so they exist all step), Adam state whole (ddp) or the largest rank's
    share of whole tensors (zero1)."""
    psi, act = step.num_params, step.act
    parameters = FP32 * psi + (2 * psi if step.mixed_precision else 0)
    if step.strategy is Strategy.ZERO1:
        numels = [math.prod(s) for s in [*step.root_shapes, *step.block_shapes * step.layers]]
        owned = max(zero1_partition(numels, step.world_size))
        tensors = -(-step.num_tensors // step.world_size)
        optimizer = 2 * FP32 * owned + ADAM_STEP_COUNTER_BYTES * tensors
    else:
        optimizer = 2 * FP32 * psi + ADAM_STEP_COUNTER_BYTES * step.num_tensors
    gradients = FP32 * psi
    moments = [Moment(
        "loss backward", parameters=parameters, gradients=gradients, optimizer_state=optimizer,
        activations=_all_activations(step), temporaries=2 * step.tokens * step.vocab * act,
    )]
    for i in reversed(range(step.layers)):
        moments.append(Moment(
            f"block {i} backward", parameters=parameters, gradients=gradients, optimizer_state=optimizer,
            activations=_activations_at_block(step, i), temporaries=_block_backward_temporaries(step),
        ))
    moments.append(Moment("optimizer step", parameters=parameters, gradients=gradients, optimizer_state=optimizer))
    return moments
