"""Labs about communication: which collectives run when, for which block, moving how many bytes.

The evidence is the engine's ordered timeline of collectives and module forward/backward starts and
ends. On CPU with gloo, collectives run synchronously, so order is what can be shown: what was issued
before what. True overlap of communication with computation needs a GPU and the profiler's trace.

Volumes follow the ZeRO paper's accounting: an all-reduce moves its buffer twice (reduce-scatter plus
all-gather), every other collective once; Ψ is the model's fp32 parameter bytes.
"""

from __future__ import annotations

from sharding_lab.analytic import COMMUNICATION_MULTIPLE
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
    near,
    percent,
    runs_at,
)
from sharding_lab.svg import human_bytes

# "About" a multiple of Ψ: padding of uneven dims and DDP's bucketing may add a few bytes.
VOLUME_TOLERANCE = 0.02
# FSDP moves 1.5x DDP in the paper; the root unit, kept gathered for backward, is not all-gathered
# again, so a small model whose embeddings are a big share of Ψ measures a little less.
TRADEOFF_RANGE = (1.25, 1.5 * (1 + VOLUME_TOLERANCE))


def _issued_before(first: read.Event | None, second: read.Event | None) -> bool:
    """Whether both events happened and `first` came before `second` in the timeline."""
    return first is not None and second is not None and first.position < second.position


# --- allgather-before-layer ------------------------------------------------------------------------------


def _gathered_just_before(events: list[read.Event], gather: read.Event | None, block: int) -> bool:
    """Whether `gather` came before block `block` started, with no other block starting or ending between."""
    start = read.module_event(events, block, "forward", "start")
    if not _issued_before(gather, start):
        return False
    between = events[gather.position + 1 : start.position]
    return not any(e.kind != "collective" and read.block_index(e.module) is not None for e in between)


def check_allgather_before_layer(ms: Measurements) -> Verdict:
    m = ms["zero3"]
    events = read.timeline(m)
    gathers = read.block_collectives(events, "all_gather", "forward")
    blocks = range(read.n_blocks(m))
    c = Conditions()
    c.require(
        all(len(gathers.get(i, [])) == 1 for i in blocks),
        f"one forward all-gather per block ({[len(gathers.get(i, [])) for i in blocks]})",
    )
    just_before = [_gathered_just_before(events, gathers.get(i, [None])[0], i) for i in blocks]
    c.require(
        all(just_before), f"each block's all-gather comes just before its forward starts ({just_before})"
    )
    sizes = {e.bytes for i in blocks for e in gathers.get(i, [])}
    c.require(len(sizes) == 1, f"every block gathers the same full bytes ({sorted(sizes)})")
    forward_total = sum(int(x["bytes"]) for x in read.collectives(m, op="all_gather", phase="forward"))
    full = read.padded_full_bytes(m, "params")  # an all-gather moves FSDP's padding too
    c.require(
        forward_total == full,
        f"forward all-gathers add up to the full parameters ({forward_total:,} of {full:,} B)",
    )
    return c.verdict()


def report_allgather_before_layer(ms: Measurements) -> Report:
    m = ms["zero3"]
    events = read.timeline(m)
    gathers = read.block_collectives(events, "all_gather", "forward")
    root, block = read.root_and_block_bytes(m)
    n = read.world_size(m)
    full, padded = read.full_bytes(m, "params"), read.padded_full_bytes(m, "params")
    padding = f" ({human_bytes(padded)} with FSDP's padding)" if padded > full else ""
    finding = (
        f"In forward, each of the {read.n_blocks(m)} blocks was preceded by one all-gather of {human_bytes(block)} "
        f"({block:,} B, its full fp32 parameters; each rank contributed {human_bytes(block // n)}), issued right "
        f"before the block started; with the root's {human_bytes(root)} they add up to the model's "
        f"{human_bytes(full)}{padding}. (Prefetching off here; with it, each gather moves one block earlier.)"
    )
    rows = []
    for i in range(read.n_blocks(m)):
        gather = gathers.get(i, [None])[0]
        start = read.module_event(events, i, "forward", "start")
        rows.append(
            (
                f"block {i}",
                gather.position if gather else None,
                start.position if start else None,
                gather.bytes if gather else 0,
            )
        )
    return Report(
        finding,
        Table(("block", "all-gather at event", "forward starts at event", "all-gather bytes"), tuple(rows)),
        {"timeline": charts.timeline_chart(f"FSDP step, collectives by phase (N={n}, no prefetch)", m)},
    )


# --- prefetch-overlap -------------------------------------------------------------------------------------


