"""Labs about what each rank holds between steps: model states per strategy, what each ZeRO stage
shards, Adam's share of them, and how per-rank memory scales with the number of ranks.

Model states are the engine's exact bytes of the local parameter, gradient and optimizer tensors;
"full" is what the unsharded model needs in fp32 Adam: 4Ψ, 4Ψ and 8Ψ bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sharding_lab.analytic import bytes_per_param, model_states_bytes_per_rank, zero1_partition
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
    percent,
    runs_across,
    runs_at,
    shares_text,
    world_size_key,
)
from sharding_lab.measurement import PARTS, Measurement
from sharding_lab.model_config import GPTConfig, config_for, parameter_shapes, size_label
from sharding_lab.run_config import Placement, RunConfig
from sharding_lab.strategies import Strategy
from sharding_lab.svg import Bar, stacked_bar_chart
from sharding_lab.units import human_bytes

# Where stage 1's whole-tensor split is shown at scale, derived from PyTorch's rule (not measured):
# gpt2-small's untied embedding and head are 38.6M elements each, more than Ψ/N from N = 5 on.
STAGE1_AT_SCALE = ("gpt2-small", (8, 16))
# And measured: `mini` (an embedding and a head of 25.5% of Ψ each) at 8 ranks, as a rank view (one
# process holding rank 0's real tensors), where rank 0 owns the embedding's Adam state alone.
STAGE1_MEASURED_KEY, STAGE1_MEASURED_SIZE, STAGE1_MEASURED_RANKS = "zero1, mini at N=8", "mini", 8


def stage1_runs(world_size: int) -> tuple[RunSpec, ...]:
    at_scale = RunConfig(
        Strategy.ZERO1, world_size=STAGE1_MEASURED_RANKS, size=STAGE1_MEASURED_SIZE,
        placement=Placement.RANK_VIEW, timed_steps=1,
    )
    return (
        *runs_at(("ddp", Strategy.DDP, {}), ("zero1", Strategy.ZERO1, {}))(world_size),
        RunSpec(STAGE1_MEASURED_KEY, at_scale, size_fixed=True),
    )


@dataclass(frozen=True)
class Stage1:
    states: ModelStates  # ddp and zero1 at the lab's N
    expected: list[int]  # zero1's optimizer bytes per rank by PyTorch's rule, from the shapes
    at_scale: Measurement  # zero1 on `mini` at 8 ranks: rank 0's view
    at_scale_expected: int  # rank 0's optimizer bytes there, by the same rule
    at_scale_share: float  # rank 0's optimizer bytes over its 1/N share, measured


def analyse_stage1(ms: Measurements) -> Stage1:
    states = analyse_model_states({key: ms[key] for key in ("ddp", "zero1")})
    at_scale = ms[STAGE1_MEASURED_KEY]
    full_optimizer = at_scale.full_bytes("optimizer")
    return Stage1(
        states,
        zero1_optimizer_bytes(ms["zero1"]),
        at_scale,
        zero1_optimizer_bytes(at_scale)[0],
        at_scale.part_bytes("optimizer")[0] * at_scale.world_size / full_optimizer,
    )


def zero1_optimizer_bytes(m: Measurement) -> list[int]:
    """What each rank's Adam state should be under PyTorch's ZeroRedundancyOptimizer, worked out from
    the model's parameter shapes (not from the run): 8 bytes per element of the tensors it owns."""
    numels = [math.prod(shape) for _, shape in parameter_shapes(GPTConfig(**m.config.model))]
    return [8 * owned for owned in zero1_partition(numels, m.world_size)]


def largest_tensor_share(size: str) -> float:
    numels = [math.prod(shape) for _, shape in parameter_shapes(config_for(size))]
    return max(numels) / sum(numels)


def fullest_share(size: str, world_size: int) -> float:
    """The fullest rank's optimizer state over its 1/N share under ZeroRedundancyOptimizer (derived)."""
    numels = [math.prod(shape) for _, shape in parameter_shapes(config_for(size))]
    return max(zero1_partition(numels, world_size)) * world_size / sum(numels)


