"""Labs on the memory that model-state sharding does not touch, and on FSDP2's options that move it:
activations and temporaries as ranks are added, activation checkpointing, mixed precision's copies,
CPU offload and gradient accumulation.

Memory figures are the engine's tracker over the measured step (each category's own maximum, and the
peak); model states are the exact local tensors between steps.
"""

from __future__ import annotations

from dataclasses import dataclass

from sharding_lab.labs import charts
from sharding_lab.labs.base import (
    Conditions,
    Lab,
    Measurements,
    Report,
    RunSpec,
    Table,
    Verdict,
    catalog_lab,
    count_of,
    near,
    percent,
    runs_at,
)
from sharding_lab.measurement import PARTS, Measurement
from sharding_lab.run_config import RunConfig
from sharding_lab.strategies import Strategy
from sharding_lab.svg import Bar, stacked_bar_chart
from sharding_lab.units import human_bytes

# gloo's worker thread frees some temporaries at varying moments: per-rank figures that should not
# depend on N are held equal within this much.
SAME_TOLERANCE = 0.005
# At N=1 FSDP2 runs no reduce-scatter, yet still copies each unit's gradients into a reduce-scatter input
# and then into an output as large (from N=2, 1/N of it); with no collective to label them by, the
# tracker files both as temporaries. On mini the root's two copies (2 x 2,114,048 B) outweigh the loss's
# backward (4 MiB at every N), so N=1's temporaries read 0.8% above N=2's.
N1_TEMPORARIES_TOLERANCE = 0.01


# --- activation-memory-per-rank ---------------------------------------------------------------------------


def activation_key(world_size: int) -> str:
    return f"zero3, mini, N={world_size}"


def activation_runs(world_size: int) -> tuple[RunSpec, ...]:
    return tuple(
        RunSpec(activation_key(n), RunConfig(Strategy.ZERO3, world_size=n, size="mini"), size_fixed=True)
        for n in sorted({1, world_size, 2 * world_size})
    )


@dataclass(frozen=True)
class RankMemoryAtN:
    """The fullest rank of one run, over the measured step."""

    world_size: int
    model_states: int  # between steps, exact tensors
    sharded: bool  # every model-state part split across the ranks, nothing replicated
    activations: int  # the most activation bytes alive at once
    temporaries: int  # the most temporary bytes alive at once
    peak: int

    @property
    def unsharded_share(self) -> float:
        """Activations and temporaries over the peak: what sharding did not divide."""
        return (self.activations + self.temporaries) / self.peak if self.peak else 0.0


def analyse_activation_memory(ms: Measurements) -> list[RankMemoryAtN]:
    points = []
    for m in sorted(ms.values(), key=lambda m: m.world_size):
        points.append(
            RankMemoryAtN(
                world_size=m.world_size,
                model_states=max(m.model_states_bytes()),
                sharded=all(m.sharded(part) for part in PARTS),
                activations=max(r.category_peaks.get("activations", 0) for r in m.ranks),
                temporaries=max(r.category_peaks.get("temporaries", 0) for r in m.ranks),
                peak=max(r.peak_bytes for r in m.ranks),
            )
        )
    return points


def check_activation_memory(points: list[RankMemoryAtN]) -> Verdict:
    c = Conditions()
    c.require(len(points) >= 3, f"measured at three world sizes ({[p.world_size for p in points]})")
    first, last = points[0], points[-1]
    for p in points:
        c.require(
            p.sharded,
            f"N={p.world_size}: model states sharded, {human_bytes(p.model_states)} on the fullest rank "
            f"({p.model_states / first.model_states:.3f} of N={first.world_size}'s)",
        )
    activations = [p.activations for p in points]
    c.require(
        min(activations) > 0 and all(near(v, activations[0], SAME_TOLERANCE) for v in activations),
        f"each rank's activations stay the same as N grows ({' / '.join(f'{v:,}' for v in activations)} B)",
    )
    temporaries = [p.temporaries for p in points]
    c.require(
        min(temporaries) > 0 and all(v >= temporaries[0] * (1 - N1_TEMPORARIES_TOLERANCE) for v in temporaries),
        f"each rank's temporaries do not shrink as N grows, within {percent(N1_TEMPORARIES_TOLERANCE)} "
        f"({' / '.join(f'{v:,}' for v in temporaries)} B)",
    )
    c.require(
        last.unsharded_share > first.unsharded_share
        and last.peak * last.world_size > first.peak * first.world_size,
        f"activations and temporaries grow from {percent(first.unsharded_share)} of the peak at N={first.world_size} "
        f"to {percent(last.unsharded_share)} at N={last.world_size}; the peak falls to "
        f"{last.peak / first.peak:.2f} of N={first.world_size}'s, not {first.world_size / last.world_size:.2f}",
    )
    return c.verdict()


