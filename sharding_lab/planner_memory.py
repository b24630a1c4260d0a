"""The planner's memory model: what one rank holds at each moment a training step can peak.

Derived for our GPT (`sharding_lab/engine/model.py`: nanoGPT's shape, 4x GELU MLP, LayerNorm, SDPA) run as
`sharding_lab/engine/parallelize.py` runs it. For FSDP2 the step is walked op by op, as the simulation
(`engine/simulate.py`: FakeTensorMode on CPU, FSDPMemTracker) sees it after every op, and each phase's
largest moment kept: it matches the simulation to the byte at 7b x 64 and 70b x 1024 (seq 2048) with every
engine option, and on the small configs in tests/test_planner.py. No torch here: the web app imports this.

Where the peak falls depends on the shape: on small models at the loss's or the MLP's backward; for wide
blocks (C^2 against the tokens) at attn.c_attn's backward, where a whole block's unsharded gradients are held
until its reduce-scatter; for zero2 and with accumulation in the forward, with every block (zero2) or every
gradient (accumulation) held. The gathered root is padded to a multiple of the shards, as FSDP2 pads it.

Notation: B·T tokens per micro-batch, C width, nh heads, V vocabulary, L blocks; `act` the compute
dtype's bytes (4 fp32, 2 bf16 under mixed precision), `param` the gathered parameters' bytes (the same),
S the ranks a parameter is sharded over (N, or N / replicas under HSDP).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from sharding_lab.analytic import adam_step_temporaries, fsdp_padded_numel, zero1_placement
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
    return tokens * (2 * width + 2 + vocab) * act + seq * INT64 + loss_scalars_bytes(act)


def loss_scalars_bytes(act: int) -> int:
    """The loss and nll_loss's total weight, two scalars at the compute dtype, alive from the loss on; one of
    them is gone by the optimizer step (the tracker sees half of these bytes there)."""
    return 2 * act


def inputs_bytes(micro_batch: int, seq: int) -> int:
    """The micro-batch's token ids and targets: two (B, T) int64 tensors (the engine's `training_batch`)."""
    return 2 * micro_batch * seq * INT64


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

    def shapes_in_step_order(self, layers: int | None = None) -> list[tuple[int, ...]]:
        """Every parameter's shape in the model's order, the order Adam steps them: wte, wpe, the blocks,
        ln_f, lm_head. `layers` (default all) repeats fewer blocks: the sequence's pairs of neighbours
        are the same for any two or more."""
        layers = self.layers if layers is None else layers
        return [*self.root_shapes[:2], *self.block_shapes * layers, *self.root_shapes[2:]]

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


def peak_and_padding(step: StepShape) -> tuple[Moment, Moment]:
    """The peak, and FSDP2's padding in its bytes by category (PyTorch's implementation, not the ZeRO
    paper's even Ψ/N): the peak less what the same op holds with every tensor split evenly over the S shards.

    FSDP2 splits each parameter by rows (dim 0) as torch.chunk does, ceil(rows/S) rows a shard, and every
    rank allocates a whole shard (FSDPParam._init_sharded_param: `chunks[0].size()`, "0th always
    padded"); a unit's all-gather output and reduce-scatter input are S such shards. With more shards
    than a tensor's rows, each rank holds one row of it, padding on the ranks past its rows (the fullest
    rank, which the model follows, holds a real row: its Adam state for that row counts here too, as
    what an even split would not give it). DDP and ZeRO-1 pad nothing: zeros."""
    if not step.strategy.fully_sharded:
        top = peak(step)
        return top, Moment(top.name)
    padded = _Ledger()
    moments = _fsdp_moments(step, padded)
    i = max(range(len(moments)), key=lambda k: moments[k].total)  # the first largest, as `peak`
    at = moments[i]
    if fsdp_padded_numel(step.shapes_in_step_order(1), step.shard_ranks) == step.block_numel + step.root_numel:
        return at, Moment(at.name)  # every tensor's rows split evenly: nothing padded
    even = _fsdp_moments(step, _Ledger(replay=padded.kept_ops), unpadded=True)[i]
    return at, Moment(at.name, **{c: getattr(at, c) - getattr(even, c) for c in _CATEGORIES},
                      host=at.host - even.host)


def _even_numel(shapes: Iterable[Sequence[int]], shards: int) -> int:
    """Elements with no padding: each shard would be numel / S (`fsdp_padded_numel`'s unpadded twin)."""
    del shards  # an even split needs no rounding up
    return sum(math.prod(shape) for shape in shapes)


def saved_activations_bytes(step: StepShape) -> int:
    """Everything one micro-batch saves for backward, all held at once when its forward ends: every block's
    saved tensors (only its input under activation checkpointing), what the head and loss save, the inputs."""
    t, act = step.tokens, step.act
    per_block = t * step.width * act if step.activation_checkpointing else block_saved_bytes(t, step.width, step.heads, act)
    outside = outside_blocks_saved_bytes(t, step.seq, step.width, step.vocab, act)
    return step.layers * per_block + outside + inputs_bytes(step.micro_batch, step.seq)


class _Ledger:
    """One rank's bytes by category as the step runs, op by op; keeps the largest moment of each phase
    (the first to reach it), as the simulation's tracker sees the step after every op. Given `replay`
    (the ops another walk kept, `kept_ops`), it keeps those ops' moments instead."""

    def __init__(self, host: int = 0, replay: Sequence[int] = ()) -> None:
        self.held = dict.fromkeys(_CATEGORIES, 0)
        self.host = host
        self.moments: list[Moment] = []
        self.kept_ops: list[int] = []  # the op (counted from 1) each kept moment was taken after
        self._replay = frozenset(replay)
        self._ops = 0
        self._phase = ""
        self._best: Moment | None = None
        self._best_op = 0

    def phase(self, name: str) -> None:
        self._close()
        self._phase = name

    def op(self, at: str, **deltas: int) -> None:
        """One op: its allocations (positive) and frees (negative) by category, then a moment."""
        for category, delta in deltas.items():
            self.held[category] += delta
        self._ops += 1
        if self._replay:
            keep = self._ops in self._replay
        else:
            keep = self._best is None or sum(self.held.values()) > self._best.total
        if keep:
            self._best, self._best_op = Moment(f"{self._phase} ({at})", **self.held, host=self.host), self._ops

    def result(self) -> list[Moment]:
        self._close()
        return self.moments

    def _close(self) -> None:
        if self._best is not None:
            self.moments.append(self._best)
            self.kept_ops.append(self._best_op)
        self._best = None


_CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "temporaries",
               "all_gather_buffers", "reduce_scatter_buffers")


