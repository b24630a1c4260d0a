"""Byte counts for people: the one formatter every report, finding and chart uses."""

from __future__ import annotations


def human_bytes(value: float | None) -> str:
    """Bytes with a binary unit and one decimal: 1536 -> '1.5 KiB'; None -> '-'."""
    if value is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
