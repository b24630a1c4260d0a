"""Labs about what each rank holds: model states per strategy, what each ZeRO stage shards, and how
per-rank memory scales with the number of ranks.

Model states are measured between steps (the engine's exact bytes of the local parameter, gradient
and optimizer tensors); "full" is what the unsharded model needs in fp32 Adam: 4Ψ, 4Ψ and 8Ψ bytes.
"""

from __future__ import annotations

from sharding_lab.analytic import bytes_per_param, model_states_bytes_per_rank
from sharding_lab.labs import charts
from sharding_lab.labs import readings as read
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
from sharding_lab.svg import Bar, human_bytes, stacked_bar_chart

# "About 1/N" for ZeRO-1, which assigns whole tensors to ranks greedily. FSDP's shards are checked
# exactly instead (`readings.sharded`): they add up to the model, none above 1/N of the padded model.
ZERO1_SHARD_TOLERANCE = 0.25


def _shares_text(shares: list[float]) -> str:
    return " / ".join(percent(s) for s in shares)


def _all_full(m: dict, part: str) -> bool:
    return all(b == read.full_bytes(m, part) for b in read.part_bytes(m, part))


def _all_about(m: dict, part: str, fraction: float, tolerance: float) -> bool:
    return all(near(s, fraction, tolerance) for s in read.shares(m, part))


def _model_states_rows(measurements: Measurements, keys: list[str]) -> tuple[tuple[object, ...], ...]:
    rows = []
    for key in keys:
        m = measurements[key]
        full = read.full_model_states_bytes(m)
        for rank, total in enumerate(read.model_states_bytes(m)):
            parts = [read.part_bytes(m, part)[rank] for part in read.PARTS]
            rows.append((key, rank, *parts, total, round(total / full, 4)))
    return tuple(rows)


MODEL_STATES_COLUMNS = ("run", "rank", "params bytes", "grads bytes", "optimizer bytes", "model states bytes",
                        "share of full")


# --- what-fsdp-shards --------------------------------------------------------------------------------


def check_what_fsdp_shards(ms: Measurements) -> Verdict:
    ddp, fsdp = ms["ddp"], ms["zero3"]
    n = read.world_size(fsdp)
    c = Conditions()
    for part in read.PARTS:
        c.require(_all_full(ddp, part), f"DDP: every rank holds the full {part} ({_shares_text(read.shares(ddp, part))})")
    for part in read.PARTS:
        c.require(
            read.sharded(fsdp, part),
            f"FSDP: every rank holds about 1/{n} of the {part} ({_shares_text(read.shares(fsdp, part))})",
        )
    return c.verdict()


def report_what_fsdp_shards(ms: Measurements) -> Report:
    ddp, fsdp = ms["ddp"], ms["zero3"]
    n = read.world_size(fsdp)
    held = ", ".join(f"{part} {human_bytes(read.part_bytes(ddp, part)[0])}" for part in read.PARTS)
    sharded = ", ".join(
        f"{part} {human_bytes(read.part_bytes(fsdp, part)[0])} ({percent(read.shares(fsdp, part)[0])})"
        for part in read.PARTS
    )
    finding = (
        f"At N={n}, each DDP rank holds the full model states ({held}); each FSDP rank holds "
        f"{sharded}: 1/{n} of every part, {human_bytes(read.model_states_bytes(fsdp)[0])} "
        f"instead of {human_bytes(read.model_states_bytes(ddp)[0])}."
    )
    keys = ["ddp", "zero3"]
    return Report(
        finding,
        Table(MODEL_STATES_COLUMNS, _model_states_rows(ms, keys)),
        {
            "model_states": charts.model_states_chart(f"Model states per rank (rank 0, N={n})", ms, keys),
            "memory_by_category": charts.memory_categories_chart(f"Memory at peak by category (rank 0, N={n})", ms, keys),
        },
    )


# --- persistent-memory-scaling -----------------------------------------------------------------------


def scaling_world_sizes(world_size: int) -> tuple[int, ...]:
    """1, N and 2N ranks: 1, 2, 4 for the default N = 2."""
    return tuple(sorted({1, world_size, 2 * world_size}))


def scaling_key(strategy: str, world_size: int) -> str:
    return f"{strategy}, N={world_size}"


def scaling_runs(world_size: int) -> tuple[RunSpec, ...]:
    return tuple(
        RunSpec(scaling_key(strategy, n), strategy, n)
        for n in scaling_world_sizes(world_size)
        for strategy in ("ddp", "zero3")
    )


