"""Small server-side SVG bar charts: no JavaScript library, every label escaped."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from markupsafe import Markup, escape


def bar_chart(
    points: Sequence[tuple[str, float | None]],
    *,
    title: str,
    value_label: Callable[[float], str] = lambda v: f"{v:g}",
    max_value: float | None = None,
    width: int = 720,
    height: int = 220,
    label_every: int = 5,
) -> Markup:
    """An SVG bar chart of (label, value) points; each bar carries a tooltip with its value.
    A None value (nothing to measure that day) draws no bar."""
    left, right, top, bottom = 40, 10, 28, 36
    plot_w, plot_h = width - left - right, height - top - bottom
    top_value = max_value if max_value is not None else max((v for _, v in points if v is not None), default=0)
    top_value = top_value or 1
    slot = plot_w / max(len(points), 1)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {width} {height}" '
        f'role="img" aria-label="{escape(title)}">',
        f'<title>{escape(title)}</title>',
        f'<text x="{left}" y="18" class="chart-title">{escape(title)}</text>',
        f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" class="axis"/>',
        f'<text x="{left - 6}" y="{top + 4}" class="tick" text-anchor="end">{escape(value_label(top_value))}</text>',
        f'<text x="{left - 6}" y="{top + plot_h}" class="tick" text-anchor="end">0</text>',
    ]
    for i, (label, value) in enumerate(points):
        x = left + i * slot + slot * 0.1
        if value is not None:
            bar_h = plot_h * max(value, 0) / top_value
            parts.append(
                f'<rect x="{x:.1f}" y="{top + plot_h - bar_h:.1f}" width="{slot * 0.8:.1f}" height="{bar_h:.1f}" class="bar">'
                f"<title>{escape(label)}: {escape(value_label(value))}</title></rect>"
            )
        if i % label_every == 0:
            parts.append(
                f'<text x="{x + slot * 0.4:.1f}" y="{top + plot_h + 16}" class="tick" text-anchor="middle">{escape(label)}</text>'
            )
    parts.append("</svg>")
    return Markup("".join(parts))