def report_activation_memory(points: list[RankMemoryAtN]) -> Report:
    first, last = points[0], points[-1]
    states = ", ".join(f"{human_bytes(p.model_states)} at N={p.world_size}" for p in points)
    finding = (
        f"On the mini model under FSDP (batch 2 x 64 tokens per rank, fp32), each rank's model states fell with N "
        f"({states}) while its activations stayed {human_bytes(last.activations)} at every N and its temporaries did not "
        f"shrink ({', '.join(human_bytes(p.temporaries) for p in points)}): each rank runs the whole model on its own micro-batch, and "
        f"sharding divides parameters, gradients and optimizer state, not what the forward pass saves or the "
        f"kernels allocate on the way (the logits alone are batch x tokens x vocab x 4 B). So the peak fell only "
        f"from {human_bytes(first.peak)} to {human_bytes(last.peak)} ({last.peak / first.peak:.2f}x, not "
        f"{first.world_size / last.world_size:.2f}x) and activations plus temporaries went from "
        f"{percent(first.unsharded_share)} of it at N={first.world_size} to {percent(last.unsharded_share)} at "
        f"N={last.world_size} (the tracker's figures). Activation checkpointing, a smaller micro-batch or "
        f"sequence/tensor parallelism cut them; more data-parallel ranks do not."
    )
    rows = tuple(
        (p.world_size, p.model_states, p.activations, p.temporaries, p.peak, round(p.unsharded_share, 4))
        for p in points
    )
    chart = stacked_bar_chart(
        "The fullest rank's memory as ranks are added (mini, FSDP)",
        [
            Bar(
                f"N={p.world_size}",
                {"model states": p.model_states, "activations": p.activations, "temporaries": p.temporaries},
            )
            for p in points
        ],
        ["model states", "activations", "temporaries"],
        colours={"model states": charts.MEMORY_COLOURS["optimizer"], **charts.MEMORY_COLOURS},
    )
    return Report(
        finding,
        Table(
            (
                "world size",
                "model states bytes (fullest rank)",
                "activation bytes at most",
                "temporary bytes at most",
                "peak bytes",
                "activations + temporaries over peak",
            ),
            rows,
        ),
        {"memory_by_n": chart},
    )


# --- fsdp2-mixed-precision -----------------------------------------------------------------------------


MIXED = "zero3 mixed precision"  # the same configuration as the Adam and tradeoff labs' (shared measurement)
PAPER_MIXED_BYTES = {"params": 2, "grads": 2, "optimizer": 12}  # the ZeRO paper's fp16 Adam, per parameter


@dataclass(frozen=True)
class PrecisionCopies:
    fp32: Measurement
    mixed: Measurement
    per_param: dict[str, float]  # part -> bytes per parameter of rank 0's shard, mixed run
    gather_dtypes: set[str]
    reduce_dtypes: set[str]
    gathered: dict[str, int]  # run key -> bytes all-gathered in forward
    scattered: dict[str, int]  # run key -> bytes reduce-scattered
    unsharded_peak: dict[str, int]  # run key -> most gathered parameter bytes alive at once (rank 0)


def analyse_mixed_precision(ms: Measurements) -> PrecisionCopies:
    fp32, mixed = ms["zero3"], ms[MIXED]
    shard = mixed.padded_num_params // mixed.world_size
    return PrecisionCopies(
        fp32=fp32,
        mixed=mixed,
        per_param={part: mixed.part_bytes(part)[0] / shard for part in PARTS},
        gather_dtypes={c.dtype or "?" for c in mixed.collectives(op="all_gather")},
        reduce_dtypes={c.dtype or "?" for c in mixed.collectives(op="reduce_scatter")},
        gathered={
            key: sum(c.bytes for c in m.collectives(op="all_gather", phase="forward"))
            for key, m in (("zero3", fp32), (MIXED, mixed))
        },
        scattered={
            key: sum(c.bytes for c in m.collectives(op="reduce_scatter"))
            for key, m in (("zero3", fp32), (MIXED, mixed))
        },
        unsharded_peak={key: m.unsharded_peak()[0] for key, m in (("zero3", fp32), (MIXED, mixed))},
    )