def _scaling_points(ms: Measurements, strategy: str) -> list[tuple[int, int]]:
    """(world size, largest per-rank model-state bytes) for each measured world size, ascending."""
    points = []
    for key, m in ms.items():
        if key.startswith(f"{strategy}, N="):
            points.append((read.world_size(m), max(read.model_states_bytes(m))))
    return sorted(points)


def check_persistent_memory_scaling(ms: Measurements) -> Verdict:
    c = Conditions()
    ddp, fsdp = _scaling_points(ms, "ddp"), _scaling_points(ms, "zero3")
    c.require(len(ddp) >= 3 and len(fsdp) >= 3, f"measured at three or more world sizes ({[n for n, _ in fsdp]})")
    full = read.full_model_states_bytes(next(iter(ms.values())))
    for n, held in ddp:
        c.require(held == full, f"DDP at N={n}: {human_bytes(held)} per rank, the full {human_bytes(full)}")
    for n, held in fsdp:
        m = ms[scaling_key("zero3", n)]
        c.require(
            all(read.sharded(m, part) for part in read.PARTS),
            f"FSDP at N={n}: {human_bytes(held)} on the fullest rank, {held / full:.3f} of the full copy "
            f"(1/{n} = {1 / n:.3f}, at most {read.padded_num_params(m) / read.num_params(m) / n:.3f} with FSDP's padding)",
        )
    return c.verdict()


def report_persistent_memory_scaling(ms: Measurements) -> Report:
    ddp, fsdp = _scaling_points(ms, "ddp"), _scaling_points(ms, "zero3")
    full = read.full_model_states_bytes(next(iter(ms.values())))
    ddp_text = ", ".join(f"{human_bytes(b)} at N={n}" for n, b in ddp)
    fsdp_text = ", ".join(f"{human_bytes(b)} at N={n}" for n, b in fsdp)
    fractions = ", ".join(f"{b / full:.3f}" for _, b in fsdp)
    padded = any(read.padded_num_params(m) > read.num_params(m) for m in ms.values())
    finding = (
        f"Persistent model states per rank: DDP {ddp_text} (flat); FSDP {fsdp_text} on the fullest rank, "
        f"i.e. {fractions} of the full copy (1/N"
        + (", plus FSDP's padding of dims that N does not divide)." if padded else ").")
    )
    rows = []
    for strategy, points in (("ddp", ddp), ("zero3", fsdp)):
        for n, held in points:
            m = ms[scaling_key(strategy, n)]
            persistent = max(int(r.get("persistent_bytes") or 0) for r in read.ranks(m))
            rows.append((strategy, n, held, round(held / full, 4), persistent))
    keys = [scaling_key(strategy, n) for strategy, points in (("ddp", ddp), ("zero3", fsdp)) for n, _ in points]
    return Report(
        finding,
        Table(("strategy", "world size", "model states bytes per rank", "share of full",
               "persistent bytes (tracker)"), tuple(rows)),
        {"model_states": charts.model_states_chart("Persistent model states per rank as ranks are added", ms, keys)},
    )


# --- zero-stages-model-states --------------------------------------------------------------------------


def gathered_through_step(m: dict) -> list[int]:
    """Per rank, full parameter bytes gathered and kept from forward into backward (0 without FSDP)."""
    return read.unsharded_after_forward(m)


def check_zero_stages(ms: Measurements) -> Verdict:
    ddp, zero1, zero2, zero3 = (ms[s] for s in ("ddp", "zero1", "zero2", "zero3"))
    n = read.world_size(zero3)
    full_params = read.full_bytes(zero3, "params")
    c = Conditions()
    c.require(all(_all_full(ddp, part) for part in read.PARTS), "ddp: parameters, gradients and optimizer state full")
    c.require(
        _all_about(zero1, "optimizer", 1 / n, ZERO1_SHARD_TOLERANCE)
        and sum(read.part_bytes(zero1, "optimizer")) == read.full_bytes(zero1, "optimizer"),
        f"zero1: optimizer state split across ranks ({_shares_text(read.shares(zero1, 'optimizer'))})",
    )
    c.require(_all_full(zero1, "params") and _all_full(zero1, "grads"), "zero1: parameters and gradients full")
    c.require(
        read.sharded(zero2, "grads") and read.sharded(zero2, "optimizer"),
        f"zero2: gradients and optimizer state about 1/{n} "
        f"({_shares_text(read.shares(zero2, 'grads'))}; {_shares_text(read.shares(zero2, 'optimizer'))})",
    )
    c.require(
        all(b >= full_params for b in gathered_through_step(zero2)),
        f"zero2: full parameters kept from forward to backward ({_shares_text([b / full_params for b in gathered_through_step(zero2)])})",
    )
    c.require(
        all(read.sharded(zero3, part) for part in read.PARTS),
        f"zero3: parameters, gradients and optimizer state about 1/{n}",
    )
    totals = [max(read.model_states_bytes(m)) for m in (ddp, zero1, zero2, zero3)]
    c.require(
        totals[0] > totals[1] > totals[2] >= totals[3],
        f"model states between steps fall stage by stage ({' > '.join(human_bytes(t) for t in totals)})",
    )
    c.require(
        all(b < full_params for b in gathered_through_step(zero3)),
        f"zero3: block parameters freed after forward ({_shares_text([b / full_params for b in gathered_through_step(zero3)])} kept gathered)",
    )
    return c.verdict()