@dataclass(frozen=True)
class PartHoldings:
    """One model-state part of one run: what each rank holds between steps."""

    bytes: list[int]  # per rank
    shares: list[float]  # per rank, of the whole model's part
    held_in_full: bool  # every rank holds the whole part (replicated)
    sharded: bool  # the ranks split it exactly, none above 1/N of the padded model


@dataclass(frozen=True)
class ModelStates:
    """Every run's model states between steps, part by part: what these labs check and report."""

    ms: Measurements
    parts: dict[str, dict[str, PartHoldings]]  # run key -> part -> holdings
    totals: dict[str, list[int]]  # run key -> model-state bytes per rank
    full: dict[str, int]  # part -> the whole model's bytes in fp32 Adam (4Ψ, 4Ψ, 8Ψ), and "total"
    world_size: int  # the largest measured

    def part(self, key: str, part: str) -> PartHoldings:
        return self.parts[key][part]


def analyse_model_states(ms: Measurements) -> ModelStates:
    parts = {
        key: {
            part: PartHoldings(m.part_bytes(part), m.shares(part), m.held_in_full(part), m.sharded(part))
            for part in PARTS
        }
        for key, m in ms.items()
    }
    first = next(iter(ms.values()))
    full = {part: first.full_bytes(part) for part in PARTS} | {"total": first.full_model_states_bytes()}
    totals = {key: m.model_states_bytes() for key, m in ms.items()}
    return ModelStates(ms, parts, totals, full, max(m.world_size for m in ms.values()))


def _model_states_rows(a: ModelStates, keys: list[str]) -> tuple[tuple[object, ...], ...]:
    rows = []
    for key in keys:
        for rank, total in enumerate(a.totals[key]):
            parts = [a.part(key, part).bytes[rank] for part in PARTS]
            rows.append((key, rank, *parts, total, round(total / a.full["total"], 4)))
    return tuple(rows)


MODEL_STATES_COLUMNS = (
    "run",
    "rank",
    "params bytes",
    "grads bytes",
    "optimizer bytes",
    "model states bytes",
    "share of full",
)


# --- what-fsdp-shards --------------------------------------------------------------------------------


def check_what_fsdp_shards(a: ModelStates) -> Verdict:
    n = a.world_size
    c = Conditions()
    for part in PARTS:
        ddp = a.part("ddp", part)
        c.require(ddp.held_in_full, f"DDP: every rank holds the full {part} ({shares_text(ddp.shares)})")
    for part in PARTS:
        fsdp = a.part("zero3", part)
        c.require(fsdp.sharded, f"FSDP: every rank holds about 1/{n} of the {part} ({shares_text(fsdp.shares)})")
    return c.verdict()


def report_what_fsdp_shards(a: ModelStates) -> Report:
    n = a.world_size
    held = ", ".join(f"{part} {human_bytes(a.part('ddp', part).bytes[0])}" for part in PARTS)
    sharded = ", ".join(
        f"{part} {human_bytes(a.part('zero3', part).bytes[0])} ({percent(a.part('zero3', part).shares[0])})"
        for part in PARTS
    )
    peaks = {key: a.ms[key].ranks[0].peak_bytes for key in ("ddp", "zero3")}
    finding = (
        f"At N={n}, each DDP rank holds the full model states ({held}); each FSDP rank holds "
        f"{sharded}: 1/{n} of every part, {human_bytes(a.totals['zero3'][0])} "
        f"instead of {human_bytes(a.totals['ddp'][0])}. The step's peak falls less: "
        f"{human_bytes(peaks['zero3'])} against {human_bytes(peaks['ddp'])} ({peaks['zero3'] / peaks['ddp']:.2f} of "
        f"it), since activations and the blocks gathered for compute are not sharded."
    )
    keys = ["ddp", "zero3"]
    return Report(
        finding,
        Table(MODEL_STATES_COLUMNS, _model_states_rows(a, keys)),
        {
            "model_states": charts.model_states_chart(f"Model states per rank (rank 0, N={n})", a.ms, keys),
            "memory_by_category": charts.memory_categories_chart(
                f"Memory at peak by category (rank 0, N={n})", a.ms, keys
            ),
        },
    )


# --- persistent-memory-scaling -----------------------------------------------------------------------


