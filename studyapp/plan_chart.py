"""The "Will it fit?" chart: one stacked bar per strategy (categories stacked) against the GPU's memory.

Server-side SVG like studyapp.charts (theme-aware classes `chart`, `axis`, `tick`, `chart-title`; every
text escaped), with sharding_lab.svg's colour-blind-safe palette and its one byte formatter for
tooltips. Only the elements and attributes studyapp.safe_svg allows, so a stored copy would pass it too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from markupsafe import Markup, escape

from sharding_lab.svg import PALETTE
from sharding_lab.units import decimal_bytes, human_bytes

# Okabe-Ito without its yellow (too pale on white for a thin segment), in the planner's category order.
COLOURS: tuple[str, ...] = tuple(c for c in PALETTE if c != "#F0E442")
OFF_CHART = 2.5  # bars past this many times the GPU's memory are cut at the top and marked ▲
WIDTH, HEIGHT = 720, 330
LEFT, RIGHT, TOP, PLOT_H = 70, 12, 40, 200


@dataclass(frozen=True)
class ChartBar:
    label: str  # under the bar, e.g. "zero3" or "zero3 sim"
    parts: Mapping[str, int]  # category -> bytes
    method: str = "analytic"  # or "simulated": drawn with a dashed outline

    @property
    def total(self) -> int:
        return sum(self.parts.values())


def gigabytes(value: float) -> str:
    """Decimal units, as GPU memory is sold, in three figures for a label: 80e9 -> '80 GB'."""
    return decimal_bytes(value, figures=3)


def memory_chart(
    bars: Sequence[ChartBar], categories: Sequence[str], *, gpu_bytes: int, usable_bytes: int, title: str
) -> Markup:
    """Stacked bars (bottom up in `categories` order) with a solid line at `gpu_bytes` and a dashed one at
    `usable_bytes` (GPU memory less the headroom). The y axis runs to the tallest bar or the GPU line,
    whichever is higher, but no further than OFF_CHART times the GPU: taller bars are cut there."""
    colour = {name: COLOURS[i % len(COLOURS)] for i, name in enumerate(categories)}
    category_label = {name: name.replace("_", " ") for name in categories}
    tallest = max((bar.total for bar in bars), default=0)
    top_value = max(min(tallest, OFF_CHART * gpu_bytes), gpu_bytes) * 1.08 or 1
    plot_w = WIDTH - LEFT - RIGHT
    base = TOP + PLOT_H

    def y(value: float) -> float:
        return base - PLOT_H * min(value, top_value) / top_value

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart plan-chart" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'role="img" aria-label="{escape(title)}">',
        f"<title>{escape(title)}</title>",
        f'<text x="{LEFT}" y="18" class="chart-title">{escape(title)}</text>',
        f'<line x1="{LEFT}" y1="{base}" x2="{LEFT + plot_w}" y2="{base}" class="axis"/>',
        f'<text x="{LEFT - 6}" y="{base}" class="tick" text-anchor="end">0</text>',
    ]
    slot = plot_w / max(len(bars), 1)
    bar_w = min(slot * 0.6, 90)
    for i, bar in enumerate(bars):
        x = LEFT + i * slot + (slot - bar_w) / 2
        level = 0
        dashed = ' stroke="currentColor" stroke-dasharray="4 3" stroke-width="1"' if bar.method == "simulated" else ""
        for name in categories:
            value = bar.parts.get(name, 0)
            if value <= 0 or level >= top_value:
                level += max(value, 0)
                continue
            y_top, y_bottom = y(level + value), y(level)
            parts.append(
                f'<rect x="{x:.1f}" y="{y_top:.1f}" width="{bar_w:.1f}" height="{max(y_bottom - y_top, 0.5):.1f}" '
                f'fill="{colour[name]}"{dashed}><title>{escape(bar.label)} ({bar.method}): {escape(category_label[name])} '
                f"{escape(gigabytes(value))} ({escape(human_bytes(value))})</title></rect>"
            )
            level += value
        cut = bar.total > top_value
        parts.append(
            f'<text x="{x + bar_w / 2:.1f}" y="{max(y(bar.total) - 5, TOP - 4):.1f}" class="tick" text-anchor="middle">'
            f"{'▲ ' if cut else ''}{escape(gigabytes(bar.total))}</text>"
        )
        parts.append(
            f'<text x="{x + bar_w / 2:.1f}" y="{base + 15}" class="tick" text-anchor="middle">{escape(bar.label)}</text>'
        )
    for value, label, dash in (
        (gpu_bytes, f"GPU memory {gigabytes(gpu_bytes)}", ""),
        (usable_bytes, f"usable {gigabytes(usable_bytes)} (less the headroom)", ' stroke-dasharray="6 4"'),
    ):
        parts.append(
            f'<line x1="{LEFT}" y1="{y(value):.1f}" x2="{LEFT + plot_w}" y2="{y(value):.1f}" class="axis gpu-line" '
            f'stroke-width="2"{dash}><title>{escape(label)}</title></line>'
        )
    parts.append(f'<text x="{LEFT - 6}" y="{y(gpu_bytes) + 4:.1f}" class="tick" text-anchor="end">'
                 f"{escape(gigabytes(gpu_bytes))}</text>")
    parts.append(f'<text x="{LEFT + plot_w}" y="{y(gpu_bytes) - 4:.1f}" class="tick" text-anchor="end">'
                 f"GPU memory; dashed: usable (headroom kept free)</text>")
    shown = [name for name in categories if any(bar.parts.get(name, 0) > 0 for bar in bars)]
    legend_top = base + 32
    for i, name in enumerate(shown):
        lx, ly = LEFT + (i % 4) * 160, legend_top + (i // 4) * 20
        parts.append(f'<rect x="{lx}" y="{ly}" width="12" height="12" fill="{colour[name]}"/>')
        parts.append(f'<text x="{lx + 17}" y="{ly + 10}" class="tick">{escape(category_label[name])}</text>')
    if any(bar.method == "simulated" for bar in bars):
        ly = legend_top + ((len(shown) + 3) // 4) * 20
        parts.append(f'<text x="{LEFT}" y="{ly + 10}" class="tick">“sim”: the FSDP2 simulation, dashed outline; '
                     "the others analytic</text>")
    parts.append("</svg>")
    return Markup("".join(parts))  # noqa: S704 - every text above is escaped or a number
