"""Charts built from measurements: memory by category per run, bytes by collective, the timeline.

Turns engine measurements into the plain shapes `sharding_lab.svg` draws; no torch.
"""

from __future__ import annotations

from collections.abc import Sequence

from sharding_lab import svg
from sharding_lab.measurement import PARTS, Measurement, Measurements, block_index, paper_units
from sharding_lab.units import human_bytes

MEMORY_COLOURS = {
    "params": "#0072B2",
    "grads": "#E69F00",
    "optimizer": "#009E73",
    "activations": "#CC79A7",
    "temporaries": "#999999",
    "all_gather_buffers": "#56B4E9",
    "reduce_scatter_buffers": "#D55E00",
}
OP_COLOURS = {
    "all_gather": "#56B4E9",
    "reduce_scatter": "#D55E00",
    "all_reduce": "#CC79A7",
    "broadcast": "#F0E442",
    "forward": "#0072B2",
    "backward": "#E69F00",
}


def model_states_chart(
    title: str, measurements: Measurements, keys: Sequence[str], *, every_rank: bool = False
) -> str:
    """Parameter, gradient and optimizer bytes held between steps, a stacked bar per run (rank 0's),
    or per run and rank with `every_rank` (to show how a state is split across ranks)."""
    bars = []
    for key in keys:
        m = measurements[key]
        for rank in range(len(m.ranks) if every_rank else 1):
            label = f"{key}, rank {rank}" if every_rank else key
            bars.append(svg.Bar(label, {part: m.part_bytes(part)[rank] for part in PARTS}))
    return svg.stacked_bar_chart(title, bars, PARTS, colours=MEMORY_COLOURS)


def memory_categories_chart(
    title: str, measurements: Measurements, keys: Sequence[str], rank: int = 0
) -> str:
    """Memory by category as the engine's tracker attributed it (at the rank's peak), a bar per run."""
    names = list(MEMORY_COLOURS)
    for key in keys:
        names += [name for name in measurements[key].categories(rank) if name not in names]
    bars = [svg.Bar(key, measurements[key].categories(rank)) for key in keys]
    return svg.stacked_bar_chart(title, bars, names, colours=MEMORY_COLOURS)


def volume_by_op_chart(title: str, measurements: Measurements, keys: Sequence[str]) -> str:
    """Bytes moved per step by each collective in the ZeRO paper's accounting (an all-reduce counts
    twice: a reduce-scatter plus an all-gather), a stacked bar per run."""
    ops = ["all_reduce", "broadcast", "all_gather", "reduce_scatter"]
    bars = []
    for key in keys:
        totals = measurements[key].totals_by_op()
        ops += [op for op in totals if op not in ops]
        bars.append(svg.Bar(key, {op: paper_units(op) * entry.bytes for op, entry in totals.items()}))
    return svg.stacked_bar_chart(title, bars, ops, colours=OP_COLOURS)


def timeline_chart(title: str, m: Measurement) -> str:
    """Each FSDP unit as a lane: its forward/backward compute as bars, its collectives as diamonds,
    in the order they were issued, with the forward/backward/optimizer phases shaded."""
    events = m.timeline()
    lanes: list[str] = []
    for event in events:
        if event.module and event.module not in lanes:
            lanes.append(event.module)
    lanes.sort(key=lambda name: (block_index(name) is not None, block_index(name) or 0))
    chart = svg.Timeline(lanes=lanes, length=len(events))

    open_spans: dict[tuple[str, str], int] = {}
    for event in events:
        if event.kind == "start":
            open_spans[(event.module, event.phase)] = event.position
        elif event.kind == "end" and (event.module, event.phase) in open_spans:
            start = open_spans.pop((event.module, event.phase))
            chart.spans.append(svg.Span(event.module, start, event.position, event.phase))
        elif event.kind == "collective" and event.module:
            note = f"{event.op} {human_bytes(event.bytes)} ({event.phase}, {event.module})"
            chart.markers.append(svg.Marker(event.module, event.position, event.op, note))

    # Contiguous runs of one phase become the shaded bands.
    for event in events:
        if chart.bands and chart.bands[-1].label == event.phase:
            chart.bands[-1] = svg.Band(chart.bands[-1].start, event.position, event.phase)
        elif event.phase:
            chart.bands.append(svg.Band(event.position, event.position, event.phase))
    return svg.timeline_chart(title, chart, colours=OP_COLOURS)