def scaling_world_sizes(world_size: int) -> tuple[int, ...]:
    """1, N and 2N ranks: 1, 2, 4 for the default N = 2."""
    return tuple(sorted({1, world_size, 2 * world_size}))


scaling_key = world_size_key  # the scaling lab's runs: "ddp, N=4"


def scaling_runs(world_size: int) -> tuple[RunSpec, ...]:
    return runs_across((Strategy.DDP, Strategy.ZERO3), scaling_world_sizes(world_size))


@dataclass(frozen=True)
class StepMemory:
    """One run's fullest rank over the measured step (tracker figures)."""

    world_size: int
    model_states: int  # between steps, exact tensors
    persistent: int  # after optimizer.step()
    peak: int
    activations: int  # the most activation bytes alive at once


@dataclass(frozen=True)
class Scaling:
    ms: Measurements
    points: dict[str, list[StepMemory]]  # strategy -> one per world size, ascending
    full: int  # the whole model's model-state bytes
    padded: bool  # FSDP padded some dim at some world size


def analyse_scaling(ms: Measurements) -> Scaling:
    points: dict[str, list[StepMemory]] = {"ddp": [], "zero3": []}
    for key, m in ms.items():
        for strategy in points:
            if key.startswith(f"{strategy}, N="):
                points[strategy].append(
                    StepMemory(
                        m.world_size,
                        max(m.model_states_bytes()),
                        max(r.persistent_bytes for r in m.ranks),
                        max(r.peak_bytes for r in m.ranks),
                        max(r.category_peaks.get("activations", 0) for r in m.ranks),
                    )
                )
    padded = any(m.padded_num_params > m.num_params for m in ms.values())
    full = next(iter(ms.values())).full_model_states_bytes()
    return Scaling(ms, {k: sorted(v, key=lambda p: p.world_size) for k, v in points.items()}, full, padded)


def check_persistent_memory_scaling(a: Scaling) -> Verdict:
    c = Conditions()
    ddp, fsdp = a.points["ddp"], a.points["zero3"]
    c.require(
        len(ddp) >= 3 and len(fsdp) >= 3, f"measured at three or more world sizes ({[p.world_size for p in fsdp]})"
    )
    for p in ddp:
        c.require(
            p.model_states == a.full,
            f"DDP at N={p.world_size}: {human_bytes(p.model_states)} per rank, the full {human_bytes(a.full)}",
        )
    for p in fsdp:
        m = a.ms[scaling_key("zero3", p.world_size)]
        c.require(
            all(m.sharded(part) for part in PARTS),
            f"FSDP at N={p.world_size}: {human_bytes(p.model_states)} on the fullest rank, "
            f"{p.model_states / a.full:.3f} of the full copy (1/{p.world_size} = {1 / p.world_size:.3f}, at most "
            f"{m.padded_num_params / m.num_params / p.world_size:.3f} with FSDP's padding)",
        )
    # What does not shrink: each rank's activations (its own micro-batch), so the peak falls slower than 1/N.
    activations = {p.activations for p in fsdp}
    c.require(
        len(activations) == 1 and min(activations) > 0,
        f"FSDP: each rank's activations stay the same as N grows ({' / '.join(human_bytes(p.activations) for p in fsdp)})",
    )
    first, last = fsdp[0], fsdp[-1]
    c.require(
        last.peak * last.world_size > first.peak * first.world_size,
        f"FSDP: the peak falls slower than 1/N ({human_bytes(first.peak)} at N={first.world_size}, "
        f"{human_bytes(last.peak)} at N={last.world_size}: {last.peak / first.peak:.2f} of it, not "
        f"{first.world_size / last.world_size:.2f})",
    )
    return c.verdict()


