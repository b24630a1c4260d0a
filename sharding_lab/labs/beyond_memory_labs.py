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
    # At N=1 FSDP skips its collectives' copy-in and copy-out, so temporaries are a little lower there.
    temporaries = [p.temporaries for p in points]
    c.require(
        min(temporaries) > 0 and all(v >= temporaries[0] * (1 - SAME_TOLERANCE) for v in temporaries),
        f"each rank's temporaries do not shrink as N grows ({' / '.join(f'{v:,}' for v in temporaries)} B)",
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
        f"N={last.world_size} (the tracker's figures on CPU). Activation checkpointing, a smaller micro-batch or "
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
    rows = (
        ("parameter shard (master weights)", "fp32", a.per_param["params"], PAPER_MIXED_BYTES["params"]),
        ("gradient shard", "fp32", a.per_param["grads"], PAPER_MIXED_BYTES["grads"]),
        ("Adam state", "fp32", a.per_param["optimizer"], PAPER_MIXED_BYTES["optimizer"]),
        ("gathered parameters for compute (transient)", "/".join(sorted(a.gather_dtypes)), 2, 2),
        ("reduce-scatter (on the wire)", "/".join(sorted(a.reduce_dtypes)), 4, 2),
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
                "dtype (measured)",
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
)