def report_zero_stages(ms: Measurements) -> Report:
    keys = ["ddp", "zero1", "zero2", "zero3"]
    n = read.world_size(ms["zero3"])
    full_params = read.full_bytes(ms["zero3"], "params")
    paper = {key: model_states_bytes_per_rank(read.num_params(ms[key]), n, key)["total"] for key in keys}

    def shares(key: str) -> str:
        return "/".join(percent(read.shares(ms[key], part)[0]) for part in read.PARTS)

    finding = (
        f"Share of the full parameters/gradients/optimizer state on rank 0 at N={n}: "
        + "; ".join(f"{key} {shares(key)}" for key in keys)
        + f"; model states between steps {', '.join(human_bytes(read.model_states_bytes(ms[k])[0]) for k in keys)}. "
        f"zero2 (FSDP2, reshard-after-forward off) keeps "
        f"{percent(gathered_through_step(ms['zero2'])[0] / full_params)} of the parameters unsharded from forward "
        f"to backward, where stage 2 keeps them replicated, and reshards them after backward (the paper's stage 2 "
        f"would hold {human_bytes(paper['zero2'])} between steps); zero3 keeps only the root unit "
        f"({percent(gathered_through_step(ms['zero3'])[0] / full_params)})."
    )
    rows = []
    for key in keys:
        m = ms[key]
        rows.append(
            (key, *(read.part_bytes(m, part)[0] for part in read.PARTS), read.model_states_bytes(m)[0], paper[key],
             gathered_through_step(m)[0])
        )
    return Report(
        finding,
        Table(("strategy", "params bytes", "grads bytes", "optimizer bytes", "model states bytes",
               "paper's model states bytes", "unsharded params after forward"), tuple(rows)),
        {"model_states": charts.model_states_chart(f"Model states per rank by ZeRO stage (rank 0, N={n})", ms, keys)},
    )


# --- adam-optimizer-state --------------------------------------------------------------------------------


def check_adam_state(ms: Measurements) -> Verdict:
    ddp = ms["ddp"]
    c = Conditions()
    params, grads, optimizer = (read.part_bytes(ddp, part) for part in read.PARTS)
    ratios = [o / p for o, p in zip(optimizer, params, strict=True)]
    c.require(all(abs(r - 2) < 1e-9 for r in ratios), f"optimizer state = 2x parameter bytes on every rank ({ratios})")
    c.require(
        all(o > max(p, g) for o, p, g in zip(optimizer, params, grads, strict=True)),
        "optimizer state is the biggest model state",
    )
    return c.verdict()


def report_adam_state(ms: Measurements) -> Report:
    ddp = ms["ddp"]
    psi = read.num_params(ddp)
    params, grads, optimizer = (read.part_bytes(ddp, part)[0] for part in read.PARTS)
    mixed = bytes_per_param(mixed_precision=True)
    finding = (
        f"Under DDP each rank's Adam state is {optimizer / params:.2f}x its parameter bytes "
        f"({human_bytes(optimizer)} against {human_bytes(params)} for Ψ={psi:,} fp32 parameters: "
        f"{optimizer / psi:g} B per parameter for exp_avg and exp_avg_sq), the biggest model state. "
        f"With mixed precision the analytic model gives K={mixed['optimizer']} B per parameter of "
        f"optimizer state against {mixed['params']}+{mixed['grads']} for fp16 parameters and gradients."
    )
    measured_per_param = {part: read.part_bytes(ddp, part)[0] / psi for part in read.PARTS}
    rows = tuple(
        (part, read.part_bytes(ddp, part)[0], round(measured_per_param[part], 4), mixed[part]) for part in read.PARTS
    )
    chart = stacked_bar_chart(
        "Bytes per parameter by model state",
        [Bar("fp32 Adam (measured)", measured_per_param), Bar("mixed precision (paper)", dict(mixed))],
        read.PARTS,
        colours=charts.MEMORY_COLOURS,
        format_value=lambda v: f"{v:g} B/param",
    )
    return Report(
        finding,
        Table(("part", "bytes per rank (DDP)", "bytes per parameter (measured fp32)",
               "bytes per parameter (mixed precision, analytic)"), rows),
        {"bytes_per_param": chart},
    )


