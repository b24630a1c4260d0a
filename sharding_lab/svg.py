"""Self-contained SVG charts for lab reports: stacked bars and an ordered event timeline.

Pure Python, no torch and no external assets, so the web app can embed a stored chart as is. Every
piece of text is escaped; sizes are in SVG user units and the viewBox lets the page scale them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from html import escape

from sharding_lab.units import human_bytes

# Colour-blind-safe (Okabe-Ito) colours, reused in order for categories without a fixed colour.
PALETTE: tuple[str, ...] = (
    "#0072B2",
    "#E69F00",
    "#009E73",
    "#CC79A7",
    "#56B4E9",
    "#D55E00",
    "#F0E442",
    "#999999",
)
FONT = "font-family='system-ui, sans-serif'"


def _text_width(content: str, size: int = 12) -> int:
    """A generous estimate of rendered width: sans-serif glyphs average about 0.6 em."""
    return int(len(content) * size * 0.6) + 1


def _text(x: float, y: float, content: str, *, size: int = 12, anchor: str = "start", extra: str = "") -> str:
    return (
        f"<text x='{x:.1f}' y='{y:.1f}' font-size='{size}' text-anchor='{anchor}' {FONT} {extra}>"
        f"{escape(content)}</text>"
    )


def _svg(width: float, height: float, title: str, body: list[str]) -> str:
    return (
        f"<svg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 {width:.0f} {height:.0f}' "
        f"width='{width:.0f}' height='{height:.0f}' role='img' aria-label='{escape(title, quote=True)}'>"
        f"<title>{escape(title)}</title><rect width='100%' height='100%' fill='white'/>"
        + "".join(body)
        + "</svg>"
    )


def _colours(names: Sequence[str], fixed: dict[str, str] | None) -> dict[str, str]:
    fixed = fixed or {}
    spare = iter(c for c in PALETTE if c not in fixed.values())
    return {name: fixed.get(name) or next(spare, "#777777") for name in names}


@dataclass(frozen=True)
class Bar:
    label: str  # what the bar is, e.g. "ddp" or "zero3, N=4"
    parts: dict[str, float]  # category -> value; missing categories count as 0


def stacked_bar_chart(
    title: str,
    bars: Sequence[Bar],
    categories: Sequence[str],
    *,
    colours: dict[str, str] | None = None,
    format_value: Callable[[float], str] = human_bytes,
) -> str:
    """Horizontal bars, one per `bars` entry, each split into `categories` (in that order) with a legend
    of the categories that occur."""
    categories = [c for c in categories if any(bar.parts.get(c, 0) > 0 for bar in bars)] or list(categories)
    colour = _colours(categories, colours)
    label_width = max(90, _text_width(max((bar.label for bar in bars), key=len, default="")) + 16)
    plot_width, bar_height, gap = 440, 22, 10
    total_width = label_width + plot_width + 110
    top = 34
    legend_top = top + len(bars) * (bar_height + gap) + 8
    height = legend_top + 22 * ((len(categories) + 2) // 3) + 8
    largest = max((sum(bar.parts.get(c, 0) for c in categories) for bar in bars), default=0) or 1
    scale = plot_width / largest

    body = [_text(10, 20, title, size=14, extra="font-weight='bold'")]
    for index, bar in enumerate(bars):
        y = top + index * (bar_height + gap)
        body.append(_text(label_width - 8, y + bar_height * 0.7, bar.label, anchor="end"))
        x = float(label_width)
        for category in categories:
            value = bar.parts.get(category, 0)
            if value <= 0:
                continue
            width = value * scale
            body.append(
                f"<rect x='{x:.1f}' y='{y}' width='{max(width, 0.5):.1f}' height='{bar_height}' "
                f"fill='{colour[category]}'><title>{escape(f'{bar.label}: {category} {format_value(value)}')}"
                f"</title></rect>"
            )
            x += width
        total = sum(bar.parts.get(c, 0) for c in categories)
        body.append(_text(x + 6, y + bar_height * 0.7, format_value(total), size=11))
    for index, category in enumerate(categories):
        x = 10 + (index % 3) * 230
        y = legend_top + (index // 3) * 22
        body.append(f"<rect x='{x}' y='{y}' width='12' height='12' fill='{colour[category]}'/>")
        body.append(_text(x + 18, y + 10, category, size=11))
    return _svg(total_width, height, title, body)


@dataclass(frozen=True)
class Span:
    lane: str  # the row it sits in, e.g. a module name
    start: int  # position in the ordered event sequence
    end: int
    kind: str  # "forward" or "backward": picks the colour


@dataclass(frozen=True)
class Marker:
    lane: str
    at: int  # position in the ordered event sequence
    kind: str  # the collective, e.g. "all_gather"
    note: str = ""  # tooltip, e.g. "all_gather 50.6 KiB, forward"


@dataclass(frozen=True)
class Band:
    start: int
    end: int
    label: str  # the phase, e.g. "forward"


@dataclass
class Timeline:
    lanes: list[str]  # top to bottom
    spans: list[Span] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)
    bands: list[Band] = field(default_factory=list)
    length: int = 0  # positions on the x axis


def timeline_chart(title: str, timeline: Timeline, *, colours: dict[str, str] | None = None) -> str:
    """Modules as lanes, compute as bars and collectives as diamonds, along the order events happened.

    The x axis is event order, not time: on CPU the order is the evidence (what was issued before what).
    """
    kinds = sorted({s.kind for s in timeline.spans} | {m.kind for m in timeline.markers})
    colour = _colours(kinds, colours)
    label_width = max(80, _text_width(max(timeline.lanes, key=len, default=""), 11) + 14)
    lane_height, top = 22, 48
    step = max(6.0, min(18.0, 620 / max(timeline.length, 1)))
    width = label_width + step * max(timeline.length, 1) + 20
    plot_bottom = top + lane_height * len(timeline.lanes)
    height = plot_bottom + 20 + 22 * ((len(kinds) + 3) // 4) + 8
    row = {lane: top + i * lane_height for i, lane in enumerate(timeline.lanes)}

    def x_of(position: float) -> float:
        return label_width + step * position

    body = [_text(10, 20, title, size=14, extra="font-weight='bold'")]
    for band in timeline.bands:
        shade = "#f2f2f2" if timeline.bands.index(band) % 2 == 0 else "#e6e6e6"
        body.append(
            f"<rect x='{x_of(band.start):.1f}' y='{top - 14}' width='{step * (band.end - band.start + 1):.1f}' "
            f"height='{plot_bottom - top + 14}' fill='{shade}'/>"
        )
        body.append(_text(x_of(band.start) + 2, top - 4, band.label, size=10))
    for lane, y in row.items():
        body.append(_text(label_width - 6, y + lane_height * 0.65, lane, size=11, anchor="end"))
    for span in timeline.spans:
        y = row[span.lane] + 4
        body.append(
            f"<rect x='{x_of(span.start):.1f}' y='{y}' width='{step * (span.end - span.start + 1):.1f}' "
            f"height='{lane_height - 8}' fill='{colour[span.kind]}' opacity='0.75'>"
            f"<title>{escape(f'{span.lane} {span.kind}')}</title></rect>"
        )
    for marker in timeline.markers:
        cx, cy, r = x_of(marker.at) + step / 2, row[marker.lane] + lane_height / 2, min(7.0, step / 2 + 1)
        points = f"{cx:.1f},{cy - r:.1f} {cx + r:.1f},{cy:.1f} {cx:.1f},{cy + r:.1f} {cx - r:.1f},{cy:.1f}"
        body.append(
            f"<polygon points='{points}' fill='{colour[marker.kind]}' stroke='black' stroke-width='0.5'>"
            f"<title>{escape(marker.note or marker.kind)}</title></polygon>"
        )
    body.append(_text(label_width, plot_bottom + 14, "event order →", size=10))
    for index, kind in enumerate(kinds):
        x = 10 + (index % 4) * 170
        y = plot_bottom + 22 + (index // 4) * 22
        body.append(f"<rect x='{x}' y='{y}' width='12' height='12' fill='{colour[kind]}'/>")
        body.append(_text(x + 18, y + 10, kind, size=11))
    return _svg(width, height, title, body)
