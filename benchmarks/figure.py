from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Figure:
    """One benchmark result: a measured value beside its target."""

    name: str
    value: float
    unit: str  # "x" for a ratio, "s", "MiB", ...
    target: str  # e.g. "<= 1.10" or ">= 0.5"; "" when only reported
    detail: str = ""

    @property
    def met(self) -> bool | None:
        if not self.target:
            return None
        op, bound = self.target.split()
        return self.value <= float(bound) if op == "<=" else self.value >= float(bound)
