"""Small server-side SVG bar charts: no JavaScript library, every label escaped."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import date

from markupsafe import Markup, escape

ZERO_STUB = 2  # px: the height a measured zero is drawn at


def number(value: float) -> str:
    """A count in full (`:g` alone keeps 6 digits: 1234567 would read 1.23457e+06), else `:g`."""
    return f"{value:.0f}" if float(value).is_integer() else f"{value:g}"


def bar_chart(
    points: Sequence[tuple[str, float | None]],
    *,
    title: str,
    value_label: Callable[[float], str] = number,
    max_value: float | None = None,
    width: int = 720,
    height: int = 220,
    label_every: int = 5,
) -> Markup:
    """An SVG bar chart of (label, value) points; each bar carries a tooltip with its value.
    A None value (nothing to measure that day) draws no bar; a zero, a 2px stub on the axis."""
    top_value = max_value if max_value is not None else max((v for _, v in points if v is not None), default=0)
    top_value = top_value or 1
    top_label = value_label(top_value)
    # Room for the top tick (10px digits are about 6px wide): a 7-digit count fits instead of being cut off.
    left, right, top, bottom = max(40, 8 + 6 * len(top_label)), 10, 28, 36
    plot_w, plot_h = width - left - right, height - top - bottom
    slot = plot_w / max(len(points), 1)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {width} {height}" '
        f'role="img" aria-label="{escape(title)}">',
        f'<title>{escape(title)}</title>',
        f'<text x="{left}" y="18" class="chart-title">{escape(title)}</text>',
        f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" class="axis"/>',
        f'<text x="{left - 6}" y="{top + 4}" class="tick" text-anchor="end">{escape(top_label)}</text>',
        f'<text x="{left - 6}" y="{top + plot_h}" class="tick" text-anchor="end">0</text>',
    ]
    for i, (label, value) in enumerate(points):
        x = left + i * slot + slot * 0.1
        if value is not None:
            # A measured zero (0% right that day) gets a stub on the axis, so it does not read as no data.
            bar_h = plot_h * value / top_value if value > 0 else ZERO_STUB
            parts.append(
                f'<rect x="{x:.1f}" y="{top + plot_h - bar_h:.1f}" width="{slot * 0.8:.1f}" height="{bar_h:.1f}" '
                f'class="bar{"" if value > 0 else " zero"}"><title>{escape(label)}: {escape(value_label(value))}</title></rect>'
            )
        if i % label_every == 0:
            parts.append(
                f'<text x="{x + slot * 0.4:.1f}" y="{top + plot_h + 16}" class="tick" text-anchor="middle">{escape(label)}</text>'
            )
    parts.append("</svg>")
    return Markup("".join(parts))


def calendar_chart(weeks: Sequence[Sequence[tuple[date, int] | None]], *, title: str, cell: int = 12) -> Markup:
    """A year of study days as a heat map: one column per week (Monday on top), shaded by
    reviews in quarters of the busiest day; each day carries a tooltip with its count."""
    from studyapp.stats import calendar_level  # the shading rule, tested on its own

    left, top = 28, 30
    busiest = max((day[1] for week in weeks for day in week if day), default=0)
    width, height = left + len(weeks) * (cell + 2) + 10, top + 7 * (cell + 2) + 10
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart calendar" viewBox="0 0 {width} {height}" '
        f'role="img" aria-label="{escape(title)}">',
        f"<title>{escape(title)}</title>",
        f'<text x="{left}" y="18" class="chart-title">{escape(title)}</text>',
    ]
    for row, name in ((0, "Mon"), (2, "Wed"), (4, "Fri")):
        parts.append(f'<text x="{left - 4}" y="{top + row * (cell + 2) + cell - 2}" class="tick" text-anchor="end">{name}</text>')
    for w, week in enumerate(weeks):
        for d, day in enumerate(week):
            if day is None:
                continue
            when, count = day
            parts.append(
                f'<rect x="{left + w * (cell + 2)}" y="{top + d * (cell + 2)}" width="{cell}" height="{cell}" rx="2" '
                f'class="cal-{calendar_level(count, busiest)}"><title>{when.isoformat()}: {count} review{"" if count == 1 else "s"}'
                "</title></rect>"
            )
    parts.append("</svg>")
    return Markup("".join(parts))  # noqa: S704 - every text above is escaped or a number
