"""Labs about parameters gathered during the step: how many blocks are unsharded at once with and
without reshard-after-forward, what stage 3 shards that stage 2 keeps whole, and FSDP's model states
against the ZeRO stage-3 formula.

"Unsharded" bytes come from the engine's memory tracker (FSDP's unsharded-parameter category); block
and root sizes from the forward all-gathers, one per FSDP unit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sharding_lab.analytic import fsdp_padded_numel, fsdp_rank_numel, model_states_bytes_per_rank
from sharding_lab.labs import charts
from sharding_lab.labs.base import (
    Conditions,
    Lab,
    Measurements,
    Report,
    Table,
    Verdict,
    catalog_lab,
    percent,
    runs_at,
    shares_text,
)
from sharding_lab.labs.beyond_partition_labs import DEEPSPEED_PERSISTENCE_THRESHOLD, persistent_share
from sharding_lab.measurement import PARTS, Measurement
from sharding_lab.model_config import GPTConfig, parameter_shapes
from sharding_lab.strategies import Strategy
from sharding_lab.svg import Bar, stacked_bar_chart
from sharding_lab.units import human_bytes

# --- reshard-after-forward ------------------------------------------------------------------------------------


RESHARD_ON, RESHARD_ON_PREFETCH, RESHARD_OFF = "reshard on", "reshard on + prefetch", "reshard off"


@dataclass(frozen=True)
class GatheredParams:
    """What each run held of the parameters, per rank: gathered at the peak and after forward, in
    all-gather buffers at their peak, and the shard between steps."""

    unsharded_peak: list[int]
    all_gather_buffer_peak: list[int]
    after_forward: list[int]
    shard: list[int]
    sharded: bool  # between steps the ranks split the parameters, nothing replicated
    shares: list[float]

    @classmethod
    def of(cls, m: Measurement) -> GatheredParams:
        return cls(
            m.unsharded_peak(),
            m.all_gather_buffer_peak(),
            m.unsharded_after_forward(),
            m.part_bytes("params"),
            m.sharded("params"),
            m.shares("params"),
        )


@dataclass(frozen=True)
class Resharding:
    runs: dict[str, GatheredParams]  # by run key
    root: int  # the root unit's full parameter bytes (from the forward all-gathers)
    block: int  # the largest block's
    full: int  # the whole model's fp32 parameter bytes
    world_size: int
    n_blocks: int


def analyse_reshard_after_forward(ms: Measurements) -> Resharding:
    on = ms[RESHARD_ON]
    runs = {key: GatheredParams.of(ms[key]) for key in (RESHARD_ON, RESHARD_ON_PREFETCH, RESHARD_OFF)}
    return Resharding(runs, *on.root_and_block_bytes(), on.full_bytes("params"), on.world_size, on.n_blocks)


def check_reshard_after_forward(a: Resharding) -> Verdict:
    root, block = a.root, a.block
    on, off = a.runs[RESHARD_ON], a.runs[RESHARD_OFF]
    c = Conditions()
    c.require(block > 0, f"each block is gathered as one unit ({human_bytes(block)})")
    for key in (RESHARD_ON, RESHARD_ON_PREFETCH):
        peak = a.runs[key].unsharded_peak
        c.require(
            all(b <= root + block for b in peak),
            f"{key}: at most one block's full parameters unsharded at a time beside the root "
            f"(peak {_blocks_text(peak, root, block)} blocks)",
        )
    # FSDP frees a unit's all-gather output only when the next unit's is waited on, so at most two
    # consecutive units' outputs are alive at once: the root's and the first block's, or two blocks'.
    # (The root's can outweigh many blocks: on `mini` its vocabulary makes it 10.6 blocks.)
    two_units = max(root + block, 2 * block)
    for key in (RESHARD_ON, RESHARD_ON_PREFETCH):
        # Read on the rank that held least: every rank runs the same program, and gloo's thread can drop
        # the last reference to a finished all-gather's output late, adding it to one rank's figure.
        buffers = a.runs[key].all_gather_buffer_peak
        c.require(
            min(buffers) <= two_units,
            f"{key}: all-gather buffers hold at most two consecutive units' outputs, {two_units:,} B (the "
            f"root's and a block's, or two blocks'; peak {' / '.join(f'{b:,}' for b in buffers)} B by rank, "
            f"the least read)",
        )
    c.require(
        all(b <= root for b in on.after_forward),
        f"{RESHARD_ON}: no block unsharded when forward ends ({_blocks_text(on.after_forward, root, block)})",
    )
    c.require(
        all(b >= a.full for b in off.after_forward),
        f"{RESHARD_OFF}: every block still unsharded when forward ends "
        f"({_blocks_text(off.after_forward, root, block)} blocks)",
    )
    for key in (RESHARD_ON, RESHARD_OFF):
        c.require(
            a.runs[key].sharded,
            f"{key}: between steps only the 1/{a.world_size} shard ({shares_text(a.runs[key].shares)})",
        )
    return c.verdict()


def _blocks_text(gathered: list[int], root: int, block: int) -> str:
    return " / ".join(f"{(b - root) / block:.2f}" if block else "?" for b in gathered)


def report_reshard_after_forward(a: Resharding) -> Report:
    on, prefetch, off = a.runs[RESHARD_ON], a.runs[RESHARD_ON_PREFETCH], a.runs[RESHARD_OFF]
    root, block = a.root, a.block

    def blocks(values: list[int], base: int = root) -> str:
        return f"{(values[0] - base) / block:.0f}" if block else "?"

    buffers = on.all_gather_buffer_peak[0]
    which = {root + block: "the root's and the first block's", 2 * block: "two blocks'"}.get(buffers)
    two_units = f", here {which}" if which and buffers == prefetch.all_gather_buffer_peak[0] else ""
    finding = (
        f"With reshard-after-forward, at most {blocks(on.unsharded_peak)} block's full parameters "
        f"({human_bytes(block)}) were unsharded at a time beside the root unit ({human_bytes(root)}), with or "
        f"without prefetching. Gathered bytes also pass through all-gather buffers, which peaked at "
        f"{human_bytes(on.all_gather_buffer_peak[0])} and {human_bytes(prefetch.all_gather_buffer_peak[0])} "
        f"without and with prefetching: two consecutive units' outputs at most{two_units} "
        f"(in forward FSDP frees a unit's all-gather output only when the next unit's is waited on, so a copy-out "
        f"can overlap the next all-gather; a prefetched block's bytes wait there until it starts). Without "
        f"reshard-after-forward, "
        f"{blocks(off.after_forward)} of {a.n_blocks} blocks stay unsharded until backward "
        f"({human_bytes(off.after_forward[0])} when forward ends, against "
        f"{human_bytes(on.after_forward[0])}). Between steps each rank keeps only its "
        f"{human_bytes(on.shard[0])} shard. (PyTorch's FSDP2 here; torchtitan also leaves the last block "
        f"unresharded, since backward needs it first, and DeepSpeed's ZeRO-3 keeps a parameter gathered when it "
        f"is used again within max_reuse_distance, skipping that re-gather.)"
    )
    rows = tuple(
        (
            key,
            run.unsharded_peak[0],
            round((run.unsharded_peak[0] - root) / block, 2) if block else None,
            run.all_gather_buffer_peak[0],
            run.after_forward[0],
            run.shard[0],
        )
        for key, run in a.runs.items()
    )
    bars = [
        Bar(
            key,
            {
                "shard": run.shard[0],
                "unsharded (peak)": run.unsharded_peak[0],
                "all-gather buffers (peak)": run.all_gather_buffer_peak[0],
            },
        )
        for key, run in a.runs.items()
    ]
    chart = stacked_bar_chart(
        "Parameter bytes on rank 0: shard, peak unsharded, peak all-gather buffers",
        bars,
        ("shard", "unsharded (peak)", "all-gather buffers (peak)"),
        colours={"shard": "#0072B2", "unsharded (peak)": "#56B4E9", "all-gather buffers (peak)": "#999999"},
    )
    return Report(
        finding,
        Table(
            (
                "run",
                "peak unsharded params bytes",
                "peak unsharded blocks (beside root)",
                "peak all-gather buffer bytes",
                "unsharded after forward bytes",
                "param shard bytes",
            ),
            rows,
        ),
        {"gathered_params": chart},
    )


# --- stage3-shards-params ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StageParams:
    runs: dict[str, GatheredParams]  # zero2 and zero3
    root: int
    block: int
    full: int
    world_size: int


def analyse_stage3_params(ms: Measurements) -> StageParams:
    zero3 = ms["zero3"]
    runs = {key: GatheredParams.of(ms[key]) for key in ("zero2", "zero3")}
    return StageParams(runs, *zero3.root_and_block_bytes(), zero3.full_bytes("params"), zero3.world_size)


def check_stage3_params(a: StageParams) -> Verdict:
    zero2, zero3 = a.runs["zero2"], a.runs["zero3"]
    c = Conditions()
    c.require(
        all(b >= a.full for b in zero2.after_forward),
        f"zero2: full parameters on every rank from forward to backward "
        f"({shares_text([b / a.full for b in zero2.after_forward])})",
    )
    c.require(zero3.sharded, f"zero3: a 1/{a.world_size} parameter shard ({shares_text(zero3.shares)})")
    c.require(
        all(b <= a.root for b in zero3.after_forward),
        f"zero3: no block's parameters stay gathered after forward "
        f"({' / '.join(human_bytes(b) for b in zero3.after_forward)}, root unit {human_bytes(a.root)})",
    )
    c.require(
        all(b <= a.root + a.block for b in zero3.unsharded_peak),
        f"zero3: at most one block gathered at a time beside the root "
        f"(peak {' / '.join(human_bytes(b) for b in zero3.unsharded_peak)}, block {human_bytes(a.block)})",
    )
    return c.verdict()


def report_stage3_params(a: StageParams) -> Report:
    zero2, zero3 = a.runs["zero2"], a.runs["zero3"]
    n, full, root = a.world_size, a.full, a.root
    finding = (
        f"From forward to backward each zero2 rank holds the full parameters "
        f"({human_bytes(zero2.after_forward[0])}, {percent(zero2.after_forward[0] / full)}) beside "
        f"its shard; each zero3 rank holds its 1/{n} shard ({human_bytes(zero3.shard[0])}, "
        f"{percent(zero3.shares[0])}) and only the root unit gathered "
        f"({human_bytes(root)}, {percent(root / full)}: embeddings and head, which backward needs first). "
        f"Between steps FSDP2 reshards zero2 too, unlike DeepSpeed's ZeRO-2."
    )
    rows = tuple(
        (key, run.shard[0], run.after_forward[0], run.shard[0] + run.after_forward[0], full)
        for key, run in a.runs.items()
    )
    bars = [Bar(key, {"shard": run.shard[0], "gathered": run.after_forward[0]}) for key, run in a.runs.items()]
    chart = stacked_bar_chart(
        f"Parameter bytes on rank 0 between forward and backward (N={n})",
        bars,
        ("shard", "gathered"),
        colours={"shard": "#0072B2", "gathered": "#56B4E9"},
    )
    return Report(
        finding,
        Table(
            (
                "strategy",
                "param shard bytes",
                "gathered after forward",
                "params held in step",
                "full params bytes",
            ),
            rows,
        ),
        {"params_in_step": chart},
    )


# --- fsdp-is-zero3 ---------------------------------------------------------------------------------------------


def predicted_model_states(m: Measurement, stage: Strategy) -> dict[str, int]:
    """The ZeRO paper's per-rank model states for `stage`, worked out from the model's definition (its
    parameter shapes, FSDP's dim-0 padding applied), not from the counts the run reported."""
    shapes = [shape for _, shape in parameter_shapes(GPTConfig(**m.config.model))]
    psi = sum(math.prod(shape) for shape in shapes)
    padded = fsdp_padded_numel(shapes, m.world_size)
    return model_states_bytes_per_rank(psi, m.world_size, stage, padded_num_params=padded)


def params_bytes_per_rank(m: Measurement) -> list[int]:
    """Each rank's fp32 parameter bytes, padding left out, from the model's shapes: its torch.chunk rows
    of every tensor's dim 0, as FSDP2 splits them."""
    shapes = [shape for _, shape in parameter_shapes(GPTConfig(**m.config.model))]
    return [4 * sum(fsdp_rank_numel(shape, m.world_size, rank) for shape in shapes) for rank in range(m.world_size)]


@dataclass(frozen=True)
class AgainstStages:
    zero3: Measurement
    zero2: Measurement
    stage3: dict[str, int]  # the paper's per-rank model states, with FSDP's padding
    stage2: dict[str, int]
    params_per_rank: list[int]  # each rank's unpadded parameter bytes, from the shapes' dim-0 split
    short: int  # the most bytes a rank's shard is short of the padded shard
    units: int  # FSDP units: every block and the root
    forward_gathers: dict[str, int]  # unit -> all-gathers in forward
    backward_scatters: dict[str, int]  # unit -> reduce-scatters in backward
    root: int  # the root unit's full parameter bytes


def analyse_fsdp_is_zero3(ms: Measurements) -> AgainstStages:
    zero3, zero2 = ms["zero3"], ms["zero2"]
    short = max(zero3.full_model_states_bytes() // zero3.num_params * r.padding_elements for r in zero3.ranks)

    def per_unit(op: str, phase: str) -> dict[str, int]:
        counts: dict[str, int] = {}
        for c in zero3.collectives(op=op, phase=phase):
            counts[c.module or ""] = counts.get(c.module or "", 0) + 1
        return counts

    return AgainstStages(
        zero3,
        zero2,
        predicted_model_states(zero3, Strategy.ZERO3),
        predicted_model_states(zero2, Strategy.ZERO2),
        params_bytes_per_rank(zero3),
        short,
        zero3.n_blocks + 1,
        per_unit("all_gather", "forward"),
        per_unit("reduce_scatter", "backward"),
        zero3.root_and_block_bytes()[0],
    )


def check_fsdp_is_zero3(a: AgainstStages) -> Verdict:
    """Each rank's bytes plus the padding its shard is short of equal the padded stage-3 prediction."""
    c = Conditions()
    # Parameters against each rank's own rows of every tensor (padding adds nothing to the bytes a rank
    # holds); gradients and optimizer state, with the padding the parameters are short of, against stage 3.
    measured = a.zero3.part_bytes("params")
    c.require(
        measured == a.params_per_rank,
        f"FSDP params {measured} B = each rank's 1/{a.zero3.world_size} of every tensor's rows "
        f"{a.params_per_rank} B (stage 3's {a.stage3['params']:,} B with padding)",
    )
    for part in ("grads", "optimizer"):
        measured = a.zero3.padded_part_bytes(part)
        c.require(
            all(b == a.stage3[part] for b in measured), f"FSDP {part} {measured} = stage 3's {a.stage3[part]}"
        )
    for part in ("grads", "optimizer"):
        measured = a.zero2.padded_part_bytes(part)
        c.require(
            all(b == a.stage2[part] for b in measured),
            f"reshard-off {part} {measured} = stage 2's {a.stage2[part]}",
        )
    # Stage 3's signature in the step itself: every unit gathered once in forward and freed after it
    # (only the root, which backward needs first, stays), every unit's gradients reduce-scattered.
    c.require(
        len(a.forward_gathers) == a.units and set(a.forward_gathers.values()) == {1},
        f"FSDP all-gathers each of its {a.units} units once in forward ({a.forward_gathers})",
    )
    c.require(
        all(b <= a.root for b in a.zero3.unsharded_after_forward()),
        f"FSDP frees every block's gathered parameters after its forward "
        f"({' / '.join(f'{b:,}' for b in a.zero3.unsharded_after_forward())} B left: the root's {a.root:,})",
    )
    c.require(
        len(a.backward_scatters) == a.units and set(a.backward_scatters.values()) == {1},
        f"FSDP reduce-scatters each unit's gradients once in backward ({a.backward_scatters})",
    )
    gathered, full = a.zero2.unsharded_after_forward(), a.zero2.padded_full_bytes("params")
    c.require(
        all(b == full for b in gathered),
        f"reshard-off keeps {gathered} parameter bytes through the step = stage 2's full parameters ({full}"
        f"{', padded' if full > a.stage2['params'] else ''})",
    )
    return c.verdict()


def report_fsdp_is_zero3(a: AgainstStages) -> Report:
    zero3, zero2, stage3 = a.zero3, a.zero2, a.stage3
    n = zero3.world_size
    measured3 = zero3.model_states_bytes()[0]
    padding = (
        f" (FSDP pads dims that N does not divide, so the last ranks' shards are up to {a.short:,} B short of it)"
        if a.short
        else ""
    )
    finding = (
        f"At N={n}, FSDP's measured model states on rank 0 are {human_bytes(measured3)} ({measured3:,} B) against "
        f"ZeRO stage 3's predicted {stage3['total']:,} B in fp32 (4/4/8 B per parameter, as this run keeps them; "
        f"the paper's mixed precision counts 2/2/12){padding}: params {zero3.part_bytes('params')[0]:,} / "
        f"{stage3['params']:,}, grads {zero3.part_bytes('grads')[0]:,} / {stage3['grads']:,}, optimizer "
        f"{zero3.part_bytes('optimizer')[0]:,} / {stage3['optimizer']:,}. With reshard-after-forward off, "
        f"gradients and optimizer state match stage 2 ({zero2.part_bytes('grads')[0]:,} and "
        f"{zero2.part_bytes('optimizer')[0]:,} B) and the full {zero2.unsharded_after_forward()[0]:,} B of "
        f"parameters stay gathered from forward to backward, as stage 2 keeps them. That is PyTorch's FSDP2, which "
        f"shards every parameter: DeepSpeed's ZeRO-3 keeps parameters of at most stage3_param_persistence_threshold "
        f"({DEEPSPEED_PERSISTENCE_THRESHOLD:,} elements by default) gathered on every rank: "
        f"{persistent_share(GPTConfig(**zero3.config.model)):.1%} of Ψ of this model (derived from its shapes by "
        f"that rule, not run)."
    )
    rows = []
    for key, m, predicted in (("zero3", zero3, stage3), ("zero2", zero2, a.stage2)):
        for rank in range(len(m.ranks)):
            for part in PARTS:
                if key == "zero2" and part == "params":  # stage 2's parameters: the copy gathered for the step
                    measured = with_padding = m.unsharded_after_forward()[rank]
                    expected = m.padded_full_bytes("params")
                else:
                    measured, with_padding = m.part_bytes(part)[rank], m.padded_part_bytes(part)[rank]
                    expected = predicted[part]
                rows.append((key, rank, part, measured, with_padding, expected, with_padding == expected))
    return Report(
        finding,
        Table(
            ("run", "rank", "part", "measured bytes", "measured + padding", "predicted bytes", "equal"),
            tuple(rows),
        ),
        {
            "model_states": charts.model_states_chart(
                f"Model states per rank (rank 0, N={n})", {"zero2": zero2, "zero3": zero3}, ["zero2", "zero3"]
            )
        },
    )


GATHERING_LABS: tuple[Lab, ...] = (
    catalog_lab(
        "reshard-after-forward",
        runs_at(
            (RESHARD_ON, Strategy.ZERO3, {"prefetch": False}),
            (RESHARD_ON_PREFETCH, Strategy.ZERO3, {}),
            (RESHARD_OFF, Strategy.ZERO2, {}),
        ),
        analyse_reshard_after_forward,
        check_reshard_after_forward,
        report_reshard_after_forward,
    ),
    catalog_lab(
        "stage3-shards-params",
        runs_at(("zero2", Strategy.ZERO2, {}), ("zero3", Strategy.ZERO3, {})),
        analyse_stage3_params,
        check_stage3_params,
        report_stage3_params,
    ),
    catalog_lab(
        "fsdp-is-zero3",
        runs_at(("zero3", Strategy.ZERO3, {}), ("zero2", Strategy.ZERO2, {})),
        analyse_fsdp_is_zero3,
        check_fsdp_is_zero3,
        report_fsdp_is_zero3,
    ),
)
