"""Byte and parameter counts for people: the one formatter of each that reports, findings and charts use."""

from __future__ import annotations


def human_bytes(value: float | None) -> str:
    """Bytes with a binary unit and one decimal: 1536 -> '1.5 KiB'; None -> '-'."""
    if value is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        shown = round(value) if unit == "B" else round(value, 1)  # as printed: 1023.97 KiB is 1.0 MiB
        if abs(shown) < 1024 or unit == "TiB":
            return f"{shown:.0f} {unit}" if unit == "B" else f"{shown:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def param_count(count: int) -> str:
    """A parameter count in three figures with its scale: 60096 -> '60.1K', 6.86e9 -> '6.86B', and
    past a thousand trillion still in T ('13,500T'), never an exponent."""
    for suffix, size in (("T", 10**12), ("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if count >= size:
            scaled = count / size
            return f"{scaled:.3g}{suffix}" if scaled < 1000 else f"{scaled:,.0f}{suffix}"
    return str(count)
