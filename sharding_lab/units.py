"""Byte and parameter counts for people: the one formatter of each that reports, findings and charts use."""

from __future__ import annotations


def human_bytes(value: float | None) -> str:
    """Bytes with a binary unit and one decimal, up to EiB: 1536 -> '1.5 KiB'; None -> '-'."""
    if value is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        shown = round(value) if unit == "B" else round(value, 1)  # as printed: 1023.97 KiB is 1.0 MiB
        if unit == "EiB":
            return f"{shown:,.1f} {unit}"  # the largest: separators past 1,024 EiB, never an exponent
        if abs(shown) < 1024:
            return f"{shown:.0f} {unit}" if unit == "B" else f"{shown:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


# Decimal units, largest first: GPU memory is sold in them (an 80 GB GPU holds 80e9 bytes).
DECIMAL_UNITS = (("EB", 10**18), ("PB", 10**15), ("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("kB", 10**3))


def decimal_bytes(value: float | None, figures: int | None = None) -> str:
    """Bytes in the largest decimal unit, up to EB, that shows them as at least 1: two decimals
    (12712122648 -> '12.71 GB'), or `figures` significant figures for a chart's labels (-> '12.7 GB');
    never an exponent (past 1,000 EB, separators). None -> '–'."""
    if value is None:
        return "–"
    if abs(value) < 1e3:
        return f"{value:.0f} B"
    for unit, scale in DECIMAL_UNITS:
        scaled = value / scale
        shown = f"{scaled:.2f}" if figures is None else f"{scaled:.{figures}g}"
        if abs(float(shown)) >= 1:  # as printed: 999,996 bytes are "1.00 MB", not "1000.00 kB"
            if figures is None:
                return f"{scaled:,.2f} {unit}"  # separators past 1,000 EB
            return f"{scaled:,.0f} {unit}" if "e" in shown else f"{shown} {unit}"
    raise AssertionError("unreachable: kB takes every value from 1,000")


def param_count(count: int) -> str:
    """A parameter count in three figures with its scale: 60096 -> '60.1K', 6.86e9 -> '6.86B', and
    past a thousand trillion still in T ('13,500T'), never an exponent."""
    for suffix, size in (("T", 10**12), ("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if count >= size:
            scaled = count / size
            return f"{scaled:.3g}{suffix}" if scaled < 1000 else f"{scaled:,.0f}{suffix}"
    return str(count)
