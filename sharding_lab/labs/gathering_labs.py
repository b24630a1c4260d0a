"""Labs about parameters gathered during the step: how many blocks are unsharded at once with and
without reshard-after-forward, what stage 3 shards that stage 2 keeps whole, and FSDP's model states
against the ZeRO stage-3 formula.

"Unsharded" bytes come from the engine's memory tracker (FSDP's unsharded-parameter category); block
and root sizes from the forward all-gathers, one per FSDP unit.
"""

from __future__ import annotations

from sharding_lab.analytic import model_states_bytes_per_rank
from sharding_lab.labs import charts
from sharding_lab.labs import readings as read
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
from sharding_lab.svg import Bar, human_bytes, stacked_bar_chart

# --- reshard-after-forward ------------------------------------------------------------------------------------


RESHARD_ON, RESHARD_ON_PREFETCH, RESHARD_OFF = "reshard on", "reshard on + prefetch", "reshard off"


def check_reshard_after_forward(ms: Measurements) -> Verdict:
    on, off = ms[RESHARD_ON], ms[RESHARD_OFF]
    root, block = read.root_and_block_bytes(on)
    full = read.full_bytes(on, "params")
    n = read.world_size(on)
    c = Conditions()
    c.require(block > 0, f"each block is gathered as one unit ({human_bytes(block)})")
    for key in (RESHARD_ON, RESHARD_ON_PREFETCH):
        c.require(
            all(b <= root + block for b in read.unsharded_peak(ms[key])),
            f"{key}: at most one block's full parameters unsharded at a time beside the root "
            f"(peak {_blocks_text(read.unsharded_peak(ms[key]), root, block)} blocks)",
        )
    for key in (RESHARD_ON, RESHARD_ON_PREFETCH):
        c.require(
            all(b <= 2 * block for b in read.all_gather_buffer_peak(ms[key])),
            f"{key}: all-gather buffers hold at most two blocks' worth "
            f"(peak {_blocks_text(read.all_gather_buffer_peak(ms[key]), 0, block)} blocks)",
        )
    c.require(
        all(b <= root for b in read.unsharded_after_forward(on)),
        f"{RESHARD_ON}: no block unsharded when forward ends ({_blocks_text(read.unsharded_after_forward(on), root, block)})",
    )
    c.require(
        all(b >= full for b in read.unsharded_after_forward(off)),
        f"{RESHARD_OFF}: every block still unsharded when forward ends "
        f"({_blocks_text(read.unsharded_after_forward(off), root, block)} blocks)",
    )
    for key in (RESHARD_ON, RESHARD_OFF):
        c.require(
            read.sharded(ms[key], "params"),
            f"{key}: between steps only the 1/{n} shard ({shares_text(read.shares(ms[key], 'params'))})",
        )
    return c.verdict()


def _blocks_text(gathered: list[int], root: int, block: int) -> str:
    return " / ".join(f"{(b - root) / block:.2f}" if block else "?" for b in gathered)


