"""Will it fit? The analytic planner: per-GPU peak memory by category and per-step communication for a
GPT on N GPUs (or an HSDP mesh of replicas x shards), instantly and without torch.

    request = PlanRequest(ModelShape.named("7b"), Mesh.of(64), gpu_memory_gb=80, micro_batch=1, seq=2048,
                          strategy=Strategy.ZERO3, mixed_precision=True)
    plan = plan_analytic(request)
    plan.peak.total, plan.fits, plan.largest_micro_batch, plan.communication

The memory model (`planner_memory`) is derived for our GPT and the engine's `parallelize`, and held to the
FSDP2 simulation in tests/test_planner.py; the communication model (`planner_comm`) counts the collectives
PyTorch issues, with wire bytes derived from ring formulas. Every figure says where it holds, and a `Plan`
lists what the model leaves out. The web app imports this module: never torch here.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from enum import Enum

from sharding_lab.model_config import SIZES, GPTConfig, parameter_shapes
from sharding_lab.planner_comm import WIRE_DERIVATION, Collective, MeshDim, collectives_per_step
from sharding_lab.planner_memory import Moment, StepShape, peak, peak_and_padding
from sharding_lab.strategies import Strategy
from sharding_lab.units import human_bytes, param_count

# GPU memory is given in decimal GB (1e9 B). Vendors' labels are not: nvidia-smi shows an "80 GB" H100 as
# 81,559 MiB (85.5 GB) and a "141 GB" H200 as 143,771 MiB (150.8 GB), so the label's figure plans ~7% low.
GB = 10**9
DEFAULT_HEADROOM = 0.1  # a tenth of the GPU kept free for the CUDA context, NCCL and allocator slack


@dataclass(frozen=True)
class PlanBounds:
    """Bounds on one plan's inputs, for the app's page and the CLI alike. At 131,072 GPUs, 1,024 narrow
    layers plan all four strategies in 0.6 s on 2 cores, and 1,024 layers of width 768 with a 2**20
    vocabulary and sequence (micro-batch search included) in 3.1-3.2 s (70b at 1024 GPUs: 35 ms).
    Work grows with the GPUs (ZeRO-1's partition is laid out per rank) and the layers."""

    layers: int = 1024
    gpus: int = 131_072
    dim: int = 1 << 20  # width, heads, vocabulary, sequence length
    grad_accum: int = 4096
    gpu_memory_gb: float = 10_000
    micro_batch: int = 1 << 20  # also the largest micro-batch the search tries


BOUNDS = PlanBounds()


class Method(str, Enum):
    """How a plan's figures were obtained."""

    ANALYTIC = "analytic"  # planner_memory's formulas: instant, torch-free
    SIMULATION = "simulation"  # FSDP2 under FakeTensorMode with FSDPMemTracker: exact to FSDP2, slow

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class ModelShape:
    """A GPT's shape: our GPT's layout (nanoGPT: learned positions, 4x GELU MLP, LayerNorm), any size."""

    layers: int
    width: int
    heads: int
    vocab: int
    seq_len: int  # the longest sequence: sizes the position embedding (GPTConfig.block_size)
    tied: bool = False  # lm_head shares wte's weight (GPT-2)
    bias: bool = True
    name: str | None = None  # the named size it came from, if any

    def __post_init__(self) -> None:
        for label, value in (("layers", self.layers), ("width", self.width), ("heads", self.heads),
                             ("vocabulary", self.vocab), ("sequence length", self.seq_len)):
            if value < 1:
                raise ValueError(f"{label} must be at least 1, got {value}")
        if self.width % self.heads:
            raise ValueError(f"heads ({self.heads}) must divide the width ({self.width})")

    @classmethod
    def named(cls, size: str) -> ModelShape:
        """One of model_config.SIZES; ValueError naming them otherwise."""
        if size not in SIZES:
            raise ValueError(f"unknown model size {size!r}; choose one of {', '.join(SIZES)}")
        return cls.from_config(SIZES[size], name=size)

    @classmethod
    def from_config(cls, config: GPTConfig, *, name: str | None = None) -> ModelShape:
        return cls(config.n_layer, config.n_embd, config.n_head, config.vocab_size, config.block_size,
                   tied=config.tied, bias=config.bias, name=name)

    def to_config(self) -> GPTConfig:
        return GPTConfig(block_size=self.seq_len, vocab_size=self.vocab, n_layer=self.layers,
                         n_head=self.heads, n_embd=self.width, bias=self.bias, tied=self.tied)

    @property
    def label(self) -> str:
        tied = ", tied" if self.tied else ""
        shape = f"{self.layers} layers x {self.width} wide, {self.heads} heads, vocab {self.vocab}{tied}"
        return f"{self.name} ({shape})" if self.name else shape

    def parameter_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        """(name, shape) of every parameter (tied: no lm_head.weight, wte serves both)."""
        return parameter_shapes(self.to_config())

    @property
    def num_params(self) -> int:
        return sum(math.prod(s) for _, s in self.parameter_shapes())


@dataclass(frozen=True)
class Mesh:
    """The GPUs: `replicas` x `shards` (HSDP when replicas > 1; a plain 1-D mesh of `shards` otherwise)."""

    shards: int
    replicas: int = 1

    def __post_init__(self) -> None:
        if self.shards < 1 or self.replicas < 1:
            raise ValueError(f"a mesh needs at least 1 x 1 GPUs, got {self.replicas} x {self.shards}")

    @classmethod
    def of(cls, gpus: int) -> Mesh:
        return cls(shards=gpus)

    @classmethod
    def parse(cls, text: str) -> Mesh:
        """'2x4' (replicas x shards) or '8' (a 1-D mesh of 8)."""
        match = re.fullmatch(r"\s*(\d+)\s*(?:[xX*]\s*(\d+))?\s*", text)
        if match is None:
            raise ValueError(f"not a mesh: {text!r} (write GPUS, or REPLICASxSHARDS such as 8x8)")
        if match.group(2) is None:
            return cls(shards=int(match.group(1)))
        return cls(shards=int(match.group(2)), replicas=int(match.group(1)))

    @property
    def world_size(self) -> int:
        return self.replicas * self.shards

    def __str__(self) -> str:
        return f"{self.replicas}x{self.shards}" if self.replicas > 1 else str(self.shards)


@dataclass(frozen=True)
class PlanRequest:
    """One question: this model, these GPUs, this step. Validated on construction (ValueError, plainly)."""

    model: ModelShape
    mesh: Mesh
    gpu_memory_gb: float  # decimal GB (1e9 bytes) per GPU: 85.5 for an H100 (its label says 80), 150.8 for an H200
    micro_batch: int = 1  # sequences per GPU per forward
    seq: int | None = None  # tokens per sequence; None: the model's seq_len
    strategy: Strategy = Strategy.ZERO3
    mixed_precision: bool = False  # PyTorch's: bf16 compute and all-gathers, fp32 reductions and master copies
    activation_checkpointing: bool = False  # per block, non-reentrant torch.utils.checkpoint
    cpu_offload: bool = False  # FSDP2's CPUOffloadPolicy: sharded params, grads, Adam state on the host
    grad_accum_steps: int = 1  # micro-batches per optimizer step; only the last synchronizes gradients
    headroom: float = DEFAULT_HEADROOM  # the fraction of GPU memory the peak must leave free
    prefetch: bool = True  # FSDP's explicit prefetching of the next block, as the engine runs by default

    def __post_init__(self) -> None:
        object.__setattr__(self, "strategy", Strategy.parse(self.strategy))
        if self.seq is None:
            object.__setattr__(self, "seq", self.model.seq_len)
        if self.seq < 1:
            raise ValueError(f"the sequence must be at least 1 token, got {self.seq}")
        if self.seq > self.model.seq_len:
            raise ValueError(f"sequence {self.seq} exceeds the model's sequence length {self.model.seq_len}")
        if self.micro_batch < 1:
            raise ValueError(f"the micro-batch must be at least 1, got {self.micro_batch}")
        if self.grad_accum_steps < 1:
            raise ValueError(f"gradient accumulation needs at least 1 micro-batch, got {self.grad_accum_steps}")
        if not self.gpu_memory_gb > 0:
            raise ValueError(f"GPU memory must be positive, got {self.gpu_memory_gb} GB")
        if not 0 <= self.headroom < 1:
            raise ValueError(f"headroom is a fraction of GPU memory in [0, 1), got {self.headroom}")
        if not self.strategy.fully_sharded:
            if self.cpu_offload:
                raise ValueError(f"CPU offload is FSDP2's (zero2, zero3): {self.strategy} does not shard parameters")
            if self.mesh.replicas > 1:
                raise ValueError(f"a replicas x shards mesh is HSDP, FSDP2's (zero2, zero3): not {self.strategy}")

    @property
    def gpu_memory_bytes(self) -> int:
        return round(self.gpu_memory_gb * GB)

    @property
    def usable_bytes(self) -> int:
        """What the peak may use: GPU memory less the headroom."""
        return math.floor(self.gpu_memory_bytes * (1 - self.headroom))

    @property
    def tokens_per_step(self) -> int:
        """Global tokens per optimizer step."""
        return self.mesh.world_size * self.micro_batch * self.grad_accum_steps * self.seq


class Category(str, Enum):
    """The peak's categories, in the order a report lists them."""

    PARAMETERS = "parameters"
    GRADIENTS = "gradients"
    OPTIMIZER_STATE = "optimizer_state"
    ACTIVATIONS = "activations"
    TEMPORARIES = "temporaries"
    ALL_GATHER_BUFFERS = "all_gather_buffers"
    REDUCE_SCATTER_BUFFERS = "reduce_scatter_buffers"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Figure:
    """A byte count and where it holds (which implementation, which model, which dtypes)."""

    bytes: int
    holds: str
    padding: int = 0  # of `bytes`, FSDP2's padding (planner_memory.peak_and_padding); analytic only


@dataclass(frozen=True)
class PeakMemory:
    """Per-GPU memory at the step's peak, by category, and the moment it happens."""

    moment: str
    categories: tuple[tuple[Category, Figure], ...]
    host_bytes: int = 0  # CPU offload: model states in host memory, not counted in `total`

    @property
    def total(self) -> int:
        return sum(figure.bytes for _, figure in self.categories)

    @property
    def padding(self) -> int:
        return sum(figure.padding for _, figure in self.categories)

    def __getitem__(self, category: Category) -> Figure:
        return dict(self.categories)[Category(category)]

    def bytes_by_category(self) -> dict[str, int]:
        """{category name: bytes}, as `plan_json` names them."""
        return {str(c): f.bytes for c, f in self.categories}


@dataclass(frozen=True)
class Plan:
    """The answer for one request by one method."""

    request: PlanRequest
    method: Method
    num_params: int
    peak: PeakMemory
    largest_micro_batch: int | None  # 0: not even 1 fits; None: not computed (the simulation)
    communication: tuple[Collective, ...]
    holds: str
    leaves_out: tuple[str, ...]
    notes: tuple[str, ...] = field(default=())

    @property
    def fits(self) -> bool:
        return self.peak.total <= self.request.usable_bytes

    @property
    def num_params_label(self) -> str:
        return param_count(self.num_params)

    @property
    def largest_micro_batch_label(self) -> str:
        """The largest micro-batch as a reader should see it: "none" where not even 1 fits."""
        if self.largest_micro_batch is None:
            return "-"
        return str(self.largest_micro_batch) if self.largest_micro_batch else "none"

    @property
    def headroom_statement(self) -> str:
        r = self.request
        return (f"fits if the peak is at most {_percent(1 - r.headroom)} of {r.gpu_memory_gb:g} GB "
                f"(headroom {_percent(r.headroom)}: {r.usable_bytes / GB:.2f} GB usable)")


def _percent(fraction: float) -> str:
    """A fraction as a percentage with the digits it has: whole percents rounded read 12.5% headroom as
    "12%" beside "88%", and 0.5% as "0%" beside "100%"."""
    return f"{fraction * 100:.4g}%"


def _dtype_label(mixed_precision: bool) -> str:
    return "bf16 compute, fp32 master copies and reductions" if mixed_precision else "fp32"


def where_it_holds(request: PlanRequest) -> str:
    """Where the analytic figures hold, in one line."""
    strategy = request.strategy
    impl = (
        "PyTorch FSDP2 as the engine runs it (fully_shard per block, then the root; the root stays unsharded "
        "from forward to backward)" if strategy.fully_sharded else
        "PyTorch DDP (gradient_as_bucket_view)" + (" + ZeroRedundancyOptimizer" if strategy is Strategy.ZERO1 else "")
    )
    model = "our GPT's layout (engine/model.py)" + (", with a tied head" if request.model.tied else "")
    return f"{impl}; {model}; {_dtype_label(request.mixed_precision)}; torch.optim.Adam (foreach=False)"


def analytic_leaves_out(request: PlanRequest) -> tuple[str, ...]:
    """What the analytic model does not count."""
    left_out = [
        "the CUDA context, NCCL's buffers and the caching allocator's reserve and fragmentation "
        "(allocated bytes only; the headroom is for these)",
        "cuBLAS's workspaces, one per thread that runs matmuls: 2 x 32 MiB on Hopper and later (64 MiB measured "
        "on an H200), 2 x 8.125 MiB before",
        "LayerNorm's mean/rstd are counted at the compute dtype, as on CPU; CUDA keeps them fp32 "
        "(+8 B per token per block and 4 B per token for the final norm under bf16)",
        "Adam's 4-byte step counter per tensor is counted as GPU memory, as on CPU; on CUDA (foreach=False, "
        "not capturable) it lives on the host",
        "attention is counted as PyTorch's CPU flash kernel runs it (saves q, k, v, its output and an fp32 "
        "logsumexp; its backward allocates dq, dk, dv only); CUDA's kernels save the same plus a few bytes "
        "of RNG state, and their backward workspaces are not counted",
    ]
    if not request.strategy.fully_sharded:
        left_out.append(f"{request.strategy} is not simulated: its figures are this model's alone, held to the "
                        f"memory tracker on CPU ranks (fp32; DDP's CUDA mixed precision is not checked)")
    if request.cpu_offload:
        left_out.append("the device copy of a shard before each all-gather and of each gradient shard after "
                        "its reduce-scatter (one unit's shard at a time)")
    if request.grad_accum_steps > 1 and request.strategy.fully_sharded:
        # (DDP's walk takes the first, a middle and the last micro-batch each: they peak differently.)
        left_out.append("with accumulation, the micro-batches before the last, taken to peak no higher than the "
                        "last (they keep every gradient but hold no reduce-scatter buffer) except where a tied "
                        "head's two gradients are summed, which is counted for each")
    if request.strategy.fully_sharded and request.mixed_precision and request.mesh.shards == 1 and not request.cpu_offload:
        left_out.append("on a shard group of one GPU, FSDP2's bf16 copy of each parameter's shard before it is "
                        "copied into the unsharded parameter (up to two parameters' at once)")
    return tuple(left_out)


def step_shape(request: PlanRequest, micro_batch: int | None = None) -> StepShape:
    """The counts the memory model reads off a request (with another micro-batch, for the search)."""
    shapes = request.model.parameter_shapes()
    block_shapes = tuple(s for n, s in shapes if n.startswith("blocks.0."))
    root_shapes = tuple(s for n, s in shapes if not n.startswith("blocks."))
    return StepShape(
        strategy=request.strategy,
        shard_ranks=request.mesh.shards,
        world_size=request.mesh.world_size,
        layers=request.model.layers,
        width=request.model.width,
        heads=request.model.heads,
        vocab=request.model.vocab,
        tied=request.model.tied,
        bias=request.model.bias,
        block_shapes=block_shapes,
        root_shapes=root_shapes,
        micro_batch=request.micro_batch if micro_batch is None else micro_batch,
        seq=request.seq,
        mixed_precision=request.mixed_precision,
        activation_checkpointing=request.activation_checkpointing,
        cpu_offload=request.cpu_offload,
        grad_accum_steps=request.grad_accum_steps,
        prefetch=request.prefetch,
    )


def _figures(moment: Moment, request: PlanRequest, padding: Moment) -> PeakMemory:
    dtype = _dtype_label(request.mixed_precision)
    adam = "torch.optim.Adam: fp32 exp_avg and exp_avg_sq, a 4-byte step per tensor"
    if request.strategy.fully_sharded:
        offloaded = " (in host memory under CPU offload, not counted here)" if request.cpu_offload else ""
        model_states = {
            Category.PARAMETERS: f"FSDP2's fp32 shards{offloaded} plus gathered units at the compute dtype; any GPT of "
                                 "this shape",
            Category.GRADIENTS: f"FSDP2; fp32 shards{offloaded}, unsharded at the compute dtype until the unit's "
                                "reduce-scatter" + (" (kept in fp32 between micro-batches)"
                                                    if request.grad_accum_steps > 1 else ""),
            Category.OPTIMIZER_STATE: adam + offloaded,
            Category.ALL_GATHER_BUFFERS: "FSDP2's all-gather outputs (the prefetched block's, one ahead); compute dtype",
            Category.REDUCE_SCATTER_BUFFERS: "FSDP2: one unit's fp32 reduce-scatter input",
        }
    else:  # DDP holds every parameter and gradient whole: no shards, no gather or reduce-scatter buffers
        model_states = {
            Category.PARAMETERS: "DDP's full fp32 parameters on every GPU"
                                 + (", plus its bf16 copies for compute" if request.mixed_precision else "")
                                 + "; any GPT of this shape",
            Category.GRADIENTS: "DDP's full fp32 buckets (gradient_as_bucket_view), plus each new gradient at the "
                                "compute dtype until its hook copies it in"
                                + (", and under no_sync the kept fp32 ones until the last micro-batch copies "
                                   "them in" if request.grad_accum_steps > 1 else ""),
            Category.OPTIMIZER_STATE: adam + ("; ZeroRedundancyOptimizer: the fullest rank's whole tensors"
                                              if request.strategy is Strategy.ZERO1 else ""),
            Category.ALL_GATHER_BUFFERS: "none: DDP gathers nothing",
            Category.REDUCE_SCATTER_BUFFERS: "none: DDP all-reduces its buckets in place",
        }
    holds = {
        **model_states,
        Category.ACTIVATIONS: f"our GPT's saved tensors (SDPA flash layout), counted as on CPU; {dtype}",
        Category.TEMPORARIES: f"our GPT's backward, op by op (the loss's and the activations' gradients); {dtype}",
    }
    values = {
        Category.PARAMETERS: moment.parameters,
        Category.GRADIENTS: moment.gradients,
        Category.OPTIMIZER_STATE: moment.optimizer_state,
        Category.ACTIVATIONS: moment.activations,
        Category.TEMPORARIES: moment.temporaries,
        Category.ALL_GATHER_BUFFERS: moment.all_gather_buffers,
        Category.REDUCE_SCATTER_BUFFERS: moment.reduce_scatter_buffers,
    }
    return PeakMemory(
        moment=moment.name,
        categories=tuple((c, Figure(values[c], holds[c], getattr(padding, str(c)))) for c in Category),
        host_bytes=moment.host,
    )


def analytic_peak(request: PlanRequest, micro_batch: int | None = None) -> PeakMemory:
    """The per-GPU peak for the request (or for another micro-batch)."""
    moment, padding = peak_and_padding(step_shape(request, micro_batch))
    return _figures(moment, request, padding)


def largest_micro_batch(request: PlanRequest) -> int:
    """The largest micro-batch whose analytic peak fits in the usable memory; 0 if not even 1 fits.
    The peak grows with the micro-batch, so a search finds it exactly."""
    usable = request.usable_bytes

    @functools.cache  # the bracket's ends are read again each round
    def total(b: int) -> int:
        return peak(step_shape(request, b)).total

    def fits(b: int) -> bool:
        return total(b) <= usable

    if total(1) > usable:
        return 0
    if total(BOUNDS.micro_batch) <= usable:
        return BOUNDS.micro_batch
    # Each evaluation walks every layer's ops (1,024 layers at 131,072 GPUs: about 0.1 s each), so the
    # search probes where the line through the bracket's ends crosses the usable memory. The peak is
    # the largest of the step's moments, each growing by nearly fixed bytes per sequence: a bent line
    # under its chords, so the crossing tends to fit, and once both ends sit on the line that sets the
    # peak it is exact and the next sequence confirms it. The allocator's rounding bends it a little;
    # a bisection whenever a round fails to halve the bracket keeps the worst case near plain
    # bisection's. Exact either way: the peak grows with b.
    low, high = 1, BOUNDS.micro_batch  # fits(low), not fits(high)
    while high - low > 1:
        width = high - low
        crossing = low + (usable - total(low)) * (high - low) // (total(high) - total(low))
        for probe in (min(max(crossing, low + 1), high - 1), crossing + 1):
            if low < probe < high:
                low, high = (probe, high) if fits(probe) else (low, probe)
        if high - low > width // 2:
            middle = (low + high) // 2
            low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def plan_analytic(request: PlanRequest) -> Plan:
    """The analytic answer: peak memory by category, whether it fits, the largest micro-batch, and the
    communication per optimizer step. Pure arithmetic."""
    return Plan(
        request=request,
        method=Method.ANALYTIC,
        num_params=request.model.num_params,
        peak=analytic_peak(request),
        largest_micro_batch=largest_micro_batch(request),
        communication=collectives_per_step(request.strategy, request.mesh.shards, request.mesh.replicas,
                                           request.model.parameter_shapes(),
                                           mixed_precision=request.mixed_precision,
                                           grad_accum_steps=request.grad_accum_steps,
                                           cpu_offload=request.cpu_offload),
        holds=where_it_holds(request),
        leaves_out=analytic_leaves_out(request),
    )


PADDING_MATERIAL = 0.01  # FSDP2's padding is worth a sentence from 1% of the peak (70b at 1024 GPUs: 0.06%)


def padding_note(plan: Plan, unit: Callable[[int], str] = human_bytes) -> str | None:
    """Where FSDP2's padding is a material part of the peak, how much of it, in which categories and why, in
    one sentence (labelled PyTorch's, not the paper's); None where it is not. `unit` writes a byte count."""
    peak, r = plan.peak, plan.request
    if not peak.padding or peak.padding < PADDING_MATERIAL * peak.total:
        return None
    parts = ", ".join(f"{str(c).replace('_', ' ')} {unit(f.padding)} of {unit(f.bytes)}"
                      for c, f in peak.categories if f.padding >= PADDING_MATERIAL * peak.total)
    n, gpus = r.mesh.shards, "GPUs" if r.mesh.replicas == 1 else "GPUs in a shard group"
    few_rows = any(shape[0] < n for _, shape in r.model.parameter_shapes())
    why = (f"with more {gpus} than a tensor's rows, each GPU holds one padded row of it" if few_rows
           else f"each tensor's rows are padded up to a multiple of {n:,}")
    return (f"{unit(peak.padding)} of this {unit(peak.total)} peak is FSDP2's padding ({parts}): PyTorch's "
            f"implementation, not the ZeRO paper's even split, cuts each tensor by rows into {n:,} shards of "
            f"ceil(rows/{n:,}) rows and pads every GPU's shard to that, so {why}")


def with_strategy(request: PlanRequest, strategy: Strategy) -> PlanRequest:
    """The same request under another strategy."""
    return replace(request, strategy=strategy)


# How torch's FSDPMemTracker (the simulation's and `measure`'s tracker) files a unit's unsharded gradients:
# it labels them only at the unit's post-backward, so until then they count as temporaries.
TRACKER_GRADIENT_FILING = ("FSDPMemTracker as temporaries until their unit's post-backward hands them to its "
                           "reduce-scatter")


def filing_difference(analytic: Mapping[str, int], simulated: Mapping[str, int],
                      unit: Callable[[int], str] = human_bytes) -> str | None:
    """How the two methods' peaks differ by category ({category name: bytes} each), in one sentence; None
    when they agree category by category.

    FSDPMemTracker (the simulation's, and `measure`'s) files a unit's unsharded gradients as temporaries
    until that unit's post-backward hands them to its reduce-scatter: it labels them only there. The
    analytic model files them as gradients from the moment they are computed. Where the peak falls inside
    backward (a block's, with the root's head gradient waiting too), that moves bytes between the two
    categories and nothing else; any other difference is listed as it is. `unit` writes a byte count (the
    app's plan page gives decimal GB and MB, as its tables do)."""
    diff = {str(c): analytic.get(str(c), 0) - simulated.get(str(c), 0) for c in Category}
    moved = diff[str(Category.GRADIENTS)]
    if not any(diff.values()):
        return None
    if moved > 0 and diff[str(Category.TEMPORARIES)] == -moved and sum(map(abs, diff.values())) == 2 * moved:
        return (f"the categories differ only in filing: {unit(moved)} of unsharded gradients, which "
                f"the analytic model counts as gradients from the moment they are computed and {TRACKER_GRADIENT_FILING}")
    named = ", ".join(f"{c.replace('_', ' ')} {unit(abs(d))} {'more' if d > 0 else 'less'}"
                      for c, d in diff.items() if d)
    return f"the categories differ, analytic against simulated: {named}"


__all__ = [
    "GB", "DEFAULT_HEADROOM", "Category", "Collective", "Figure", "Mesh", "MeshDim", "Method", "ModelShape",
    "PeakMemory", "Plan", "PlanRequest", "analytic_peak", "filing_difference", "largest_micro_batch",
    "padding_note", "plan_analytic", "plan_json", "where_it_holds", "with_strategy",
]


def plan_json(plan: Plan) -> dict:
    """A plan as plain JSON: bytes as integers, enums as their names."""
    r = plan.request
    return {
        "method": str(plan.method),
        "request": {
            "model": {"name": r.model.name, "layers": r.model.layers, "width": r.model.width,
                      "heads": r.model.heads, "vocab": r.model.vocab, "seq_len": r.model.seq_len,
                      "tied": r.model.tied, "bias": r.model.bias},
            "mesh": {"replicas": r.mesh.replicas, "shards": r.mesh.shards, "world_size": r.mesh.world_size},
            "gpu_memory_gb": r.gpu_memory_gb, "gpu_memory_unit": "GB (1e9 bytes)",
            "micro_batch": r.micro_batch, "seq": r.seq, "strategy": str(r.strategy),
            "mixed_precision": r.mixed_precision, "activation_checkpointing": r.activation_checkpointing,
            "cpu_offload": r.cpu_offload, "grad_accum_steps": r.grad_accum_steps, "headroom": r.headroom,
        },
        "num_params": plan.num_params,
        "peak": {
            "moment": plan.peak.moment,
            "total_bytes": plan.peak.total,
            "categories": {str(c): {"bytes": f.bytes, "holds": f.holds} for c, f in plan.peak.categories},
            "host_bytes": plan.peak.host_bytes,
            # FSDP2's padding in the peak: the analytic model's (the simulation's tracker does not tell it apart)
            **({"padding_bytes": plan.peak.padding, "padding": padding_note(plan)}
               if plan.method is Method.ANALYTIC else {}),
        },
        "usable_bytes": r.usable_bytes,
        "fits": plan.fits,
        "headroom": plan.headroom_statement,
        "largest_micro_batch": plan.largest_micro_batch,
        "communication": [
            {"op": c.op, "phase": c.phase, "mesh_dim": str(c.mesh_dim), "ranks": c.ranks, "dtype": c.dtype,
             "calls": c.calls, "logical_bytes": c.logical_bytes, "wire_bytes_derived": c.wire_bytes_derived,
             "holds": c.holds}
            for c in plan.communication
        ],
        "wire_bytes_derived_from": WIRE_DERIVATION,
        "holds": plan.holds,
        "leaves_out": list(plan.leaves_out),
        "notes": list(plan.notes),
    }