def _block_gradient_bytes(step: StepShape) -> dict[str, int]:
    """One block's parameter gradients by module, at the compute dtype (autograd makes them there)."""
    c, g, bias = step.width, step.act, 1 if step.bias else 0
    ln = (1 + bias) * c * g  # LayerNorm's weight (and bias)
    return {
        "mlp.c_proj": 4 * c * c * g,
        "mlp.c_proj.bias": bias * c * g,  # apart, as c_attn's: checkpointing frees GELU's output between
        "mlp.c_fc": (4 * c * c + bias * 4 * c) * g,
        "ln_2": ln,
        "attn.c_proj": (c * c + bias * c) * g,
        "attn.c_attn": 3 * c * c * g,
        "attn.c_attn.bias": bias * 3 * c * g,  # apart: checkpointing frees a tensor between the two
        "ln_1": ln,
    }


def _root_gradient_bytes(step: StepShape) -> dict[str, int]:
    """The root's parameter gradients by module, at the compute dtype: the head (a tied head's is wte's
    shape), ln_f, and the two embeddings."""
    g = step.act
    wte, wpe = (math.prod(shape) * g for shape in step.root_shapes[:2])
    return {"lm_head": step.vocab * step.width * g, "ln_f": (2 if step.bias else 1) * step.width * g,
            "wpe": wpe, "wte": wte}