def report_reshard_after_forward(ms: Measurements) -> Report:
    on, prefetch, off = ms[RESHARD_ON], ms[RESHARD_ON_PREFETCH], ms[RESHARD_OFF]
    root, block = read.root_and_block_bytes(on)
    keys = [RESHARD_ON, RESHARD_ON_PREFETCH, RESHARD_OFF]

    def blocks(values: list[int], base: int = root) -> str:
        return f"{(values[0] - base) / block:.0f}" if block else "?"

    finding = (
        f"With reshard-after-forward, at most {blocks(read.unsharded_peak(on))} block's full parameters "
        f"({human_bytes(block)}) were unsharded at a time beside the root unit ({human_bytes(root)}), with or "
        f"without prefetching. Gathered bytes also pass through all-gather buffers, which peaked at "
        f"{blocks(read.all_gather_buffer_peak(on), 0)} and {blocks(read.all_gather_buffer_peak(prefetch), 0)} "
        f"blocks' worth without and with prefetching (in forward FSDP frees a unit's all-gather output only when "
        f"the next unit's is waited on, so a copy-out can overlap the next all-gather; a prefetched block's "
        f"bytes wait there until it starts). Without reshard-after-forward, "
        f"{blocks(read.unsharded_after_forward(off))} of {read.n_blocks(on)} blocks stay unsharded until backward "
        f"({human_bytes(read.unsharded_after_forward(off)[0])} when forward ends, against "
        f"{human_bytes(read.unsharded_after_forward(on)[0])}). Between steps each rank keeps only its "
        f"{human_bytes(read.part_bytes(on, 'params')[0])} shard."
    )
    rows = tuple(
        (
            key,
            read.unsharded_peak(ms[key])[0],
            round((read.unsharded_peak(ms[key])[0] - root) / block, 2) if block else None,
            read.all_gather_buffer_peak(ms[key])[0],
            read.unsharded_after_forward(ms[key])[0],
            read.part_bytes(ms[key], "params")[0],
        )
        for key in keys
    )
    bars = [
        Bar(
            key,
            {
                "shard": read.part_bytes(ms[key], "params")[0],
                "unsharded (peak)": read.unsharded_peak(ms[key])[0],
                "all-gather buffers (peak)": read.all_gather_buffer_peak(ms[key])[0],
            },
        )
        for key in keys
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


def check_stage3_params(ms: Measurements) -> Verdict:
    zero2, zero3 = ms["zero2"], ms["zero3"]
    n = read.world_size(zero3)
    full = read.full_bytes(zero3, "params")
    root, block = read.root_and_block_bytes(zero3)
    c = Conditions()
    c.require(
        all(b >= full for b in read.unsharded_after_forward(zero2)),
        f"zero2: full parameters on every rank from forward to backward "
        f"({shares_text([b / full for b in read.unsharded_after_forward(zero2)])})",
    )
    c.require(
        read.sharded(zero3, "params"),
        f"zero3: a 1/{n} parameter shard ({shares_text(read.shares(zero3, 'params'))})",
    )
    c.require(
        all(b <= root for b in read.unsharded_after_forward(zero3)),
        f"zero3: no block's parameters stay gathered after forward "
        f"({' / '.join(human_bytes(b) for b in read.unsharded_after_forward(zero3))}, root unit {human_bytes(root)})",
    )
    c.require(
        all(b <= root + block for b in read.unsharded_peak(zero3)),
        f"zero3: at most one block gathered at a time beside the root "
        f"(peak {' / '.join(human_bytes(b) for b in read.unsharded_peak(zero3))}, block {human_bytes(block)})",
    )
    return c.verdict()


def report_stage3_params(ms: Measurements) -> Report:
    zero2, zero3 = ms["zero2"], ms["zero3"]
    n = read.world_size(zero3)
    full = read.full_bytes(zero3, "params")
    root, _ = read.root_and_block_bytes(zero3)
    finding = (
        f"From forward to backward each zero2 rank holds the full parameters "
        f"({human_bytes(read.unsharded_after_forward(zero2)[0])}, {percent(read.unsharded_after_forward(zero2)[0] / full)}) beside "
        f"its shard; each zero3 rank holds its 1/{n} shard ({human_bytes(read.part_bytes(zero3, 'params')[0])}, "
        f"{percent(read.shares(zero3, 'params')[0])}) and only the root unit gathered "
        f"({human_bytes(root)}, {percent(root / full)}: embeddings and head, which backward needs first). "
        f"Between steps FSDP2 reshards zero2 too, unlike DeepSpeed's ZeRO-2."
    )
    rows = tuple(
        (
            key,
            read.part_bytes(ms[key], "params")[0],
            read.unsharded_after_forward(ms[key])[0],
            read.part_bytes(ms[key], "params")[0] + read.unsharded_after_forward(ms[key])[0],
            full,
        )
        for key in ("zero2", "zero3")
    )
    bars = [
        Bar(
            key,
            {
                "shard": read.part_bytes(ms[key], "params")[0],
                "gathered": read.unsharded_after_forward(ms[key])[0],
            },
        )
        for key in ("zero2", "zero3")
    ]
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


def predicted_model_states(m: dict, stage: str) -> dict[str, int]:
    """The ZeRO paper's per-rank model states for `stage`, with FSDP's padding of uneven dims."""
    padded = m["config"].get("padded_num_params")
    return model_states_bytes_per_rank(
        read.num_params(m), read.world_size(m), stage, padded_num_params=padded
    )


def check_fsdp_is_zero3(ms: Measurements) -> Verdict:
    """Each rank's bytes plus the padding its shard is short of equal the padded stage-3 prediction."""
    zero3, zero2 = ms["zero3"], ms["zero2"]
    c = Conditions()
    stage3 = predicted_model_states(zero3, "zero3")
    for part in read.PARTS:
        measured = read.padded_part_bytes(zero3, part)
        c.require(
            all(b == stage3[part] for b in measured), f"FSDP {part} {measured} = stage 3's {stage3[part]}"
        )
    stage2 = predicted_model_states(zero2, "zero2")
    for part in ("grads", "optimizer"):
        measured = read.padded_part_bytes(zero2, part)
        c.require(
            all(b == stage2[part] for b in measured),
            f"reshard-off {part} {measured} = stage 2's {stage2[part]}",
        )
    gathered, full = read.unsharded_after_forward(zero2), read.padded_full_bytes(zero2, "params")
    c.require(
        all(b == full for b in gathered),
        f"reshard-off keeps {gathered} parameter bytes through the step = stage 2's full parameters ({full}"
        f"{', padded' if full > stage2['params'] else ''})",
    )
    return c.verdict()


def report_fsdp_is_zero3(ms: Measurements) -> Report:
    zero3, zero2 = ms["zero3"], ms["zero2"]
    n = read.world_size(zero3)
    stage3, stage2 = predicted_model_states(zero3, "zero3"), predicted_model_states(zero2, "zero2")
    measured3 = read.model_states_bytes(zero3)[0]
    short = max(
        read.full_model_states_bytes(zero3) // read.num_params(zero3) * int(r.get("padding_elements") or 0)
        for r in read.ranks(zero3)
    )
    padding = (
        f" (FSDP pads dims that N does not divide, so the last ranks' shards are up to {short:,} B short "
        f"of it)"
        if short
        else ""
    )
    finding = (
        f"At N={n}, FSDP's measured model states on rank 0 are {human_bytes(measured3)} ({measured3:,} B) against "
        f"ZeRO stage 3's predicted {stage3['total']:,} B{padding}: params {read.part_bytes(zero3, 'params')[0]:,} / "
        f"{stage3['params']:,}, grads {read.part_bytes(zero3, 'grads')[0]:,} / {stage3['grads']:,}, optimizer "
        f"{read.part_bytes(zero3, 'optimizer')[0]:,} / {stage3['optimizer']:,}. With reshard-after-forward off, "
        f"gradients and optimizer state match stage 2 ({read.part_bytes(zero2, 'grads')[0]:,} and "
        f"{read.part_bytes(zero2, 'optimizer')[0]:,} B) and the full {read.unsharded_after_forward(zero2)[0]:,} B of "
        f"parameters stay gathered from forward to backward, as stage 2 keeps them."
    )
    rows = []
    for key, predicted in (("zero3", stage3), ("zero2", stage2)):
        m = ms[key]
        for rank in range(len(read.ranks(m))):
            for part in read.PARTS:
                if (
                    key == "zero2" and part == "params"
                ):  # stage 2's parameters: the copy gathered for the step
                    measured = with_padding = read.unsharded_after_forward(m)[rank]
                    expected = read.padded_full_bytes(m, "params")
                else:
                    measured, with_padding = (
                        read.part_bytes(m, part)[rank],
                        read.padded_part_bytes(m, part)[rank],
                    )
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
                f"Model states per rank (rank 0, N={n})", ms, ["zero2", "zero3"]
            )
        },
    )


GATHERING_LABS: tuple[Lab, ...] = (
    catalog_lab(
        "reshard-after-forward",
        runs_at(
            (RESHARD_ON, "zero3", {"prefetch": False}),
            (RESHARD_ON_PREFETCH, "zero3", {}),
            (RESHARD_OFF, "zero2", {}),
        ),
        check_reshard_after_forward,
        report_reshard_after_forward,
    ),
    catalog_lab(
        "stage3-shards-params",
        runs_at(("zero2", "zero2", {}), ("zero3", "zero3", {})),
        check_stage3_params,
        report_stage3_params,
    ),
    catalog_lab(
        "fsdp-is-zero3",
        runs_at(("zero3", "zero3", {}), ("zero2", "zero2", {})),
        check_fsdp_is_zero3,
        report_fsdp_is_zero3,
    ),
)