def prefetched_blocks(m: dict, phase: str) -> list[bool]:
    """For each block that has a successor in `phase`, whether the successor's all-gather was issued
    before this block's compute ended. Forward runs blocks 0..n-1, backward n-1..0."""
    events = read.timeline(m)
    gathers = read.block_collectives(events, "all_gather", phase)
    order = list(range(read.n_blocks(m)))
    if phase == "backward":
        order.reverse()
    result = []
    for current, successor in zip(order, order[1:], strict=False):
        end = read.module_event(events, current, phase, "end")
        result.append(any(_issued_before(g, end) for g in gathers.get(successor, [])))
    return result


PREFETCH_ON, PREFETCH_OFF = "prefetch", "no prefetch"


def _overlap_text(on: dict, off: dict) -> str:
    """What timing can show: the profiler's overlap on CUDA; on CPU nothing, so no (noisy) step times
    go into the finding, which stays the same from run to run."""
    if on.get("overlap") and off.get("overlap"):

        def share(m: dict) -> str:
            return percent(m["overlap"]["overlapped_fraction_of_comm"])

        return (
            f" On {on['config'].get('device')}, the profiler saw {share(on)} of NCCL kernel time overlap compute "
            f"with prefetching and {share(off)} without."
        )
    return (
        " On CPU each gloo collective blocks the rank's one thread, so nothing overlaps and the step times (in the "
        "table) are noise: the order is the evidence. On a GPU the all-gather runs on its own stream while the "
        "block computes, and the profiler shows the overlap."
    )


def check_prefetch_overlap(ms: Measurements) -> Verdict:
    on, off = ms[PREFETCH_ON], ms[PREFETCH_OFF]
    c = Conditions()
    for phase in ("forward", "backward"):
        with_prefetch, without = prefetched_blocks(on, phase), prefetched_blocks(off, phase)
        c.require(
            bool(with_prefetch) and all(with_prefetch),
            f"{phase}, prefetch: the next block's all-gather issued before the current block ends ({with_prefetch})",
        )
        c.require(
            not any(without),
            f"{phase}, no prefetch: each all-gather waits for the previous block to end ({without})",
        )
    return c.verdict()


def report_prefetch_overlap(ms: Measurements) -> Report:
    on, off = ms[PREFETCH_ON], ms[PREFETCH_OFF]
    n_blocks = read.n_blocks(on)

    def counted(m: dict, phase: str) -> str:
        flags = prefetched_blocks(m, phase)
        return f"{sum(flags)} of {len(flags)}"

    finding = (
        f"With prefetching, the next block's all-gather was issued before the current block's compute ended for "
        f"{counted(on, 'forward')} block boundaries in forward and {counted(on, 'backward')} in backward; without it, "
        f"for {counted(off, 'forward')} and {counted(off, 'backward')}." + _overlap_text(on, off)
    )
    rows = []
    for key, m in ((PREFETCH_ON, on), (PREFETCH_OFF, off)):
        gathers = read.collectives(m, op="all_gather")
        rows.append(
            (
                key,
                counted(m, "forward"),
                counted(m, "backward"),
                round(m["step_time_s"], 4),
                len(gathers),
                sum(bool(g.get("prefetch")) for g in gathers),
            )
        )
    return Report(
        finding,
        Table(
            (
                "run",
                "forward boundaries prefetched",
                "backward boundaries prefetched",
                "step time s",
                "all-gathers per step",
                "issued ahead by another unit",
            ),
            tuple(rows),
        ),
        {
            "timeline_prefetch": charts.timeline_chart(f"With prefetching ({n_blocks} blocks)", on),
            "timeline_no_prefetch": charts.timeline_chart(f"Without prefetching ({n_blocks} blocks)", off),
        },
    )


# --- reduce-scatter-backward -----------------------------------------------------------------------------


def check_reduce_scatter_backward(ms: Measurements) -> Verdict:
    m = ms["zero3"]
    n = read.world_size(m)
    events = read.timeline(m)
    scatters = read.block_collectives(events, "reduce_scatter", "backward")
    forward_gathers = read.block_collectives(events, "all_gather", "forward")
    blocks = range(read.n_blocks(m))
    c = Conditions()
    c.require(
        all(len(scatters.get(i, [])) == 1 for i in blocks),
        f"one reduce-scatter per block in backward ({[len(scatters.get(i, [])) for i in blocks]})",
    )
    after_start = [
        _issued_before(read.module_event(events, i, "backward", "start"), scatters.get(i, [None])[0])
        for i in blocks
    ]
    c.require(
        all(after_start), f"each block's reduce-scatter follows the start of its backward ({after_start})"
    )
    same_size = [
        [e.bytes for e in scatters.get(i, [])] == [e.bytes for e in forward_gathers.get(i, [])]
        for i in blocks
    ]
    c.require(all(same_size), f"each reduce-scatter takes the block's full gradient bytes ({same_size})")
    total = sum(int(x["bytes"]) for x in read.collectives(m, op="reduce_scatter"))
    full = read.padded_full_bytes(m, "grads")
    c.require(total == full, f"reduce-scatters cover every gradient ({total:,} of {full:,} B)")
    c.require(
        read.sharded(m, "grads"),
        f"each rank keeps 1/{n} of the gradients ({' / '.join(percent(s) for s in read.shares(m, 'grads'))})",
    )
    return c.verdict()