def _fsdp_moments(step: StepShape, m: _Ledger | None = None, *, unpadded: bool = False) -> list[Moment]:
    """FSDP2 as the engine runs it, op by op: the forward (all-gathers, saved tensors), the loss, each
    block's backward (its parameter gradients pile up until its reduce-scatter), the embeddings and the
    root's reduce-scatter, and Adam. Matches the simulation's tracker event for event at every op that
    can hold a maximum; see `_block_backward` for one block. `m`: the ledger to walk with (a fresh one by
    default); `unpadded`: every tensor split evenly, FSDP2's padding left out (`peak_and_padding`)."""
    padded_numel = _even_numel if unpadded else fsdp_padded_numel
    s, a = step.shard_ranks, step.act  # a: compute bytes (activations, gathered parameters, gradients)
    zero3, prefetch, ac = step.strategy is Strategy.ZERO3, step.prefetch, step.activation_checkpointing
    t, c, v, layers = step.tokens, step.width, step.vocab, step.layers
    tc = t * c * a
    all_shapes = [*step.root_shapes, *step.block_shapes * layers]
    sharded = padded_numel(all_shapes, s) // s
    block_padded = padded_numel(step.block_shapes, s)
    root_padded = padded_numel(step.root_shapes, s)
    P, R = block_padded * a, root_padded * a  # one block's, and the root's, gathered parameters (padded)
    # The all-gathers' flat outputs. A shard group of one GPU gathers nothing: FSDP2 copies each shard
    # straight into its unsharded parameter (FSDPParamGroup.wait_for_unshard, world_size == 1).
    gathered_P, gathered_R = (P, R) if s > 1 else (0, 0)
    # Under bf16 an all-gather's input is a flat bf16 copy of the unit's shard (foreach_all_gather's
    # _get_param_all_gather_inputs), made before the output and freed once copied into it; fp32 gathers the
    # shard itself. (CPU offload's device copy is left out: analytic_leaves_out says so.)
    cast = step.mixed_precision and not step.cpu_offload and s > 1
    input_P, input_R = (P // s, R // s) if cast else (0, 0)
    params_sharded = FP32 * sharded
    optimizer = 2 * FP32 * sharded + ADAM_STEP_COUNTER_BYTES * step.num_tensors
    host = 0
    if step.cpu_offload:  # CPUOffloadPolicy: sharded parameters, gradients and Adam state in host memory
        host = params_sharded + FP32 * sharded + optimizer
        params_sharded = optimizer = 0
    sharded_grad = lambda padded: 0 if step.cpu_offload else FP32 * padded // s  # noqa: E731
    # Gradient accumulation: the micro-batches before the last leave every unsharded gradient, in fp32.
    accumulated = FP32 * step.num_params if step.grad_accum_steps > 1 else 0
    # In fp32 they are the parameters' own `.grad`, and autograd adds each new gradient into it once made.
    # Under bf16 they are FSDP2's `unsharded_accumulated_grad`s, and a micro-batch's new bf16 gradients wait in
    # `.grad` until their unit's post-backward adds them in (FSDPParam.accumulate_unsharded_grad_if_needed).
    added_at_once = bool(accumulated) and not step.mixed_precision
    added_at_post_backward = bool(accumulated) and step.mixed_precision
    stats = 2 * t * a  # a LayerNorm's mean and rstd (the compute dtype, as on CPU)
    lse = step.heads * t * FP32  # SDPA's logsumexp
    positions, inputs = step.seq * INT64, inputs_bytes(step.micro_batch, step.seq)
    loss_scalars = loss_scalars_bytes(a)

    m = m if m is not None else _Ledger()
    m.host = host

    def all_gather(at: str, gathered: int, bf16_input: int) -> None:
        m.op(at, all_gather_buffers=gathered + bf16_input)
        if bf16_input:
            m.op("its bf16 input freed", all_gather_buffers=-bf16_input)

    # --- forward -------------------------------------------------------------------------------------
    m.phase("forward, the root's all-gather")
    m.op("model states", parameters=params_sharded, optimizer_state=optimizer, gradients=accumulated)
    m.op("the batch", activations=inputs)
    # With accumulation the previous micro-batch's (divided) loss is held until this one's replaces it.
    held_loss = a if accumulated else 0
    m.op("the previous micro-batch's loss", activations=held_loss)
    all_gather("the root's all-gather", gathered_R, input_R)
    m.op("its copy-out", parameters=R)
    if prefetch:
        all_gather("block 0's prefetched all-gather", gathered_P, input_P)
    m.op("positions", activations=positions)
    m.op("token embeddings", activations=tc)
    m.op("position embeddings", activations=step.seq * c * a)
    m.op("their sum", activations=tc)
    m.op("the embeddings freed", activations=-tc - step.seq * c * a)
    for j in range(layers):
        m.phase(f"block {j} forward")
        if not prefetch:
            all_gather("its all-gather", gathered_P, input_P)
        m.op("its copy-out", parameters=P)
        if j == 0:
            m.op("the root's all-gather buffer freed", all_gather_buffers=-gathered_R)
        else:
            m.op("the previous all-gather buffer freed", all_gather_buffers=-gathered_P)
        if prefetch and j + 1 < layers:
            all_gather(f"block {j + 1}'s prefetched all-gather", gathered_P, input_P)
        # Non-reentrant checkpointing saves nothing but the block's input: its forward's tensors live only
        # while Python holds them, and only its output (the next block's input) stays.
        for name, saved in (_checkpointed_block_forward if ac else _block_forward)(tc, stats, lse):
            m.op(name, activations=saved)
        if zero3:
            m.op("resharded", parameters=-P)
    m.phase("loss forward")
    m.op("ln_f", activations=tc + stats)
    m.op("lm_head's logits", activations=t * v * a)
    m.op("log-softmax", activations=t * v * a)
    m.op("nll_loss", activations=loss_scalars)
    m.op("the previous loss freed", activations=-held_loss)
    m.op("the logits freed", activations=-t * v * a)
    # --- backward ------------------------------------------------------------------------------------
    m.phase("loss backward")
    m.op("the loss's gradient", activations=a, all_gather_buffers=-gathered_P)
    if zero3 and prefetch:
        all_gather(f"block {layers - 1}'s prefetched all-gather", gathered_P, input_P)
    grads, root = _block_gradient_bytes(step), _root_gradient_bytes(step)
    # foreach_reduce (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py) copies a unit's unsharded
    # gradients into its reduce-scatter buffer and clears their list, but on more than one shard its loop
    # over them (`for i, (fsdp_param, unsharded_grad) in ...`, for Shard(dim > 0)) leaves the last one in
    # `unsharded_grad` until it returns: that gradient outlives the others past the reduce-scatter output's
    # allocation. The last is the unit's last parameter: a block's mlp.c_proj bias (weight without biases);
    # the root's untied lm_head weight (vocab x width), or, tied, ln_f's bias (weight). With accumulation
    # it is the kept fp32 one.
    held = (FP32 if accumulated else a) if s > 1 else 0
    last_block_grad = held * math.prod(step.block_shapes[-1])
    last_root_grad = held * math.prod(step.root_shapes[-1])
    # With accumulation in fp32 each gradient is added to the kept one once taken (a tied head's waits
    # for the embedding's instead); otherwise they stay until their unit's post-backward.
    release = _released(grads | root, step, new=added_at_once)
    _loss_and_head_backward(m, step, root, tc, stats, release)
    block_grads = sum(grads.values())
    for i in reversed(range(layers)):
        m.phase(f"block {i} backward")
        if zero3:
            if not prefetch:
                all_gather("its all-gather", gathered_P, input_P)
            m.op("its copy-out", parameters=P)
            m.op("the all-gather buffer freed", all_gather_buffers=-gathered_P)
            if prefetch and i > 0:
                all_gather(f"block {i - 1}'s prefetched all-gather", gathered_P, input_P)
        if ac:
            _recompute(m, tc, stats, lse)
        _block_backward(m, grads, tc, stats, lse, ac, release)
        # post-backward: (bf16 with accumulation: add the new gradients to the kept ones), reshard, free the
        # previous reduce-scatter buffer, copy the gradients (with accumulation, the kept ones) into an fp32
        # reduce-scatter buffer, free them, keep the shard.
        if added_at_post_backward:
            m.op("its new gradients added to the kept ones", gradients=-block_grads)
        m.op("resharded", parameters=-P)
        if i < layers - 1:
            m.op("the previous reduce-scatter buffer freed", reduce_scatter_buffers=-FP32 * block_padded)
        m.op("the reduce-scatter buffer", reduce_scatter_buffers=FP32 * block_padded)
        kept = FP32 * step.block_numel if accumulated else 0
        m.op("its gradients freed but the last, the shard kept",
             gradients=-(kept or block_grads) + last_block_grad + sharded_grad(block_padded))
        m.op("the last gradient freed", gradients=-last_block_grad)
    m.phase("end of backward")
    # With accumulation in fp32 autograd adds wpe's new gradient to the kept one before wte's is made.
    _embeddings_backward(m, step, root, tc, wpe_taken=release("wpe"))
    wte_grad = root["wte"]
    if step.tied:
        # A tied weight's two gradients (the head's, held since the loss's backward, and the embedding's)
        # are summed out of place: one vocab x width tensor more for a moment. The sum becomes its
        # gradient, or with accumulation in fp32 is added to the kept one and freed with the two.
        m.op("the tied weight's two gradients summed", gradients=wte_grad)
        m.op("the two freed" + (", and the sum once added" if added_at_once else ""),
             gradients=-(3 if added_at_once else 2) * wte_grad)
    else:
        m.op("wte's gradient taken", gradients=release("wte"))
    m.phase("root reduce-scatter")
    root_grads = step.root_numel * a
    if added_at_post_backward:
        m.op("its new gradients added to the kept ones", gradients=-root_grads)
    m.op("the root resharded", parameters=-R)
    m.op("the last block's reduce-scatter buffer freed", reduce_scatter_buffers=-FP32 * block_padded)
    m.op("the root's reduce-scatter buffer", reduce_scatter_buffers=FP32 * root_padded)
    m.op("its gradients freed but the last, the shard kept",
         gradients=-(FP32 * step.root_numel if accumulated else root_grads) + last_root_grad + sharded_grad(root_padded))
    m.op("the last gradient freed", gradients=-last_root_grad)
    m.phase("optimizer step")
    m.op("the reduce-scatter buffer freed", reduce_scatter_buffers=-FP32 * root_padded,
         activations=-loss_scalars // 2)
    shards = [padded_numel([shape], s) // s for shape in step.shapes_in_step_order(min(layers, 2))]
    m.op("Adam's temporaries", optimizer_state=0 if step.cpu_offload else FP32 * adam_step_temporaries(shards))
    moments = m.result()
    if step.tied and accumulated:
        # The ledger walks the last micro-batch. Those before it end their backward still holding every
        # block's gradient in fp32 (nothing is reduce-scattered before the last; under bf16 each block's
        # post-backward makes its fp32 copy) when the tied weight's two new gradients are summed: the first
        # beside the root's new ones, a middle one beside every kept gradient, the tied weight's included
        # (under bf16 the root's new ones too: they wait for its post-backward).
        root_new = root["wpe"] + root["ln_f"] + 3 * wte_grad
        before_last = {"first micro-batch's": layers * FP32 * step.block_numel + root_new}
        if step.grad_accum_steps > 2:
            before_last["a middle micro-batch's"] = accumulated + (root_new if added_at_post_backward else 3 * wte_grad)
        moments += [
            Moment(f"{which} end of backward (the tied weight's two gradients summed)", gradients=grads_held,
                   parameters=params_sharded + R, optimizer_state=optimizer, activations=inputs + loss_scalars,
                   host=host)
            for which, grads_held in before_last.items()
        ]
    return moments


def _block_forward(tc: int, stats: int, lse: int) -> list[tuple[str, int]]:
    """A block's forward op by op: what each op leaves saved for backward (negative: freed). `tc`: one
    (tokens, C) tensor at the compute dtype; `stats`: LayerNorm's statistics; `lse`: SDPA's logsumexp."""
    return [
        ("ln_1", tc + stats),
        ("c_attn", 3 * tc),
        ("attention", tc + lse),
        ("attn.c_proj", tc),
        ("residual add", tc),
        ("attn.c_proj's output freed", -tc),
        ("ln_2", tc + stats),
        ("c_fc", 4 * tc),
        ("gelu", 4 * tc),
        ("mlp.c_proj", tc),
        ("residual add", tc),
        ("mlp.c_proj's output freed", -tc),
    ]


def _checkpointed_block_forward(tc: int, stats: int, lse: int) -> list[tuple[str, int]]:
    """A checkpointed block's forward (use_reentrant=False, outside backward) op by op: what each op
    allocates and what is freed by then (negative). Nothing is saved, but a tensor lives as long as Python
    holds it: ln_1's output is attn.forward's argument, so it, q, k, v and the attention output live until
    attn returns; ln_2's output is mlp.forward's, c_fc's output gelu's argument. The fullest moment is
    gelu's: the residual x + attn, ln_2's output, c_fc's and gelu's outputs (10 tc beside the block's
    input). The statistics and the logsumexp are freed at once (not saved). Leaves the output (tc)."""
    return [
        ("ln_1", tc + stats),
        ("c_attn (ln_1's statistics freed)", 3 * tc - stats),
        ("attention", tc + lse),
        ("attn.c_proj (the logsumexp freed)", tc - lse),
        ("residual add (ln_1's output, q, k, v and the attention output freed)", tc - 5 * tc),
        ("ln_2 (attn.c_proj's output freed)", tc + stats - tc),
        ("c_fc (ln_2's statistics freed)", 4 * tc - stats),
        ("gelu", 4 * tc),
        ("mlp.c_proj (c_fc's output freed)", tc - 4 * tc),
        ("residual add: the output (ln_2's and gelu's outputs freed)", tc - 5 * tc),
        ("the residual and mlp.c_proj's output freed", -2 * tc),
    ]


RECOMPUTED_OPS = 9  # checkpointing reruns a block's forward up to its gelu, the last op backward needs


def _recompute(m: _Ledger, tc: int, stats: int, lse: int) -> None:
    """Activation checkpointing: the block's forward rerun at the start of its backward, saving what the
    forward would have (its input is the one tensor kept), up to the last op backward needs."""
    for name, saved in _block_forward(tc, stats, lse)[:RECOMPUTED_OPS]:
        m.op(name if saved < 0 else f"recomputed {name}", activations=saved)


def _released(gradient_bytes: dict[str, int], step: StepShape, *, new: bool, kept: bool = False) -> Callable[..., int]:
    """What is freed (negative bytes) once modules' new gradients are taken: the new gradients (`new`)
    where they are added to kept ones (FSDP with accumulation, DDP's later micro-batches) or copied into
    DDP's bucket; nothing where they stay (FSDP until the unit's reduce-scatter; DDP's first micro-batch of
    several, whose gradients become the kept ones); and the kept fp32 ones too (`kept`) where DDP's last
    micro-batch copies them into its bucket. A tied head's gradient is never taken at the head: it waits
    for the embedding's, to be summed with it."""
    def release(*modules: str) -> int:
        freed = 0
        for module in modules:
            if module == "lm_head" and step.tied:
                continue
            freed += (gradient_bytes[module] if new else 0) + (FP32 * gradient_bytes[module] // step.act if kept else 0)
        return -freed

    return release


def _loss_and_head_backward(m: _Ledger, step: StepShape, root: dict[str, int], tc: int, stats: int,
                            release: Callable[..., int]) -> None:
    """From nll_loss's backward through ln_f's: the logits' gradient, lm_head's weight and input
    gradients (the fullest moment here), ln_f's. `root`: `_root_gradient_bytes`; `release`: `_released`."""
    t, v, a = step.tokens, step.vocab, step.act
    m.op("nll_loss backward", temporaries=t * v * a)
    m.op("the loss's gradient freed", activations=-a)
    m.op("log-softmax backward", temporaries=t * v * a)
    m.op("log-softmax's output freed", activations=-t * v * a, temporaries=-t * v * a)
    m.op("lm_head's weight gradient", gradients=root["lm_head"])
    m.op("lm_head's input gradient", temporaries=tc)
    m.op("ln_f's output freed", activations=-tc, temporaries=-t * v * a)
    m.op("lm_head's gradient taken", gradients=release("lm_head"))
    m.op("ln_f backward", temporaries=tc, gradients=root["ln_f"])
    m.op("ln_f's input freed", activations=-tc - stats, temporaries=-tc)
    m.op("ln_f's gradients taken", gradients=release("ln_f"))


def _embeddings_backward(m: _Ledger, step: StepShape, root: dict[str, int], tc: int, *, wpe_taken: int) -> None:
    """The position and token embeddings' backward. `wpe_taken`: what is freed once wpe's gradient is taken,
    before wte's is made (DDP's hook copies it into its bucket then; 0 under FSDP, which keeps it)."""
    c, a = step.width, step.act
    m.op("wpe's output gradient", temporaries=step.seq * c * a)
    m.op("wpe's weight gradient", gradients=root["wpe"])
    m.op("positions freed", activations=-step.seq * INT64, temporaries=-step.seq * c * a)
    m.op("wpe's gradient taken", gradients=wpe_taken)
    m.op("wte's weight gradient", gradients=root["wte"])
    m.op("the input gradient freed", temporaries=-tc)


def _block_backward(m: _Ledger, grads: dict[str, int], tc: int, stats: int, lse: int, ac: bool,
                    release: Callable[..., int]) -> None:
    """One block's backward, op by op, as autograd runs it on our Block. The gradient arriving at the
    block's output (tc) is held throughout. Each Linear's weight (and bias) gradient is taken once its
    Linear's backward is done, freeing `release(module)` bytes: under FSDP without accumulation nothing,
    so they pile up to the whole block's by attn.c_attn, the last Linear, until the reduce-scatter."""
    m.op("mlp.c_proj's input gradient", temporaries=4 * tc)
    if ac:  # checkpointing frees the recomputed GELU output before c_proj's bias gradient
        m.op("mlp.c_proj's weight gradient", gradients=grads["mlp.c_proj"])
        m.op("gelu's output freed", activations=-4 * tc)
        m.op("its bias gradient", gradients=grads["mlp.c_proj.bias"])
    else:
        m.op("mlp.c_proj's weight gradient", gradients=grads["mlp.c_proj"] + grads["mlp.c_proj.bias"])
        m.op("gelu's output freed", activations=-4 * tc)
    m.op("its gradients taken", gradients=release("mlp.c_proj", "mlp.c_proj.bias"))
    m.op("gelu backward", temporaries=4 * tc)
    m.op("c_fc's output freed", activations=-4 * tc, temporaries=-4 * tc)
    m.op("mlp.c_fc's input gradient", temporaries=tc)
    m.op("mlp.c_fc's weight gradient", gradients=grads["mlp.c_fc"])
    m.op("ln_2's output freed", activations=-tc, temporaries=-4 * tc)
    m.op("its gradients taken", gradients=release("mlp.c_fc"))
    m.op("ln_2 backward", temporaries=tc, gradients=grads["ln_2"])
    m.op("ln_2's input freed", activations=-tc - stats, temporaries=-tc)
    m.op("the residual's gradient", temporaries=tc)
    m.op("the addends freed", temporaries=-2 * tc)
    m.op("its gradients taken", gradients=release("ln_2"))
    m.op("attn.c_proj's input gradient", temporaries=tc)
    m.op("attn.c_proj's weight gradient", gradients=grads["attn.c_proj"])
    m.op("its gradients taken", gradients=release("attn.c_proj"))
    m.op("attention backward", temporaries=3 * tc)
    m.op("q, k, v and the attention output freed", activations=-4 * tc - lse, temporaries=-tc)
    m.op("q, k, v gradients concatenated", temporaries=3 * tc)
    m.op("their parts freed", temporaries=-3 * tc)
    m.op("attn.c_attn's input gradient", temporaries=tc)
    weight, bias = grads["attn.c_attn"], grads["attn.c_attn.bias"]
    if ac:  # checkpointing frees the recomputed ln_1 output with c_attn's bias gradient
        m.op("attn.c_attn's weight gradient", gradients=weight)
        m.op("its bias gradient; ln_1's output freed", gradients=bias, activations=-tc)
        m.op("the q, k, v gradient freed", temporaries=-3 * tc)
    else:
        m.op("attn.c_attn's weight gradient", gradients=weight + bias)
        m.op("ln_1's output freed", activations=-tc, temporaries=-3 * tc)
    m.op("its gradients taken", gradients=release("attn.c_attn", "attn.c_attn.bias"))
    m.op("ln_1 backward", temporaries=tc, gradients=grads["ln_1"])
    m.op("ln_1's input freed", activations=-tc - stats, temporaries=-tc)
    m.op("the residual's gradient", temporaries=tc)
    m.op("the addends freed", temporaries=-2 * tc)
    m.op("its gradients taken", gradients=release("ln_1"))


def _ddp_moments(step: StepShape) -> list[Moment]:
    """DDP and PyTorch's ZeRO-1 (DDP + ZeroRedundancyOptimizer), which the simulation does not build (held
    to the memory tracker on CPU ranks in tests/test_planner.py), walked op by op from the loss's backward:
    full fp32 parameters (plus DDP's bf16 copies under its mixed precision), DDP's fp32 all-reduce buckets
    (the gradients, as views: gradient_as_bucket_view) all step, and Adam's state whole (ddp) or the
    fullest rank's share of whole tensors (zero1). Each new gradient lives from its op until DDP's hook
    copies it into its bucket, once its module's backward is done; the backward runs the same ops as
    FSDP's. With accumulation (`no_sync` before the last micro-batch) the first micro-batch's gradients
    stay as the parameters' own, the next ones are added to them, and the last copies them into the
    buckets: one more fp32 copy of every gradient until then. At the optimizer step Adam (foreach=False)
    holds the temporaries of `adam_step_temporaries`, over the model's tensors in its order, or on ZeRO-1
    over those the rank owns, largest first."""
    psi, a = step.num_params, step.act
    parameters = FP32 * psi + (2 * psi if step.mixed_precision else 0)
    if step.strategy is Strategy.ZERO1:
        numels = tuple(math.prod(s) for s in step.shapes_in_step_order())
        optimizer, stepping = _zero1_adam_bytes(numels, step.world_size)
    else:
        optimizer = 2 * FP32 * psi + ADAM_STEP_COUNTER_BYTES * step.num_tensors
        numels = [math.prod(s) for s in step.shapes_in_step_order(min(step.layers, 2))]
        stepping = optimizer + FP32 * adam_step_temporaries(numels)
    buckets = FP32 * psi
    grads, root = _block_gradient_bytes(step), _root_gradient_bytes(step)
    t, c = step.tokens, step.width
    tc, stats, lse = t * c * a, 2 * t * a, step.heads * t * FP32
    # Which micro-batches to walk, with the kept gradients each starts with and what taking a gradient frees.
    # A middle one holds every kept gradient throughout, so it is the fullest of the rest.
    if step.grad_accum_steps == 1:
        walks = [("", 0, _released(grads | root, step, new=True))]
    else:
        kept = FP32 * psi
        walks = [("the first micro-batch's ", 0, _released(grads | root, step, new=False)),
                 ("the last micro-batch's ", kept, _released(grads | root, step, new=True, kept=True))]
        if step.grad_accum_steps > 2:
            walks.append(("a middle micro-batch's ", kept, _released(grads | root, step, new=True)))
    moments = []
    for which, kept, release in walks:
        m = _Ledger(host=0)
        m.phase(f"{which}loss backward")
        m.op("after the forward", parameters=parameters, gradients=buckets + kept, optimizer_state=optimizer,
             activations=saved_activations_bytes(step))
        m.op("the loss's gradient", activations=a)
        _loss_and_head_backward(m, step, root, tc, stats, release)
        for i in reversed(range(step.layers)):
            m.phase(f"{which}block {i} backward")
            if step.activation_checkpointing:
                _recompute(m, tc, stats, lse)
            _block_backward(m, grads, tc, stats, lse, step.activation_checkpointing, release)
        m.phase(f"{which}end of backward")
        _embeddings_backward(m, step, root, tc, wpe_taken=release("wpe"))
        if step.tied:  # the head's gradient, held since the loss's backward, summed with the embedding's
            m.op("the tied weight's two gradients summed", gradients=root["wte"])
            m.op("the two freed", gradients=-2 * root["wte"])
        moments += m.result()
    # Still alive at the step: the batch's inputs and one of the loss's two scalars.
    held = inputs_bytes(step.micro_batch, step.seq) + loss_scalars_bytes(a) // 2
    moments.append(Moment("optimizer step", parameters=parameters, gradients=buckets, optimizer_state=stepping,
                          activations=held))
    return moments


@functools.lru_cache(maxsize=16)
def _zero1_adam_bytes(numels: tuple[int, ...], world_size: int) -> tuple[int, int]:
    """ZeRO-1's fullest rank: its Adam state, and its fullest moment of the step (state and temporaries).
    The same for every micro-batch the largest-micro-batch search tries, so kept (131,072 ranks' lists)."""
    placed = zero1_placement(numels, world_size)
    states = [2 * FP32 * sum(owned) + ADAM_STEP_COUNTER_BYTES * len(owned) for owned in placed]
    stepping = max(state + FP32 * adam_step_temporaries(owned) for state, owned in zip(states, placed, strict=True))
    return max(states), stepping