def report_persistent_memory_scaling(a: Scaling) -> Report:
    ddp, fsdp = a.points["ddp"], a.points["zero3"]
    ddp_text = ", ".join(f"{human_bytes(p.model_states)} at N={p.world_size}" for p in ddp)
    fsdp_text = ", ".join(f"{human_bytes(p.model_states)} at N={p.world_size}" for p in fsdp)
    fractions = ", ".join(f"{p.model_states / a.full:.3f}" for p in fsdp)
    peaks = ", ".join(f"{human_bytes(p.peak)}" for p in fsdp)
    finding = (
        f"Persistent model states per rank: DDP {ddp_text} (flat); FSDP {fsdp_text} on the fullest rank, "
        f"i.e. {fractions} of the full copy (1/N"
        + (", plus FSDP's padding of dims that N does not divide)." if a.padded else ").")
        + f" The step's peak does not follow: FSDP's is {peaks} at N = "
        f"{', '.join(str(p.world_size) for p in fsdp)} ({fsdp[-1].peak / fsdp[0].peak:.2f} of N={fsdp[0].world_size}'s "
        f"at N={fsdp[-1].world_size}), because each rank's activations, {human_bytes(fsdp[-1].activations)} for its own "
        f"micro-batch of this model in fp32, do not shrink with N (measured by the tracker; activation "
        f"checkpointing or a smaller micro-batch is what cuts them)."
    )
    rows = [
        (strategy, p.world_size, p.model_states, round(p.model_states / a.full, 4), p.persistent, p.peak, p.activations)
        for strategy, points in a.points.items()
        for p in points
    ]
    keys = [scaling_key(strategy, p.world_size) for strategy, points in a.points.items() for p in points]
    return Report(
        finding,
        Table(
            (
                "strategy",
                "world size",
                "model states bytes per rank",
                "share of full",
                "persistent bytes (tracker)",
                "peak bytes (tracker)",
                "activation bytes at most (tracker)",
            ),
            tuple(rows),
        ),
        {
            "model_states": charts.model_states_chart(
                "Persistent model states per rank as ranks are added", a.ms, keys
            ),
            "memory_by_category": charts.memory_categories_chart(
                "Memory at the peak by category as ranks are added (rank 0)", a.ms, keys
            ),
        },
    )


# --- zero-stages-model-states --------------------------------------------------------------------------


def check_zero_stages(a: ModelStates) -> Verdict:
    n = a.world_size
    zero2, zero3 = a.ms["zero2"], a.ms["zero3"]
    full_params = a.full["params"]
    zero1_optimizer = a.part("zero1", "optimizer")
    c = Conditions()
    c.require(
        all(a.part("ddp", part).held_in_full for part in PARTS),
        "ddp: parameters, gradients and optimizer state full",
    )
    c.require(
        zero1_optimizer.bytes == zero1_optimizer_bytes(a.ms["zero1"]),
        f"zero1: optimizer state split across ranks by whole tensors ({shares_text(zero1_optimizer.shares)})",
    )
    c.require(
        a.part("zero1", "params").held_in_full and a.part("zero1", "grads").held_in_full,
        "zero1: parameters and gradients full",
    )
    c.require(
        a.part("zero2", "grads").sharded and a.part("zero2", "optimizer").sharded,
        f"zero2: gradients and optimizer state about 1/{n} "
        f"({shares_text(a.part('zero2', 'grads').shares)}; {shares_text(a.part('zero2', 'optimizer').shares)})",
    )
    c.require(
        all(b >= full_params for b in zero2.unsharded_after_forward()),
        f"zero2: full parameters kept from forward to backward "
        f"({shares_text([b / full_params for b in zero2.unsharded_after_forward()])})",
    )
    c.require(
        all(a.part("zero3", part).sharded for part in PARTS),
        f"zero3: parameters, gradients and optimizer state about 1/{n}",
    )
    totals = [max(a.totals[key]) for key in ("ddp", "zero1", "zero2", "zero3")]
    c.require(
        totals[0] > totals[1] > totals[2] >= totals[3],
        f"model states between steps fall stage by stage ({' > '.join(human_bytes(t) for t in totals[:3])} >= "
        f"{human_bytes(totals[3])}: FSDP2's zero2 reshards after backward, so between steps it holds what zero3 "
        f"holds)",
    )
    c.require(
        all(b < full_params for b in zero3.unsharded_after_forward()),
        f"zero3: block parameters freed after forward "
        f"({shares_text([b / full_params for b in zero3.unsharded_after_forward()])} kept gathered)",
    )
    return c.verdict()