def report_reduce_scatter_backward(ms: Measurements) -> Report:
    m = ms["zero3"]
    n = read.world_size(m)
    events = read.timeline(m)
    scatters = read.block_collectives(events, "reduce_scatter", "backward")
    _, block = read.root_and_block_bytes(m)
    total = sum(int(x["bytes"]) for x in read.collectives(m, op="reduce_scatter"))
    finding = (
        f"In backward, each of the {read.n_blocks(m)} blocks issued one reduce-scatter of its {human_bytes(block)} of "
        f"gradients once its backward had run ({len(read.collectives(m, op='reduce_scatter'))} in all with the root, "
        f"{human_bytes(total)}); each rank kept {human_bytes(read.part_bytes(m, 'grads')[0])}, "
        f"{percent(read.shares(m, 'grads')[0])} of the gradients (1/{n})."
    )
    rows = []
    for i in reversed(range(read.n_blocks(m))):
        scatter = scatters.get(i, [None])[0]
        start = read.module_event(events, i, "backward", "start")
        rows.append(
            (
                f"block {i}",
                start.position if start else None,
                scatter.position if scatter else None,
                scatter.bytes if scatter else 0,
                scatter.bytes // n if scatter else 0,
            )
        )
    return Report(
        finding,
        Table(
            (
                "block",
                "backward starts at event",
                "reduce-scatter at event",
                "bytes in",
                "bytes kept per rank",
            ),
            tuple(rows),
        ),
        {"timeline": charts.timeline_chart(f"FSDP step, collectives by phase (N={n})", m)},
    )


# --- memory-communication-tradeoff ---------------------------------------------------------------------------


def check_tradeoff(ms: Measurements) -> Verdict:
    ddp, fsdp = ms["ddp"], ms["zero3"]
    c = Conditions()
    memory_ratio = max(read.model_states_bytes(fsdp)) / max(read.model_states_bytes(ddp))
    c.require(memory_ratio < 1, f"FSDP holds less per rank ({memory_ratio:.3f} of DDP's model states)")
    ratio = read.volume_in_params(fsdp) / read.volume_in_params(ddp) if read.volume_in_params(ddp) else 0.0
    low, high = TRADEOFF_RANGE
    c.require(low <= ratio <= high, f"FSDP moves about 1.5x DDP's bytes per step ({ratio:.3f}x)")
    gathers = len(read.collectives(fsdp, op="all_gather"))
    c.require(
        gathers > 0 and not read.collectives(ddp, op="all_gather"),
        f"FSDP all-gathers ({gathers} per step), DDP never",
    )
    return c.verdict()


def report_tradeoff(ms: Measurements) -> Report:
    ddp, fsdp = ms["ddp"], ms["zero3"]
    n = read.world_size(fsdp)
    ratio = read.volume_in_params(fsdp) / read.volume_in_params(ddp)
    gathers = read.collectives(fsdp, op="all_gather")
    root, _ = read.root_and_block_bytes(fsdp)
    finding = (
        f"At N={n}, FSDP holds {human_bytes(read.model_states_bytes(fsdp)[0])} of model states per rank against DDP's "
        f"{human_bytes(read.model_states_bytes(ddp)[0])} (peak {human_bytes(read.ranks(fsdp)[0]['peak_bytes'])} against "
        f"{human_bytes(read.ranks(ddp)[0]['peak_bytes'])}), but moves {ratio:.2f}x DDP's bytes per step: "
        f"{read.volume_in_params(fsdp):.2f}Ψ against {read.volume_in_params(ddp):.2f}Ψ (paper: 3Ψ against 2Ψ, 1.5x; "
        f"the root's {percent(root / read.full_bytes(fsdp, 'params'))} of Ψ stays gathered for backward and is not "
        f"re-gathered), with {len(gathers)} all-gathers ({human_bytes(sum(int(g['bytes']) for g in gathers))}) per "
        f"step that DDP never needs."
    )
    return Report(
        finding,
        _volume_table(ms, ["ddp", "zero3"]),
        {
            "model_states": charts.model_states_chart(
                f"Model states per rank (rank 0, N={n})", ms, ["ddp", "zero3"]
            ),
            "bytes_by_collective": charts.volume_by_op_chart(
                f"Bytes moved per step, paper accounting: all-reduce counts twice (N={n})",
                ms,
                ["ddp", "zero3"],
            ),
        },
    )


