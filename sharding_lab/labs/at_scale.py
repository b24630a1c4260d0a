"""Every lab's effect at real scale: the same configurations, planned for a 7B model on 64 GPUs and a
70B model on 1024.

A lab measures `tiny` or `mini` on a few CPU ranks, so its numbers are KiB. `at_scale_line(lab)` says
what the same strategies and options cost per GPU for a real model: the peak memory, whether it fits
an 80 GB GPU with the planner's headroom, and the bytes each GPU sends per optimizer step. Peaks come
from the FSDP2 simulation where it was run (`sharding-lab at-scale --write` stores them in
`at_scale_simulated.json` beside this module) and are labelled "simulated"; the rest (DDP and ZeRO-1,
which the simulation does not build; CPU offload, whose host memory the CPU-run simulation cannot tell
from the device's; and communication) come from the analytic planner and are labelled "analytic". Torch-free: the web app and the Anki export call this.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from sharding_lab.labs.base import Lab
from sharding_lab.model_config import SIZES, num_params
from sharding_lab.planner import Mesh, ModelShape, PlanRequest, plan_analytic
from sharding_lab.run_config import RunConfig
from sharding_lab.strategies import Strategy

SIMULATED_FIGURES = Path(__file__).with_name("at_scale_simulated.json")
GB = 10**9
HSDP_SHARD_GROUP = 8  # at scale HSDP shards within a node of 8 GPUs and replicates across nodes


@dataclass(frozen=True)
class Scale:
    """A real training setup the labs' effects are projected onto."""

    size: str  # a named size (model_config.SIZES)
    gpus: int
    gpu_memory_gb: float = 80.0  # an H100
    micro_batch: int = 1
    seq: int = 2048

    @property
    def label(self) -> str:
        billions = num_params(SIZES[self.size]) / 1e9
        return (f"{self.size} ({billions:.1f}B parameters) on {self.gpus} x {self.gpu_memory_gb:g} GB GPUs, "
                f"micro-batch {self.micro_batch} x {self.seq} tokens")


SCALES: tuple[Scale, ...] = (Scale("7b", 64), Scale("70b", 1024))


def scaled_request(config: RunConfig, scale: Scale) -> PlanRequest:
    """The lab configuration's strategy and options, for the scale's model and GPUs. A zero3 run with
    reshard-after-forward off is zero2 as the engine runs it (the planner's two FSDP strategies)."""
    strategy = config.strategy
    if strategy.fully_sharded and config.reshard_after_forward is False:
        strategy = Strategy.ZERO2
    elif strategy.fully_sharded:
        strategy = Strategy.ZERO3
    options = config.options
    mesh = Mesh.of(scale.gpus)
    if options.replicas > 1:
        mesh = Mesh(shards=HSDP_SHARD_GROUP, replicas=scale.gpus // HSDP_SHARD_GROUP)
    return PlanRequest(
        model=ModelShape.named(scale.size),
        mesh=mesh,
        gpu_memory_gb=scale.gpu_memory_gb,
        micro_batch=scale.micro_batch,
        seq=scale.seq,
        strategy=strategy,
        mixed_precision=options.mixed_precision,
        activation_checkpointing=options.activation_checkpointing,
        cpu_offload=options.cpu_offload,
        grad_accum_steps=config.grad_accum_steps,
        prefetch=options.prefetch,
    )


def request_key(request: PlanRequest) -> str:
    """A stable text key for a request: how the simulated figures are stored."""
    return (
        f"{request.model.name} {request.strategy} mesh={request.mesh} gpu={request.gpu_memory_gb:g}GB "
        f"mb={request.micro_batch} seq={request.seq} mp={int(request.mixed_precision)} "
        f"ac={int(request.activation_checkpointing)} offload={int(request.cpu_offload)} "
        f"accum={request.grad_accum_steps} prefetch={int(request.prefetch)}"
    )


def lab_requests(lab: Lab, scale: Scale) -> dict[str, PlanRequest]:
    """The lab's distinct configurations at this scale, labelled as its runs are (in its order)."""
    requests: dict[str, PlanRequest] = {}
    for spec in lab.runs(2):  # the options do not depend on the world size; HSDP labs run at 4
        request = scaled_request(spec.config, scale)
        if request not in requests.values():
            requests[_describe(request)] = request
    return requests


def _describe(request: PlanRequest) -> str:
    extras = [
        name for name, on in (
            ("bf16", request.mixed_precision),
            ("checkpointing", request.activation_checkpointing),
            ("offload", request.cpu_offload),
            (f"HSDP {request.mesh}", request.mesh.replicas > 1),
            (f"{request.grad_accum_steps} micro-batches", request.grad_accum_steps > 1),
            ("no prefetch", not request.prefetch),
        ) if on
    ]
    return f"{request.strategy}" + (f" ({', '.join(extras)})" if extras else "")


@cache
def simulated_figures() -> dict[str, dict]:
    """{request_key: {"peak_bytes", ...}} as `sharding-lab at-scale --write` stored them ({} if never run)."""
    if not SIMULATED_FIGURES.exists():
        return {}
    return json.loads(SIMULATED_FIGURES.read_text(encoding="utf-8"))["figures"]


@dataclass(frozen=True)
class ScaledFigure:
    label: str  # e.g. "zero3 (bf16)"
    peak_bytes: int
    peak_method: str  # "simulated" or "analytic"
    fits: bool
    sent_bytes_per_step: int  # per GPU, every collective's derived wire bytes: analytic


def scaled_figures(lab: Lab, scale: Scale) -> list[ScaledFigure]:
    requests = lab_requests(lab, scale)
    simulated = simulated_figures()
    # One method for a line's FSDP2 figures: where one of them cannot be simulated (CPU offload), all are
    # analytic, so the line never sets a simulated peak against an analytic one as if the gap were the
    # option's effect. DDP and ZeRO-1, which the simulation does not build, are analytic throughout.
    fsdp = [r for r in requests.values() if r.strategy.fully_sharded]
    if not all(request_key(r) in simulated for r in fsdp):
        simulated = {}
    figures = []
    for label, request in requests.items():
        stored = simulated.get(request_key(request))
        plan = plan_analytic(request)
        peak = stored["peak_bytes"] if stored else plan.peak.total
        sent = sum(c.wire_bytes_derived for c in plan.communication)
        figures.append(ScaledFigure(label, peak, "simulated" if stored else "analytic", peak <= request.usable_bytes,
                                    sent))
    return figures


def at_scale_line(lab: Lab) -> str:
    """The lab's configurations at each scale: peak per GPU (and by which method), whether it fits, and
    the bytes each GPU sends per optimizer step."""
    lines = []
    for scale in SCALES:
        parts = []
        for f in scaled_figures(lab, scale):
            fit = "fits" if f.fits else "does NOT fit"
            parts.append(f"{f.label} {f.peak_bytes / GB:.1f} GB per GPU ({f.peak_method}), {fit}, "
                         f"{f.sent_bytes_per_step / GB:.1f} GB sent")
        lines.append(f"{scale.label}: " + "; ".join(parts) + ".")
    return (
        "At scale (PyTorch's implementations, planned, not measured: peak per GPU from the FSDP2 simulation "
        "where marked simulated, else the analytic planner; fp32 unless marked bf16, which is bf16 compute "
        "with fp32 master copies and reductions; torch.optim.Adam; fits = within 90% of the GPU; sent = wire bytes per "
        "GPU per optimizer step, derived from ring formulas): " + " ".join(lines)
    )