def report_zero_stages(a: ModelStates) -> Report:
    keys = ["ddp", "zero1", "zero2", "zero3"]
    n = a.world_size
    full_params = a.full["params"]
    paper = {key: model_states_bytes_per_rank(a.ms[key].num_params, n, key)["total"] for key in keys}

    def shares(key: str) -> str:
        return "/".join(percent(a.part(key, part).shares[0]) for part in PARTS)

    after_forward = {key: a.ms[key].unsharded_after_forward()[0] for key in keys}
    finding = (
        f"Share of the full parameters/gradients/optimizer state on rank 0 at N={n}: "
        + "; ".join(f"{key} {shares(key)}" for key in keys)
        + f"; model states between steps {', '.join(human_bytes(a.totals[k][0]) for k in keys)}, the step's peak "
        f"{', '.join(human_bytes(a.ms[k].ranks[0].peak_bytes) for k in keys)}. "
        f"zero2 (FSDP2, reshard-after-forward off) keeps "
        f"{percent(after_forward['zero2'] / full_params)} of the parameters unsharded from forward "
        f"to backward, where stage 2 keeps them replicated, and reshards them after backward (the paper's stage 2, "
        f"counted in fp32 as this run is (4/4/8 B per parameter), would hold {human_bytes(paper['zero2'])} between "
        f"steps); zero3 keeps only the root unit "
        f"({percent(after_forward['zero3'] / full_params)})."
    )
    rows = tuple(
        (
            key,
            *(a.part(key, part).bytes[0] for part in PARTS),
            a.totals[key][0],
            paper[key],
            after_forward[key],
        )
        for key in keys
    )
    return Report(
        finding,
        Table(
            (
                "strategy",
                "params bytes",
                "grads bytes",
                "optimizer bytes",
                "model states bytes",
                "paper's model states bytes (fp32, derived)",
                "unsharded params after forward",
            ),
            rows,
        ),
        {
            "model_states": charts.model_states_chart(
                f"Model states per rank by ZeRO stage (rank 0, N={n})", a.ms, keys
            )
        },
    )


# --- adam-optimizer-state --------------------------------------------------------------------------------


MIXED = "zero3 mixed precision"  # FSDP2 with MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)


@dataclass(frozen=True)
class AdamState:
    """Bytes per parameter each model state costs on a rank, measured: fp32 Adam under DDP, and
    PyTorch's mixed precision (FSDP2, bf16 compute) on the same model."""

    psi: int
    fp32: dict[str, float]  # part -> bytes per parameter, DDP fp32 (every rank holds all of Ψ)
    mixed: dict[str, float]  # part -> bytes per parameter of rank 0's shard, FSDP2 mixed precision
    ratios: list[float]  # per DDP rank: optimizer bytes / parameter bytes
    gather_dtypes: set[str]  # what the mixed-precision run's all-gathers moved
    reduce_dtypes: set[str]  # what its reduce-scatters moved
    fp32_bytes: dict[str, int]  # part -> DDP rank 0's bytes


def analyse_adam_state(ms: Measurements) -> AdamState:
    ddp, mixed = ms["ddp"], ms[MIXED]
    psi = ddp.num_params
    shard = mixed.padded_num_params // mixed.world_size  # rank 0 holds a full padded shard
    return AdamState(
        psi=psi,
        fp32={part: ddp.part_bytes(part)[0] / psi for part in PARTS},
        mixed={part: mixed.part_bytes(part)[0] / shard for part in PARTS},
        ratios=[o / p for o, p in zip(ddp.part_bytes("optimizer"), ddp.part_bytes("params"), strict=True)],
        gather_dtypes={c.dtype or "?" for c in mixed.collectives(op="all_gather")},
        reduce_dtypes={c.dtype or "?" for c in mixed.collectives(op="reduce_scatter")},
        fp32_bytes={part: ddp.part_bytes(part)[0] for part in PARTS},
    )