def check_mixed_precision(a: PrecisionCopies) -> Verdict:
    c = Conditions()
    layout = "/".join(f"{a.per_param[part]:g}" for part in PARTS)
    c.require(
        a.per_param == {"params": 4.0, "grads": 4.0, "optimizer": 8.0},
        f"between steps each rank keeps fp32 shards, fp32 gradients and fp32 Adam state: {layout} bytes per "
        f"parameter of its shard (the paper's mixed precision: 2/2/12)",
    )
    padded = a.mixed.padded_num_params
    c.require(
        a.gather_dtypes == {"bfloat16"} and a.gathered[MIXED] == 2 * padded,
        f"forward all-gathers move bf16 copies for compute ({sorted(a.gather_dtypes)}; {a.gathered[MIXED]:,} B, "
        f"2 B x {padded:,}; fp32 moved {a.gathered['zero3']:,} B)",
    )
    c.require(
        a.reduce_dtypes == {"float32"} and a.scattered[MIXED] == 4 * padded,
        f"reduce-scatters move fp32 gradients ({sorted(a.reduce_dtypes)}; {a.scattered[MIXED]:,} B, 4 B x {padded:,})",
    )
    c.require(
        near(a.unsharded_peak[MIXED], a.unsharded_peak["zero3"] / 2, 0.01),
        f"the gathered parameters for compute are bf16: at most {a.unsharded_peak[MIXED]:,} B alive at once, half "
        f"fp32's {a.unsharded_peak['zero3']:,} B",
    )
    return c.verdict()


def _dtype_of(bytes_per_element: float) -> str:
    """The dtype a shard's measured bytes per element imply (a 2-byte one could be bf16 or fp16)."""
    return {4.0: "float32", 2.0: "2-byte (bf16 or fp16)"}.get(bytes_per_element, f"{bytes_per_element:g} B per element")


def report_mixed_precision(a: PrecisionCopies) -> Report:
    n = a.mixed.world_size
    layout = "/".join(f"{a.per_param[part]:g}" for part in PARTS)
    finding = (
        f"FSDP2's MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) at N={n}: between steps each rank kept "
        f"{layout} bytes per parameter of its shard (fp32 parameters, which are the master weights, fp32 "
        f"gradients, fp32 Adam state), 16 in all, where the ZeRO paper's mixed precision keeps 2/2/12 (fp16 "
        f"parameters and gradients, K = 12 for an fp32 master copy and the two moments), also 16. The bf16 copy "
        f"exists only while a unit is gathered: forward all-gathers moved {human_bytes(a.gathered[MIXED])} in bf16 "
        f"against {human_bytes(a.gathered['zero3'])} in fp32, and the gathered parameters alive at once peaked at "
        f"{human_bytes(a.unsharded_peak[MIXED])} against {human_bytes(a.unsharded_peak['zero3'])}. Gradients were "
        f"reduce-scattered in fp32 ({human_bytes(a.scattered[MIXED])}, as in the fp32 run), so the step moves half "
        f"the all-gather bytes and the same reduce-scatter bytes."
    )
    padded = a.mixed.padded_num_params
    rows = (
        ("parameter shard (master weights)", _dtype_of(a.per_param["params"]), a.per_param["params"],
         PAPER_MIXED_BYTES["params"]),
        ("gradient shard", _dtype_of(a.per_param["grads"]), a.per_param["grads"], PAPER_MIXED_BYTES["grads"]),
        ("Adam state (two moments)", _dtype_of(a.per_param["optimizer"] / 2), a.per_param["optimizer"],
         PAPER_MIXED_BYTES["optimizer"]),
        ("gathered parameters for compute (transient)", "/".join(sorted(a.gather_dtypes)),
         a.gathered[MIXED] / padded, 2),
        ("reduce-scatter (on the wire)", "/".join(sorted(a.reduce_dtypes)), a.scattered[MIXED] / padded, 2),
    )
    chart = stacked_bar_chart(
        f"Bytes moved per step by collective (N={n})",
        [
            Bar(key, {"all_gather": a.gathered[key], "reduce_scatter": a.scattered[key]})
            for key in ("zero3", MIXED)
        ],
        ["all_gather", "reduce_scatter"],
        colours=charts.OP_COLOURS,
    )
    return Report(
        finding,
        Table(
            (
                "copy",
                "dtype (measured: a shard's from its bytes, a collective's from its tensors)",
                "bytes per parameter (PyTorch, measured)",
                "bytes per parameter (ZeRO paper)",
            ),
            rows,
        ),
        {
            "bytes_by_collective": chart,
            "model_states": charts.model_states_chart(
                f"Model states per rank (rank 0, N={n})", {"zero3": a.fp32, MIXED: a.mixed}, ["zero3", MIXED]
            ),
        },
    )