# --- stage1-optimizer-only ---------------------------------------------------------------------------------


def check_stage1(ms: Measurements) -> Verdict:
    zero1 = ms["zero1"]
    n = read.world_size(zero1)
    c = Conditions()
    optimizer = read.part_bytes(zero1, "optimizer")
    c.require(
        _all_about(zero1, "optimizer", 1 / n, ZERO1_SHARD_TOLERANCE),
        f"zero1: each rank's optimizer state about 1/{n} ({_shares_text(read.shares(zero1, 'optimizer'))})",
    )
    c.require(sum(optimizer) == read.full_bytes(zero1, "optimizer"), "zero1: the ranks' optimizer shards add up to one copy")
    for part in ("params", "grads"):
        c.require(_all_full(zero1, part), f"zero1: {part} full on every rank ({_shares_text(read.shares(zero1, part))})")
    return c.verdict()


def report_stage1(ms: Measurements) -> Report:
    zero1, ddp = ms["zero1"], ms["ddp"]
    n = read.world_size(zero1)
    finding = (
        f"At N={n}, ZeRO-1 (ZeroRedundancyOptimizer) leaves the ranks "
        f"{_shares_text(read.shares(zero1, 'optimizer'))} of Adam's state "
        f"({' / '.join(human_bytes(b) for b in read.part_bytes(zero1, 'optimizer'))}; whole tensors are assigned "
        f"greedily, so the split is near 1/{n}{', here exact' if _all_about(zero1, 'optimizer', 1 / n, 0.0) else ''}) "
        f"while parameters and gradients stay full "
        f"({_shares_text(read.shares(zero1, 'params'))} and {_shares_text(read.shares(zero1, 'grads'))}); "
        f"DDP holds {human_bytes(read.part_bytes(ddp, 'optimizer')[0])} of optimizer state on every rank."
    )
    keys = ["ddp", "zero1"]
    return Report(
        finding,
        Table(MODEL_STATES_COLUMNS, _model_states_rows(ms, keys)),
        {"model_states": charts.model_states_chart(f"Model states per rank, DDP vs ZeRO-1 (rank 0, N={n})", ms, keys)},
    )


# --- stage3-shards-params ------------------------------------------------------------------------------------


def check_stage3_params(ms: Measurements) -> Verdict:
    zero2, zero3 = ms["zero2"], ms["zero3"]
    n = read.world_size(zero3)
    full = read.full_bytes(zero3, "params")
    root, block = read.root_and_block_bytes(zero3)
    c = Conditions()
    c.require(
        all(b >= full for b in gathered_through_step(zero2)),
        f"zero2: full parameters on every rank from forward to backward "
        f"({_shares_text([b / full for b in gathered_through_step(zero2)])})",
    )
    c.require(read.sharded(zero3, "params"), f"zero3: a 1/{n} parameter shard ({_shares_text(read.shares(zero3, 'params'))})")
    c.require(
        all(b <= root for b in gathered_through_step(zero3)),
        f"zero3: no block's parameters stay gathered after forward "
        f"({' / '.join(human_bytes(b) for b in gathered_through_step(zero3))}, root unit {human_bytes(root)})",
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
        f"({human_bytes(gathered_through_step(zero2)[0])}, {percent(gathered_through_step(zero2)[0] / full)}) beside "
        f"its shard; each zero3 rank holds its 1/{n} shard ({human_bytes(read.part_bytes(zero3, 'params')[0])}, "
        f"{percent(read.shares(zero3, 'params')[0])}) and only the root unit gathered "
        f"({human_bytes(root)}, {percent(root / full)}: embeddings and head, which backward needs first). "
        f"Between steps FSDP2 reshards zero2 too, unlike DeepSpeed's ZeRO-2."
    )
    rows = tuple(
        (key, read.part_bytes(ms[key], "params")[0], gathered_through_step(ms[key])[0],
         read.part_bytes(ms[key], "params")[0] + gathered_through_step(ms[key])[0], full)
        for key in ("zero2", "zero3")
    )
    bars = [
        Bar(key, {"shard": read.part_bytes(ms[key], "params")[0], "gathered": gathered_through_step(ms[key])[0]})
        for key in ("zero2", "zero3")
    ]
    chart = stacked_bar_chart(
        f"Parameter bytes on rank 0 between forward and backward (N={n})", bars, ("shard", "gathered"),
        colours={"shard": "#0072B2", "gathered": "#56B4E9"},
    )
    return Report(
        finding,
        Table(("strategy", "param shard bytes", "gathered after forward", "params held in step", "full params bytes"),
              rows),
        {"params_in_step": chart},
    )