def check_adam_state(a: AdamState) -> Verdict:
    c = Conditions()
    c.require(
        all(abs(r - 2) < 1e-9 for r in a.ratios),
        f"fp32: Adam's state = 2x the parameter bytes on every rank ({a.ratios})",
    )
    c.require(
        a.fp32["optimizer"] > max(a.fp32["params"], a.fp32["grads"]),
        "fp32: optimizer state is the biggest model state",
    )
    c.require(
        a.gather_dtypes == {"bfloat16"} and a.reduce_dtypes == {"float32"},
        f"the mixed-precision run computed in bf16 (all-gathers {sorted(a.gather_dtypes)}, "
        f"reduce-scatters {sorted(a.reduce_dtypes)})",
    )
    layout = "/".join(f"{a.mixed[part]:g}" for part in PARTS)
    c.require(
        a.mixed == {"params": 4.0, "grads": 4.0, "optimizer": 8.0},
        f"PyTorch's mixed precision keeps fp32 shards, fp32 gradients and 8-byte Adam state ({layout} bytes "
        "per parameter, not the paper's 2/2/12)",
    )
    return c.verdict()


def report_adam_state(a: AdamState) -> Report:
    paper = bytes_per_param(mixed_precision=True)
    params, optimizer = a.fp32_bytes["params"], a.fp32_bytes["optimizer"]
    pytorch = "/".join(f"{a.mixed[part]:g}" for part in PARTS)
    finding = (
        f"Under DDP in fp32 each rank's Adam state is {optimizer / params:.2f}x its parameter bytes "
        f"({human_bytes(optimizer)} against {human_bytes(params)} for Ψ={a.psi:,}: {a.fp32['optimizer']:g} B per "
        f"parameter for exp_avg and exp_avg_sq), the biggest model state. With PyTorch's mixed precision (FSDP2, "
        f"bf16 all-gathers and compute, fp32 reduce-scatters as configured here; measured on this model) a rank keeps {pytorch} bytes "
        f"per parameter of parameters/gradients/Adam state: fp32 shards serve as the master weights, so Adam's "
        f"state stays 8 B. The ZeRO paper's mixed precision keeps {paper['params']}/{paper['grads']}/"
        f"{paper['optimizer']} (fp16 parameters and gradients; K = {paper['optimizer']}: an fp32 master copy "
        f"beside the two moments); both total 16 bytes per parameter. DeepSpeed's own estimators count 18 per "
        f"sharded parameter: they add a 4-byte fp32 gradient partition."
    )
    rows = tuple(
        (part, a.fp32_bytes[part], round(a.fp32[part], 4), round(a.mixed[part], 4), paper[part]) for part in PARTS
    )
    chart = stacked_bar_chart(
        "Bytes per parameter by model state",
        [
            Bar("fp32 Adam (measured, DDP)", a.fp32),
            Bar("mixed precision (measured, PyTorch FSDP2)", a.mixed),
            Bar("mixed precision (ZeRO paper)", dict(paper)),
        ],
        PARTS,
        colours=charts.MEMORY_COLOURS,
        format_value=lambda v: f"{v:g} B/param",
    )
    return Report(
        finding,
        Table(
            (
                "part",
                "bytes per rank (DDP, fp32)",
                "bytes per parameter (measured fp32)",
                "bytes per parameter (measured, PyTorch mixed precision)",
                "bytes per parameter (ZeRO paper, mixed precision)",
            ),
            rows,
        ),
        {"bytes_per_param": chart},
    )


# --- stage1-optimizer-only ---------------------------------------------------------------------------------


def check_stage1(a: Stage1) -> Verdict:
    optimizer = a.states.part("zero1", "optimizer")
    c = Conditions()
    c.require(
        optimizer.bytes == a.expected,
        f"zero1: each rank holds Adam's state for whole tensors, as PyTorch's greedy rule assigns them "
        f"({' / '.join(f'{b:,}' for b in optimizer.bytes)} B; worked out from the shapes: "
        f"{' / '.join(f'{b:,}' for b in a.expected)} B)",
    )
    c.require(
        sum(optimizer.bytes) == a.states.full["optimizer"],
        "zero1: the ranks' optimizer shards add up to one copy",
    )
    for part in ("params", "grads"):
        held = a.states.part("zero1", part)
        c.require(held.held_in_full, f"zero1: {part} full on every rank ({shares_text(held.shares)})")
    measured = a.at_scale.part_bytes("optimizer")[0]
    c.require(
        measured == a.at_scale_expected and a.at_scale_share > 1,
        f"zero1 on {a.at_scale.config.size} at N={a.at_scale.world_size} (rank 0's view): {measured:,} B of Adam "
        f"state, {a.at_scale_share:.2f}x its 1/{a.at_scale.world_size} share, as the rule gives "
        f"({a.at_scale_expected:,} B): one whole tensor outweighs Ψ/N",
    )
    return c.verdict()