# --- activation-checkpointing ------------------------------------------------------------------------------


CHECKPOINTED = "zero3, mini, checkpointed"
PLAIN = "zero3, mini"  # the same configuration as the persistence lab's (shared measurement)


def checkpointing_runs(world_size: int) -> tuple[RunSpec, ...]:
    plain = RunConfig(Strategy.ZERO3, world_size=world_size, size="mini")
    return (
        RunSpec(PLAIN, plain, size_fixed=True),
        RunSpec(CHECKPOINTED, plain.replace(activation_checkpointing=True), size_fixed=True),
    )


def forward_runs(m: Measurement, block: int) -> int:
    """How many times block `block`'s forward started in the step (the timeline's forward starts)."""
    name = f"blocks.{block}"
    return sum(1 for e in m.timeline() if e.kind == "start" and e.phase == "forward" and e.module == name)


@dataclass(frozen=True)
class Checkpointing:
    plain: Measurement
    checkpointed: Measurement
    saved: dict[str, int]  # run key -> activation bytes saved for backward when forward returns (rank 0)
    activation_peak: dict[str, int]  # run key -> most activation bytes alive at once
    peak: dict[str, int]  # run key -> the step's peak
    forward_runs: dict[str, list[int]]  # run key -> per block: forward starts in the step
    block_input: int  # one block's input: batch x tokens x width x 4 B
    same_collectives: bool  # the checkpointed run issued the same collectives, same bytes
    step_time: dict[str, float]


def analyse_checkpointing(ms: Measurements) -> Checkpointing:
    runs = {PLAIN: ms[PLAIN], CHECKPOINTED: ms[CHECKPOINTED]}
    plain = runs[PLAIN]
    config = plain.config
    return Checkpointing(
        plain=plain,
        checkpointed=runs[CHECKPOINTED],
        saved={k: m.ranks[0].activations_after_forward_bytes for k, m in runs.items()},
        activation_peak={k: m.ranks[0].category_peaks.get("activations", 0) for k, m in runs.items()},
        peak={k: m.ranks[0].peak_bytes for k, m in runs.items()},
        forward_runs={k: [forward_runs(m, i) for i in range(m.n_blocks)] for k, m in runs.items()},
        block_input=config.batch_size_per_rank * config.seq_len * config.model["n_embd"] * 4,
        same_collectives=[(c.op, c.bytes) for c in plain.collectives()]
        == [(c.op, c.bytes) for c in runs[CHECKPOINTED].collectives()],
        step_time={k: m.step_time_s for k, m in runs.items()},
    )


def check_checkpointing(a: Checkpointing) -> Verdict:
    c = Conditions()
    c.require(
        a.checkpointed.config.activation_checkpointing and not a.plain.config.activation_checkpointing,
        f"one run checkpoints all {a.checkpointed.n_blocks} blocks, the other none",
    )
    once, twice = [n == 1 for n in a.forward_runs[PLAIN]], [n == 2 for n in a.forward_runs[CHECKPOINTED]]
    c.require(
        all(once) and all(twice),
        f"each block's forward ran once without checkpointing ({count_of(once)} blocks) and twice with it "
        f"({count_of(twice)} blocks): backward recomputed it",
    )
    saved_plain, saved_checkpointed = a.saved[PLAIN], a.saved[CHECKPOINTED]
    blocks = a.plain.n_blocks
    c.require(
        0 < saved_checkpointed < saved_plain and saved_plain - saved_checkpointed > blocks * a.block_input,
        f"saved for backward when forward returns: {saved_checkpointed:,} B checkpointed against {saved_plain:,} B "
        f"(each of the {blocks} blocks kept its {a.block_input:,} B input instead of every intermediate)",
    )
    c.require(
        a.activation_peak[CHECKPOINTED] < a.activation_peak[PLAIN] and a.peak[CHECKPOINTED] < a.peak[PLAIN],
        f"the activation peak fell from {a.activation_peak[PLAIN]:,} to {a.activation_peak[CHECKPOINTED]:,} B and "
        f"the step's peak from {a.peak[PLAIN]:,} to {a.peak[CHECKPOINTED]:,} B",
    )
    c.require(
        a.same_collectives and a.checkpointed.model_states_bytes() == a.plain.model_states_bytes(),
        f"the same {len(a.plain.collectives())} collectives and {a.plain.model_states_bytes()[0]:,} B of model states "
        "(rank 0): the recompute uses the all-gather backward issues anyway",
    )
    return c.verdict()