# --- fsdp-is-zero3 ---------------------------------------------------------------------------------------------


def predicted_model_states(m: dict, stage: str) -> dict[str, int]:
    """The ZeRO paper's per-rank model states for `stage`, with FSDP's padding of uneven dims."""
    padded = m["config"].get("padded_num_params")
    return model_states_bytes_per_rank(read.num_params(m), read.world_size(m), stage, padded_num_params=padded)


def check_fsdp_is_zero3(ms: Measurements) -> Verdict:
    """Each rank's bytes plus the padding its shard is short of equal the padded stage-3 prediction."""
    zero3, zero2 = ms["zero3"], ms["zero2"]
    c = Conditions()
    stage3 = predicted_model_states(zero3, "zero3")
    for part in read.PARTS:
        measured = read.padded_part_bytes(zero3, part)
        c.require(all(b == stage3[part] for b in measured), f"FSDP {part} {measured} = stage 3's {stage3[part]}")
    stage2 = predicted_model_states(zero2, "zero2")
    for part in ("grads", "optimizer"):
        measured = read.padded_part_bytes(zero2, part)
        c.require(all(b == stage2[part] for b in measured), f"reshard-off {part} {measured} = stage 2's {stage2[part]}")
    gathered, full = gathered_through_step(zero2), read.padded_full_bytes(zero2, "params")
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
    short = max(read.full_model_states_bytes(zero3) // read.num_params(zero3) * int(r.get("padding_elements") or 0)
                for r in read.ranks(zero3))
    padding = (f" (FSDP pads dims that N does not divide, so the last ranks' shards are up to {short:,} B short "
               f"of it)" if short else "")
    finding = (
        f"At N={n}, FSDP's measured model states on rank 0 are {human_bytes(measured3)} ({measured3:,} B) against "
        f"ZeRO stage 3's predicted {stage3['total']:,} B{padding}: params {read.part_bytes(zero3, 'params')[0]:,} / "
        f"{stage3['params']:,}, grads {read.part_bytes(zero3, 'grads')[0]:,} / {stage3['grads']:,}, optimizer "
        f"{read.part_bytes(zero3, 'optimizer')[0]:,} / {stage3['optimizer']:,}. With reshard-after-forward off, "
        f"gradients and optimizer state match stage 2 ({read.part_bytes(zero2, 'grads')[0]:,} and "
        f"{read.part_bytes(zero2, 'optimizer')[0]:,} B) and the full {gathered_through_step(zero2)[0]:,} B of "
        f"parameters stay gathered from forward to backward, as stage 2 keeps them."
    )
    rows = []
    for key, predicted in (("zero3", stage3), ("zero2", stage2)):
        m = ms[key]
        for rank in range(len(read.ranks(m))):
            for part in read.PARTS:
                if key == "zero2" and part == "params":  # stage 2's parameters: the copy gathered for the step
                    measured, with_padding = gathered_through_step(m)[rank], gathered_through_step(m)[rank]
                    expected = read.padded_full_bytes(m, "params")
                else:
                    measured, with_padding = read.part_bytes(m, part)[rank], read.padded_part_bytes(m, part)[rank]
                    expected = predicted[part]
                rows.append((key, rank, part, measured, with_padding, expected, with_padding == expected))
    return Report(
        finding,
        Table(("run", "rank", "part", "measured bytes", "measured + padding", "predicted bytes", "equal"), tuple(rows)),
        {"model_states": charts.model_states_chart(f"Model states per rank (rank 0, N={n})", ms, ["zero2", "zero3"])},
    )