def report_stage1(a: Stage1) -> Report:
    n = a.states.world_size
    optimizer = a.states.part("zero1", "optimizer")
    fullest = max(optimizer.shares) * n
    size, world_sizes = STAGE1_AT_SCALE
    at_scale = ", ".join(f"{fullest_share(size, w):.2f}x at N={w}" for w in world_sizes)
    measured = a.at_scale
    finding = (
        f"At N={n}, PyTorch's ZeRO-1 (ZeroRedundancyOptimizer) leaves the ranks "
        f"{shares_text(optimizer.shares)} of Adam's state "
        f"({' / '.join(human_bytes(b) for b in optimizer.bytes)}; the fullest rank {fullest:.2f}x its 1/{n} share) "
        f"while parameters and gradients stay full "
        f"({shares_text(a.states.part('zero1', 'params').shares)} and "
        f"{shares_text(a.states.part('zero1', 'grads').shares)}); DDP holds "
        f"{human_bytes(a.states.part('ddp', 'optimizer').bytes[0])} of optimizer state on every rank. "
        f"It assigns whole tensors, largest first, each to the emptiest rank, so the split is 1/N only while every "
        f"tensor is small beside Ψ/N. On the {measured.config.size} model, whose embedding and head are "
        f"{percent(largest_tensor_share(measured.config.size))} of Ψ each, rank 0 of {measured.world_size} measured "
        f"{human_bytes(measured.part_bytes('optimizer')[0])} of Adam state, {a.at_scale_share:.2f}x its share "
        f"(a rank view: rank 0's real tensors in one process); for {size_label(size)}: {percent(largest_tensor_share(size))} "
        f"each, the fullest rank would hold {at_scale} (derived from the same rule). DeepSpeed's ZeRO-1 splits one "
        f"flat buffer, exactly 1/N per rank."
    )
    keys = ["ddp", "zero1"]
    rows = (
        *_model_states_rows(a.states, keys),
        (STAGE1_MEASURED_KEY, 0, *(measured.part_bytes(part)[0] for part in PARTS), measured.model_states_bytes()[0],
         round(measured.model_states_bytes()[0] / measured.full_model_states_bytes(), 4)),
    )
    return Report(
        finding,
        Table(MODEL_STATES_COLUMNS, rows),
        {
            "model_states": charts.model_states_chart(
                f"Model states on each rank, DDP vs ZeRO-1 (N={n})", a.states.ms, keys, every_rank=True
            )
        },
    )


MODEL_STATE_LABS: tuple[Lab, ...] = (
    catalog_lab(
        "what-fsdp-shards",
        runs_at(("ddp", Strategy.DDP, {}), ("zero3", Strategy.ZERO3, {})),
        analyse_model_states,
        check_what_fsdp_shards,
        report_what_fsdp_shards,
    ),
    catalog_lab(
        "persistent-memory-scaling",
        scaling_runs,
        analyse_scaling,
        check_persistent_memory_scaling,
        report_persistent_memory_scaling,
    ),
    catalog_lab(
        "zero-stages-model-states",
        runs_at(("ddp", Strategy.DDP, {}), ("zero1", Strategy.ZERO1, {}), ("zero2", Strategy.ZERO2, {}), ("zero3", Strategy.ZERO3, {})),
        analyse_model_states,
        check_zero_stages,
        report_zero_stages,
    ),
    catalog_lab(
        "adam-optimizer-state",
        runs_at(("ddp", Strategy.DDP, {}), (MIXED, Strategy.ZERO3, {"mixed_precision": True})),
        analyse_adam_state,
        check_adam_state,
        report_adam_state,
    ),
    catalog_lab(
        "stage1-optimizer-only",
        stage1_runs,
        analyse_stage1,
        check_stage1,
        report_stage1,
    ),
)