def report_checkpointing(a: Checkpointing) -> Report:
    saved_plain, saved_checkpointed = a.saved[PLAIN], a.saved[CHECKPOINTED]
    finding = (
        f"On the mini model under FSDP (batch 2 x 64 tokens per rank, fp32), checkpointing every block cut what "
        f"forward saves for backward from {human_bytes(saved_plain)} to {human_bytes(saved_checkpointed)} "
        f"({saved_checkpointed / saved_plain:.2f}x: each of the {a.plain.n_blocks} blocks keeps only its "
        f"{human_bytes(a.block_input)} input; the rest is the embeddings', final norm's and logits' activations) "
        f"and the step's peak from {human_bytes(a.peak[PLAIN])} to {human_bytes(a.peak[CHECKPOINTED])}. The price "
        f"is compute: every block's forward ran twice per step (once in forward, once recomputed in backward), "
        f"about a third more block compute when backward costs twice forward (derived: CPU step times, in the "
        f"table, are too noisy to show it). Communication and model states did not change: the recompute reuses the all-gather backward issues anyway."
    )
    rows = tuple(
        (
            key,
            a.saved[key],
            a.activation_peak[key],
            a.peak[key],
            sum(a.forward_runs[key]),
            len(m.collectives()),
            round(a.step_time[key], 4),
        )
        for key, m in ((PLAIN, a.plain), (CHECKPOINTED, a.checkpointed))
    )
    chart = stacked_bar_chart(
        "Activations saved for backward, and the step's peak (rank 0)",
        [Bar(f"{key}: saved", {"activations": a.saved[key]}) for key in (PLAIN, CHECKPOINTED)]
        + [Bar(f"{key}: peak", {"peak": a.peak[key]}) for key in (PLAIN, CHECKPOINTED)],
        ["activations", "peak"],
        colours={
            "activations": charts.MEMORY_COLOURS["activations"],
            "peak": charts.MEMORY_COLOURS["temporaries"],
        },
    )
    return Report(
        finding,
        Table(
            (
                "run",
                "activations saved when forward returns (bytes)",
                "activation bytes at most",
                "peak bytes",
                "block forwards per step",
                "collectives per step",
                "step time s (noisy on CPU)",
            ),
            rows,
        ),
        {
            "memory": chart,
            "timeline": charts.timeline_chart(
                "Checkpointed FSDP step: each block's forward twice", a.checkpointed
            ),
        },
    )


# --- cpu-offload-traffic ---------------------------------------------------------------------------------


OFFLOADED = "zero3, mini, cpu offload"


def offload_runs(world_size: int) -> tuple[RunSpec, ...]:
    plain = RunConfig(Strategy.ZERO3, world_size=world_size, size="mini")
    return (
        RunSpec(PLAIN, plain, size_fixed=True),
        RunSpec(OFFLOADED, plain.replace(cpu_offload=True), size_fixed=True),
    )


@dataclass(frozen=True)
class Offload:
    plain: Measurement
    offloaded: Measurement
    same_collectives: bool
    gathers: int  # all-gathers per step
    scatters: int
    host_to_device: int  # derived: each all-gather's input, the rank's parameter shard, copied up
    device_to_host: int  # derived: each reduce-scatter's output, the rank's gradient shard, copied down
    grad_shard: int  # measured: rank 0's gradient shard between steps (rank 0's shard is never short)
    model_states: int  # measured: rank 0's model states, which offload keeps on the host