# --- reshard-after-forward ------------------------------------------------------------------------------------


RESHARD_ON, RESHARD_ON_PREFETCH, RESHARD_OFF = "reshard on", "reshard on + prefetch", "reshard off"


def check_reshard_after_forward(ms: Measurements) -> Verdict:
    on, prefetch, off = ms[RESHARD_ON], ms[RESHARD_ON_PREFETCH], ms[RESHARD_OFF]
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
    c.require(
        all(b <= 2 * block for b in read.all_gather_buffer_peak(prefetch)),
        f"{RESHARD_ON_PREFETCH}: at most a second block's worth waiting in all-gather buffers "
        f"(peak {_blocks_text(read.all_gather_buffer_peak(prefetch), 0, block)} blocks)",
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
            f"{key}: between steps only the 1/{n} shard ({_shares_text(read.shares(ms[key], 'params'))})",
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
        f"without prefetching; the prefetched next block waits in the all-gather buffer (peak "
        f"{blocks(read.all_gather_buffer_peak(prefetch), 0)} blocks' worth) until it starts. Without it, "
        f"{blocks(read.unsharded_after_forward(off))} of {read.n_blocks(on)} blocks stay unsharded until backward "
        f"({human_bytes(read.unsharded_after_forward(off)[0])} when forward ends, against "
        f"{human_bytes(read.unsharded_after_forward(on)[0])}). Between steps each rank keeps only its "
        f"{human_bytes(read.part_bytes(on, 'params')[0])} shard."
    )
    rows = tuple(
        (key, read.unsharded_peak(ms[key])[0], round((read.unsharded_peak(ms[key])[0] - root) / block, 2) if block else None,
         read.all_gather_buffer_peak(ms[key])[0], read.unsharded_after_forward(ms[key])[0],
         read.part_bytes(ms[key], "params")[0])
        for key in keys
    )
    bars = [
        Bar(key, {"shard": read.part_bytes(ms[key], "params")[0],
                  "unsharded (peak)": read.unsharded_peak(ms[key])[0],
                  "all-gather buffers (peak)": read.all_gather_buffer_peak(ms[key])[0]})
        for key in keys
    ]
    chart = stacked_bar_chart(
        "Parameter bytes on rank 0: shard, peak unsharded, peak all-gather buffers", bars,
        ("shard", "unsharded (peak)", "all-gather buffers (peak)"),
        colours={"shard": "#0072B2", "unsharded (peak)": "#56B4E9", "all-gather buffers (peak)": "#999999"},
    )
    return Report(
        finding,
        Table(("run", "peak unsharded params bytes", "peak unsharded blocks (beside root)",
               "peak all-gather buffer bytes", "unsharded after forward bytes", "param shard bytes"), rows),
        {"gathered_params": chart},
    )


MEMORY_LABS: tuple[Lab, ...] = (
    catalog_lab("what-fsdp-shards", runs_at(("ddp", "ddp", {}), ("zero3", "zero3", {})),
         check_what_fsdp_shards, report_what_fsdp_shards),
    catalog_lab("reshard-after-forward",
         runs_at((RESHARD_ON, "zero3", {"prefetch": False}), (RESHARD_ON_PREFETCH, "zero3", {}),
                 (RESHARD_OFF, "zero2", {})),
         check_reshard_after_forward, report_reshard_after_forward),
    catalog_lab("fsdp-is-zero3", runs_at(("zero3", "zero3", {}), ("zero2", "zero2", {})),
         check_fsdp_is_zero3, report_fsdp_is_zero3),
    catalog_lab("persistent-memory-scaling", scaling_runs, check_persistent_memory_scaling, report_persistent_memory_scaling),
    catalog_lab("zero-stages-model-states",
         runs_at(("ddp", "ddp", {}), ("zero1", "zero1", {}), ("zero2", "zero2", {}), ("zero3", "zero3", {})),
         check_zero_stages, report_zero_stages),
    catalog_lab("adam-optimizer-state", runs_at(("ddp", "ddp", {})), check_adam_state, report_adam_state),
    catalog_lab("stage3-shards-params", runs_at(("zero2", "zero2", {}), ("zero3", "zero3", {})),
         check_stage3_params, report_stage3_params),
    catalog_lab("stage1-optimizer-only", runs_at(("ddp", "ddp", {}), ("zero1", "zero1", {})), check_stage1, report_stage1),
)
