"""Argument types the sharding-lab subcommands share (torch-free): a bad value is a usage error that
names it, never a traceback."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def _plain(text: str) -> str:
    """The text as a number is typed: Python's int() and float() also take "1_000", which no user means."""
    if "_" in text:
        raise ValueError(text)
    return text


def positive_int(text: str) -> int:
    try:
        value = int(_plain(text))
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(_plain(text))
    except ValueError:
        value = 0.0
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a positive, finite number, got {text!r}")
    return value


def fraction(text: str) -> float:
    """A share in [0, 1), e.g. of GPU memory kept free."""
    try:
        value = float(_plain(text))
    except ValueError:
        value = math.nan
    if not 0 <= value < 1:  # NaN fails too
        raise argparse.ArgumentTypeError(f"must be a fraction in [0, 1), got {text!r}")
    return value


def at_most(maximum: float, parse: Callable[[str], float] = positive_int) -> Callable[[str], float]:
    """`parse`, bounded above by `maximum` (what one command may be asked to do)."""

    def bounded(text: str) -> float:
        value = parse(text)
        if value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum:,}, got {text!r}")
        return value

    return bounded


# A --timeout's ceiling: a week. Far beyond it, torch's process-group timeout (a timedelta) overflows
# inside every rank ('1e300' crashed each with OverflowError after the ranks started).
MAX_TIMEOUT_S = 7 * 24 * 3600
timeout_seconds = at_most(MAX_TIMEOUT_S, positive_float)
