"""Inline a lab's stored SVG chart: rebuilt from an allowlist, never passed through as is.

The charts come from our own `sharding_lab.svg`, which escapes every text at generation time. A
stored run is still data from outside this process (a database row, a child's stdout), so the page
never trusts the string: it is parsed as XML and written out again with only the elements and
attributes those charts use, every text and attribute value escaped. Anything else (a script, an
event handler, a link, a DOCTYPE) means the chart is not shown.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from html import escape

from markupsafe import Markup

ELEMENTS = frozenset({"svg", "g", "title", "desc", "rect", "text", "tspan", "line", "polyline", "polygon", "path", "circle"})
ATTRIBUTES = frozenset({
    "viewBox", "width", "height", "role", "aria-label", "x", "y", "x1", "x2", "y1", "y2", "dx", "dy",
    "cx", "cy", "r", "rx", "ry", "points", "d", "fill", "fill-opacity", "stroke", "stroke-width",
    "stroke-dasharray", "opacity", "font-size", "font-family", "font-weight", "text-anchor",
    "dominant-baseline", "transform", "class",
})
MAX_CHARS = 500_000  # our charts are a few kB; a huge string is not one of them


class UnsafeSvg(ValueError):
    pass


def _local(name: str) -> str:
    return name.rsplit("}", 1)[-1]  # "{http://www.w3.org/2000/svg}rect" -> "rect"


def _write(element: ET.Element, out: list[str]) -> None:
    tag = _local(element.tag)
    if tag not in ELEMENTS:
        raise UnsafeSvg(f"element <{tag[:40]}> is not allowed")
    attributes = []
    for name, value in element.attrib.items():
        name = _local(name)
        if name not in ATTRIBUTES:
            raise UnsafeSvg(f"attribute {name[:40]!r} on <{tag}> is not allowed")
        if "url(" in value.lower() or "javascript:" in value.lower():
            raise UnsafeSvg(f"attribute {name!r} refers elsewhere")
        attributes.append(f' {name}="{escape(value, quote=True)}"')
    out.append(f"<{tag}{''.join(attributes)}>")
    out.append(escape(element.text or "", quote=False))
    for child in element:
        _write(child, out)
        out.append(escape(child.tail or "", quote=False))
    out.append(f"</{tag}>")


def clean_svg(svg: str) -> Markup:
    """The chart as markup safe to inline in a page; UnsafeSvg if it is not a plain chart."""
    if not isinstance(svg, str) or len(svg) > MAX_CHARS:
        raise UnsafeSvg("not a chart")
    if "<!" in svg or "<?" in svg:  # no DOCTYPE (entity expansion), CDATA, comments or processing
        raise UnsafeSvg("declarations are not allowed")
    try:
        root = ET.fromstring(svg)
    except ET.ParseError as error:
        raise UnsafeSvg(f"not well-formed: {error}") from None
    if _local(root.tag) != "svg":
        raise UnsafeSvg("the root is not <svg>")
    out: list[str] = []
    _write(root, out)
    return Markup("".join(out))  # noqa: S704 - rebuilt above from allowlisted, escaped parts


def safe_charts(charts: object) -> list[tuple[str, Markup | None]]:
    """(name, markup or None when refused) for each chart of a run's `charts` mapping."""
    if not isinstance(charts, dict):
        return []
    shown = []
    for name, svg in charts.items():
        try:
            shown.append((str(name), clean_svg(svg)))
        except UnsafeSvg:
            shown.append((str(name), None))
    return shown