def analyse_offload(ms: Measurements) -> Offload:
    plain, offloaded = ms[PLAIN], ms[OFFLOADED]
    n = offloaded.world_size
    gathers, scatters = offloaded.collectives(op="all_gather"), offloaded.collectives(op="reduce_scatter")
    return Offload(
        plain=plain,
        offloaded=offloaded,
        same_collectives=[(c.op, c.bytes) for c in plain.collectives()]
        == [(c.op, c.bytes) for c in offloaded.collectives()],
        gathers=len(gathers),
        scatters=len(scatters),
        host_to_device=sum(c.bytes // n for c in gathers),
        device_to_host=sum(c.bytes // n for c in scatters),
        grad_shard=offloaded.part_bytes("grads")[0],
        model_states=offloaded.model_states_bytes()[0],
    )


def check_offload(a: Offload) -> Verdict:
    c = Conditions()
    c.require(
        a.offloaded.config.cpu_offload and not a.plain.config.cpu_offload,
        f"one run offloads its {a.model_states:,} B of model states per rank with FSDP2's CPUOffloadPolicy, the "
        "other does not",
    )
    # Where the states are, read off the tensors: on a GPU the plain run keeps them on the device and the
    # offloaded one on the host. On CPU ranks the device is the host, so this cannot tell the runs apart.
    device = a.plain.config.device.split(":")[0]
    offloaded_on = sorted({r.states_device for r in a.offloaded.ranks})
    c.require(
        offloaded_on == ["cpu"],
        f"the offloaded run's {a.model_states:,} B of parameter shards, gradients and Adam state per rank are on "
        f"the host on all {len(a.offloaded.ranks)} ranks ({', '.join(offloaded_on)})"
        + ("" if device != "cpu" else "; on CPU ranks the plain run's are too: only a GPU run tells them apart"),
    )
    if device != "cpu":
        plain_on = sorted({r.states_device for r in a.plain.ranks})
        c.require(plain_on == [device], f"the plain run's are on the device on all {len(a.plain.ranks)} ranks "
                                        f"({', '.join(plain_on)})")
    c.require(
        a.same_collectives,
        f"offload leaves the collectives alone: the same {a.gathers} all-gathers and {a.scatters} reduce-scatters, "
        f"byte for byte",
    )
    c.require(
        a.offloaded.model_states_bytes() == a.plain.model_states_bytes(),
        f"the same model states per rank ({a.model_states:,} B), now in host memory",
    )
    c.require(
        a.device_to_host == a.grad_shard,
        f"device to host per step: the reduce-scatters' outputs, {a.device_to_host:,} B, are the rank's gradient "
        f"shard ({a.grad_shard:,} B measured)",
    )
    param_shard = a.offloaded.part_bytes("params")[0]  # rank 0's, measured
    c.require(
        param_shard < a.host_to_device < 2 * param_shard,
        f"host to device per step: every all-gather's input, {a.host_to_device:,} B, between one and two copies of "
        f"the {param_shard:,} B parameter shard (forward gathers every unit, backward all but the root)",
    )
    return c.verdict()


def report_offload(a: Offload) -> Report:
    n = a.offloaded.world_size
    param_shard = a.offloaded.part_bytes("params")[0]  # rank 0's, measured
    finding = (
        f"FSDP2's CPU offload (CPUOffloadPolicy) on the mini model at N={n} kept each rank's "
        f"{human_bytes(a.model_states)} of model states (fp32 parameter shard, gradient shard, Adam state) in host "
        f"memory (where Adam then steps, by FSDP2's design: not checked here), and changed no collective: the same {a.gathers} all-gathers and {a.scatters} "
        f"reduce-scatters, byte for byte. What it adds is copies: before every all-gather the rank's parameter "
        f"shard goes host to device, {human_bytes(a.host_to_device)} per step "
        f"({a.host_to_device / param_shard:.2f}x the {human_bytes(param_shard)} shard: forward gathers every unit, "
        f"backward all but the root), and every reduce-scatter's output goes device to host, "
        f"{human_bytes(a.device_to_host)} per step (the gradient shard). Those bytes are derived from the measured "
        f"collectives' inputs and outputs: on CPU ranks the device is the host, so neither the copies nor the device "
        f"memory saved (the whole {human_bytes(a.model_states)} of model states per rank, on a GPU) show in this "
        f"measurement; on a GPU they cross PCIe every step."
    )
    rows = (
        ("host to device (parameter shards before all-gathers)", a.gathers, a.host_to_device, "derived"),
        ("device to host (gradient shards after reduce-scatters)", a.scatters, a.device_to_host, "derived"),
        ("model states kept on the host", "", a.model_states, "measured"),
    )
    chart = stacked_bar_chart(
        f"Host and device traffic per step with CPU offload (rank 0, N={n}, derived)",
        [
            Bar("host to device", {"all_gather": a.host_to_device}),
            Bar("device to host", {"reduce_scatter": a.device_to_host}),
        ],
        ["all_gather", "reduce_scatter"],
        colours=charts.OP_COLOURS,
    )
    return Report(
        finding,
        Table(("copy", "collectives", "bytes per step", "how known"), rows),
        {
            "traffic": chart,
            "model_states": charts.model_states_chart(
                f"Model states per rank (rank 0, N={n})",
                {PLAIN: a.plain, OFFLOADED: a.offloaded},
                [PLAIN, OFFLOADED],
            ),
        },
    )


# --- grad-accumulation-no-sync -------------------------------------------------------------------------------


ACCUM_STEPS = 4
ACCUMULATED = f"zero3, {ACCUM_STEPS} micro-batches"


@dataclass(frozen=True)
class Accumulation:
    one: Measurement  # one micro-batch per step
    accumulated: Measurement  # ACCUM_STEPS micro-batches, gradients synced on the last only
    gathers: dict[str, int]  # run key -> all-gathers per optimizer step
    scatters: dict[str, int]
    scattered_bytes: dict[str, int]
    grad_peak: dict[str, int]  # run key -> most gradient bytes alive at once (rank 0)
    full_grads: int  # 4Ψ: the unsharded gradients
    largest_unit: int  # the largest FSDP unit's unsharded gradient bytes (fp32, as its parameters)
    shard: int  # rank 0's gradient shard (rank 0's is never short of FSDP's padded size)
    micro_batches: int


def analyse_accumulation(ms: Measurements) -> Accumulation:
    runs = {"zero3": ms["zero3"], ACCUMULATED: ms[ACCUMULATED]}
    return Accumulation(
        one=runs["zero3"],
        accumulated=runs[ACCUMULATED],
        gathers={k: len(m.collectives(op="all_gather")) for k, m in runs.items()},
        scatters={k: len(m.collectives(op="reduce_scatter")) for k, m in runs.items()},
        scattered_bytes={
            k: sum(c.bytes for c in m.collectives(op="reduce_scatter")) for k, m in runs.items()
        },
        grad_peak={k: m.ranks[0].category_peaks.get("grads", 0) for k, m in runs.items()},
        full_grads=runs["zero3"].full_bytes("grads"),
        largest_unit=max(runs["zero3"].root_and_block_bytes()),
        shard=runs["zero3"].ranks[0].grads_bytes,
        micro_batches=runs[ACCUMULATED].config.grad_accum_steps,
    )


def check_accumulation(a: Accumulation) -> Verdict:
    k = a.micro_batches
    c = Conditions()
    c.require(k > 1, f"the accumulating run takes {k} micro-batches per optimizer step")
    c.require(
        a.scatters[ACCUMULATED] == a.scatters["zero3"]
        and a.scattered_bytes[ACCUMULATED] == a.scattered_bytes["zero3"],
        f"one reduce-scatter per unit per optimizer step, not per micro-batch ({a.scatters[ACCUMULATED]} "
        f"reduce-scatters of {a.scattered_bytes[ACCUMULATED]:,} B; one micro-batch: {a.scatters['zero3']}; syncing "
        f"every micro-batch would issue {k * a.scatters['zero3']})",
    )
    c.require(
        a.gathers[ACCUMULATED] == k * a.gathers["zero3"],
        f"all-gathers still run for every micro-batch ({a.gathers[ACCUMULATED]} = {k} x {a.gathers['zero3']})",
    )
    # Reduce-scattering in each backward, a unit's unsharded gradient lives only until its reduce-scatter:
    # at most one unit's beside every shard. The root can be the largest unit (on `mini`, half the model,
    # so that bound passes 4Ψ there): the accumulating run is held to more than the syncing run measured.
    one_unit = a.largest_unit + a.shard
    c.require(
        a.grad_peak[ACCUMULATED] >= a.full_grads
        and a.grad_peak["zero3"] <= one_unit and a.grad_peak["zero3"] < a.grad_peak[ACCUMULATED],
        f"between micro-batches every rank holds unsharded gradients: {a.grad_peak[ACCUMULATED]:,} B at most, "
        f"at least the full 4Ψ = {a.full_grads:,} B, against {a.grad_peak['zero3']:,} B when each backward "
        f"reduce-scatters (at most the largest unit's {a.largest_unit:,} B beside the {a.shard:,} B shard)",
    )
    c.require(
        a.accumulated.model_states_bytes() == a.one.model_states_bytes(),
        f"after the optimizer step the gradients are sharded again: the same model states "
        f"({a.accumulated.model_states_bytes()[0]:,} B on rank 0)",
    )
    return c.verdict()


def _over_full_grads(a: Accumulation) -> str:
    extra = a.grad_peak[ACCUMULATED] - a.full_grads
    if extra == 0:
        return "the full 4Ψ: every unit's unsharded gradient at once"
    return f"the full 4Ψ = {human_bytes(a.full_grads)} and {human_bytes(extra)} more"


def report_accumulation(a: Accumulation) -> Report:
    k, n = a.micro_batches, a.one.world_size
    finding = (
        f"Accumulating {k} micro-batches under FSDP at N={n} with gradient sync off until the last "
        f"(set_requires_gradient_sync(False), FSDP2's no_sync) issued {a.scatters[ACCUMULATED]} reduce-scatters "
        f"({human_bytes(a.scattered_bytes[ACCUMULATED])}) per optimizer step, as many as one micro-batch does, where "
        f"syncing every micro-batch would issue {k * a.scatters['zero3']} ({human_bytes(k * a.scattered_bytes['zero3'])}); "
        f"the all-gathers still ran for every micro-batch ({a.gathers[ACCUMULATED]} against {a.gathers['zero3']}). The "
        f"cost is memory: to accumulate into, every unit kept its unsharded gradient, so the gradients peaked at "
        f"{human_bytes(a.grad_peak[ACCUMULATED])} ({_over_full_grads(a)}) against "
        f"{human_bytes(a.grad_peak['zero3'])} when each backward reduce-scatters and frees them (one unit's "
        f"unsharded gradient at most, beside the shards). Syncing every "
        f"micro-batch instead keeps only 1/N gradient shards and pays {k}x the reduce-scatter traffic."
    )
    rows = tuple(
        (
            key,
            m.config.grad_accum_steps,
            a.gathers[key],
            a.scatters[key],
            a.scattered_bytes[key],
            a.grad_peak[key],
        )
        for key, m in (("zero3", a.one), (ACCUMULATED, a.accumulated))
    ) + (
        (
            "zero3, sync every micro-batch (derived)",
            k,
            k * a.gathers["zero3"],
            k * a.scatters["zero3"],
            k * a.scattered_bytes["zero3"],
            a.grad_peak["zero3"],
        ),
    )
    chart = stacked_bar_chart(
        f"Gradient memory at most and reduce-scatter bytes per optimizer step (rank 0, N={n})",
        [
            Bar("one micro-batch: gradients", {"grads": a.grad_peak["zero3"]}),
            Bar(f"{k} micro-batches, no sync: gradients", {"grads": a.grad_peak[ACCUMULATED]}),
            Bar(
                f"{k} micro-batches, no sync: reduce-scatters",
                {"reduce_scatter": a.scattered_bytes[ACCUMULATED]},
            ),
            Bar(
                f"{k} micro-batches, synced each (derived)",
                {"reduce_scatter": k * a.scattered_bytes["zero3"]},
            ),
        ],
        ["grads", "reduce_scatter"],
        colours={**charts.MEMORY_COLOURS, **charts.OP_COLOURS},
    )
    return Report(
        finding,
        Table(
            (
                "run",
                "micro-batches per step",
                "all-gathers per step",
                "reduce-scatters per step",
                "reduce-scatter bytes per step",
                "gradient bytes at most (rank 0)",
            ),
            rows,
        ),
        {"memory_and_traffic": chart},
    )


MEMORY_BEYOND_LABS: tuple[Lab, ...] = (
    catalog_lab(
        "activation-memory-per-rank",
        activation_runs,
        analyse_activation_memory,
        check_activation_memory,
        report_activation_memory,
    ),
    catalog_lab(
        "fsdp2-mixed-precision",
        runs_at(("zero3", Strategy.ZERO3, {}), (MIXED, Strategy.ZERO3, {"mixed_precision": True})),
        analyse_mixed_precision,
        check_mixed_precision,
        report_mixed_precision,
    ),
    catalog_lab(
        "activation-checkpointing",
        checkpointing_runs,
        analyse_checkpointing,
        check_checkpointing,
        report_checkpointing,
        reads_step_time=True,  # the recompute's cost in step time
    ),
    catalog_lab("cpu-offload-traffic", offload_runs, analyse_offload, check_offload, report_offload),
    catalog_lab(
        "grad-accumulation-no-sync",
        runs_at(
            ("zero3", Strategy.ZERO3, {}), (ACCUMULATED, Strategy.ZERO3, {"grad_accum_steps": ACCUM_STEPS})
        ),
        analyse_accumulation,
        check_accumulation,
        report_accumulation,
    ),
)