def _volume_table(ms: Measurements, keys: list[str]) -> Table:
    rows = []
    for key in keys:
        m = ms[key]
        totals = read.totals_by_op(m)
        ops = ", ".join(f"{op} x{entry['count']}" for op, entry in sorted(totals.items()))
        rows.append(
            (
                key,
                ops,
                sum(e["bytes"] for e in totals.values()),
                sum(e["wire_bytes_derived"] for e in totals.values()),
                round(read.volume_in_params(m), 3),
                COMMUNICATION_MULTIPLE[read.strategy(m)],
                max(read.model_states_bytes(m)),
            )
        )
    return Table(
        (
            "strategy",
            "collectives per step",
            "logical bytes",
            "wire bytes (derived, ring)",
            "measured volume (xΨ)",
            "paper volume (xΨ)",
            "model states bytes per rank",
        ),
        tuple(rows),
    )


# --- communication-volume -------------------------------------------------------------------------------------


def check_communication_volume(ms: Measurements) -> Verdict:
    volume = {key: read.volume_in_params(ms[key]) for key in ("ddp", "zero1", "zero2", "zero3")}
    c = Conditions()
    for key in ("ddp", "zero2"):
        c.require(
            near(volume[key], 2, VOLUME_TOLERANCE), f"{key} moves about 2Ψ per step ({volume[key]:.3f}Ψ)"
        )
    c.require(
        near(volume["zero1"], 3, VOLUME_TOLERANCE) and bool(read.collectives(ms["zero1"], op="broadcast")),
        f"zero1 (PyTorch) all-reduces 2Ψ and broadcasts Ψ ({volume['zero1']:.3f}Ψ)",
    )
    c.require(
        volume["ddp"] * TRADEOFF_RANGE[0] <= volume["zero3"] <= 3 * (1 + VOLUME_TOLERANCE),
        f"zero3 moves about 3Ψ per step ({volume['zero3']:.3f}Ψ)",
    )
    return c.verdict()


def report_communication_volume(ms: Measurements) -> Report:
    keys = ["ddp", "zero1", "zero2", "zero3"]
    n = read.world_size(ms["zero3"])
    volume = {key: read.volume_in_params(ms[key]) for key in keys}
    root, _ = read.root_and_block_bytes(ms["zero3"])
    finding = (
        f"Per step and rank at N={n}, counting an all-reduce twice as the paper does: ddp {volume['ddp']:.2f}Ψ, "
        f"zero2 {volume['zero2']:.2f}Ψ, zero3 {volume['zero3']:.2f}Ψ (paper 2Ψ, 2Ψ, 3Ψ; zero3 skips re-gathering "
        f"the root, {percent(root / read.full_bytes(ms['zero3'], 'params'))} of Ψ). PyTorch's zero1 moves "
        f"{volume['zero1']:.2f}Ψ: DDP's all-reduce (2Ψ) plus a broadcast of the updated parameters (Ψ), where the "
        f"paper's stage 1 reduce-scatters and all-gathers (2Ψ)."
    )
    return Report(
        finding,
        _volume_table(ms, keys),
        {
            "bytes_by_collective": charts.volume_by_op_chart(
                f"Bytes moved per step, paper accounting: all-reduce counts twice (N={n})", ms, keys
            )
        },
    )


COMM_LABS: tuple[Lab, ...] = (
    catalog_lab(
        "allgather-before-layer",
        runs_at(("zero3", "zero3", {"prefetch": False})),
        check_allgather_before_layer,
        report_allgather_before_layer,
    ),
    catalog_lab(
        "prefetch-overlap",
        runs_at((PREFETCH_ON, "zero3", {}), (PREFETCH_OFF, "zero3", {"prefetch": False})),
        check_prefetch_overlap,
        report_prefetch_overlap,
    ),
    catalog_lab(
        "reduce-scatter-backward",
        runs_at(("zero3", "zero3", {})),
        check_reduce_scatter_backward,
        report_reduce_scatter_backward,
    ),
    catalog_lab(
        "memory-communication-tradeoff",
        runs_at(("ddp", "ddp", {}), ("zero3", "zero3", {})),
        check_tradeoff,
        report_tradeoff,
    ),
    catalog_lab(
        "communication-volume",
        runs_at(("ddp", "ddp", {}), ("zero1", "zero1", {}), ("zero2", "zero2", {}), ("zero3", "zero3", {})),
        check_communication_volume,
        report_communication_volume,
    ),
)
