"""Labs about what each rank holds between steps: model states per strategy, what each ZeRO stage
shards, Adam's share of them, and how per-rank memory scales with the number of ranks.

Model states are the engine's exact bytes of the local parameter, gradient and optimizer tensors;
"full" is what the unsharded model needs in fp32 Adam: 4Ψ, 4Ψ and 8Ψ bytes.
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
    shares_text,
)
from sharding_lab.svg import Bar, human_bytes, stacked_bar_chart

# "About 1/N" for ZeRO-1, which assigns whole tensors to ranks greedily. FSDP's shards are checked
# exactly instead (`readings.sharded`): they add up to the model, none above 1/N of the padded model.
ZERO1_SHARD_TOLERANCE = 0.25


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


def check_what_fsdp_shards(ms: Measurements) -> Verdict:
    ddp, fsdp = ms["ddp"], ms["zero3"]
    n = read.world_size(fsdp)
    c = Conditions()
    for part in read.PARTS:
        c.require(
            read.held_in_full(ddp, part),
            f"DDP: every rank holds the full {part} ({shares_text(read.shares(ddp, part))})",
        )
    for part in read.PARTS:
        c.require(
            read.sharded(fsdp, part),
            f"FSDP: every rank holds about 1/{n} of the {part} ({shares_text(read.shares(fsdp, part))})",
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
            "memory_by_category": charts.memory_categories_chart(
                f"Memory at peak by category (rank 0, N={n})", ms, keys
            ),
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
    c.require(
        len(ddp) >= 3 and len(fsdp) >= 3, f"measured at three or more world sizes ({[n for n, _ in fsdp]})"
    )
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
    keys = [
        scaling_key(strategy, n) for strategy, points in (("ddp", ddp), ("zero3", fsdp)) for n, _ in points
    ]
    return Report(
        finding,
        Table(
            (
                "strategy",
                "world size",
                "model states bytes per rank",
                "share of full",
                "persistent bytes (tracker)",
            ),
            tuple(rows),
        ),
        {
            "model_states": charts.model_states_chart(
                "Persistent model states per rank as ranks are added", ms, keys
            )
        },
    )


# --- zero-stages-model-states --------------------------------------------------------------------------


def check_zero_stages(ms: Measurements) -> Verdict:
    ddp, zero1, zero2, zero3 = (ms[s] for s in ("ddp", "zero1", "zero2", "zero3"))
    n = read.world_size(zero3)
    full_params = read.full_bytes(zero3, "params")
    c = Conditions()
    c.require(
        all(read.held_in_full(ddp, part) for part in read.PARTS),
        "ddp: parameters, gradients and optimizer state full",
    )
    c.require(
        _all_about(zero1, "optimizer", 1 / n, ZERO1_SHARD_TOLERANCE)
        and sum(read.part_bytes(zero1, "optimizer")) == read.full_bytes(zero1, "optimizer"),
        f"zero1: optimizer state split across ranks ({shares_text(read.shares(zero1, 'optimizer'))})",
    )
    c.require(
        read.held_in_full(zero1, "params") and read.held_in_full(zero1, "grads"),
        "zero1: parameters and gradients full",
    )
    c.require(
        read.sharded(zero2, "grads") and read.sharded(zero2, "optimizer"),
        f"zero2: gradients and optimizer state about 1/{n} "
        f"({shares_text(read.shares(zero2, 'grads'))}; {shares_text(read.shares(zero2, 'optimizer'))})",
    )
    c.require(
        all(b >= full_params for b in read.unsharded_after_forward(zero2)),
        f"zero2: full parameters kept from forward to backward ({shares_text([b / full_params for b in read.unsharded_after_forward(zero2)])})",
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
        all(b < full_params for b in read.unsharded_after_forward(zero3)),
        f"zero3: block parameters freed after forward ({shares_text([b / full_params for b in read.unsharded_after_forward(zero3)])} kept gathered)",
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
        f"{percent(read.unsharded_after_forward(ms['zero2'])[0] / full_params)} of the parameters unsharded from forward "
        f"to backward, where stage 2 keeps them replicated, and reshards them after backward (the paper's stage 2 "
        f"would hold {human_bytes(paper['zero2'])} between steps); zero3 keeps only the root unit "
        f"({percent(read.unsharded_after_forward(ms['zero3'])[0] / full_params)})."
    )
    rows = []
    for key in keys:
        m = ms[key]
        rows.append(
            (
                key,
                *(read.part_bytes(m, part)[0] for part in read.PARTS),
                read.model_states_bytes(m)[0],
                paper[key],
                read.unsharded_after_forward(m)[0],
            )
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
                "paper's model states bytes",
                "unsharded params after forward",
            ),
            tuple(rows),
        ),
        {
            "model_states": charts.model_states_chart(
                f"Model states per rank by ZeRO stage (rank 0, N={n})", ms, keys
            )
        },
    )


# --- adam-optimizer-state --------------------------------------------------------------------------------


def check_adam_state(ms: Measurements) -> Verdict:
    ddp = ms["ddp"]
    c = Conditions()
    params, grads, optimizer = (read.part_bytes(ddp, part) for part in read.PARTS)
    ratios = [o / p for o, p in zip(optimizer, params, strict=True)]
    c.require(
        all(abs(r - 2) < 1e-9 for r in ratios),
        f"optimizer state = 2x parameter bytes on every rank ({ratios})",
    )
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
        (part, read.part_bytes(ddp, part)[0], round(measured_per_param[part], 4), mixed[part])
        for part in read.PARTS
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
        Table(
            (
                "part",
                "bytes per rank (DDP)",
                "bytes per parameter (measured fp32)",
                "bytes per parameter (mixed precision, analytic)",
            ),
            rows,
        ),
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
        f"zero1: each rank's optimizer state about 1/{n} ({shares_text(read.shares(zero1, 'optimizer'))})",
    )
    c.require(
        sum(optimizer) == read.full_bytes(zero1, "optimizer"),
        "zero1: the ranks' optimizer shards add up to one copy",
    )
    for part in ("params", "grads"):
        c.require(
            read.held_in_full(zero1, part),
            f"zero1: {part} full on every rank ({shares_text(read.shares(zero1, part))})",
        )
    return c.verdict()


def report_stage1(ms: Measurements) -> Report:
    zero1, ddp = ms["zero1"], ms["ddp"]
    n = read.world_size(zero1)
    finding = (
        f"At N={n}, ZeRO-1 (ZeroRedundancyOptimizer) leaves the ranks "
        f"{shares_text(read.shares(zero1, 'optimizer'))} of Adam's state "
        f"({' / '.join(human_bytes(b) for b in read.part_bytes(zero1, 'optimizer'))}; whole tensors are assigned "
        f"greedily, so the split is near 1/{n}{', here exact' if _all_about(zero1, 'optimizer', 1 / n, 0.0) else ''}) "
        f"while parameters and gradients stay full "
        f"({shares_text(read.shares(zero1, 'params'))} and {shares_text(read.shares(zero1, 'grads'))}); "
        f"DDP holds {human_bytes(read.part_bytes(ddp, 'optimizer')[0])} of optimizer state on every rank."
    )
    keys = ["ddp", "zero1"]
    return Report(
        finding,
        Table(MODEL_STATES_COLUMNS, _model_states_rows(ms, keys)),
        {
            "model_states": charts.model_states_chart(
                f"Model states on each rank, DDP vs ZeRO-1 (N={n})", ms, keys, every_rank=True
            )
        },
    )


MODEL_STATE_LABS: tuple[Lab, ...] = (
    catalog_lab(
        "what-fsdp-shards",
        runs_at(("ddp", "ddp", {}), ("zero3", "zero3", {})),
        check_what_fsdp_shards,
        report_what_fsdp_shards,
    ),
    catalog_lab(
        "persistent-memory-scaling",
        scaling_runs,
        check_persistent_memory_scaling,
        report_persistent_memory_scaling,
    ),
    catalog_lab(
        "zero-stages-model-states",
        runs_at(("ddp", "ddp", {}), ("zero1", "zero1", {}), ("zero2", "zero2", {}), ("zero3", "zero3", {})),
        check_zero_stages,
        report_zero_stages,
    ),
    catalog_lab("adam-optimizer-state", runs_at(("ddp", "ddp", {})), check_adam_state, report_adam_state),
    catalog_lab(
        "stage1-optimizer-only",
        runs_at(("ddp", "ddp", {}), ("zero1", "zero1", {})),
        check_stage1,
        report_stage1,
    ),
)
