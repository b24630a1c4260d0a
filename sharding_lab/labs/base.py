"""The shapes every lab shares: what it runs, its verdict and its report.

A lab pairs a catalogue entry (`sharding_lab.catalog.LabInfo`: id, title, claim, questions) with
the engine configurations it needs, a check that can fail and a report with numbers. Checks and
reports read plain measurement dicts (the engine's JSON), so they run without torch and can be
fed doctored measurements in tests.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from sharding_lab.catalog import LABS_BY_ID, LabInfo

# One engine measurement (the JSON `sharding_lab.engine.measure.measure` returns), keyed by RunSpec.key.
Measurements = Mapping[str, dict]


@dataclass(frozen=True)
class RunSpec:
    """One engine configuration a lab needs."""

    key: str  # how the lab's check and report find this run, e.g. "zero3" or "zero3, N=4"
    strategy: str  # ddp, zero1, zero2, zero3
    world_size: int
    options: tuple[tuple[str, object], ...] = ()  # engine options, e.g. (("prefetch", True),)

    @property
    def engine_config(self) -> tuple[str, int, tuple[tuple[str, object], ...]]:
        """Identity of the engine run: labs that need the same configuration share one measurement."""
        return (self.strategy, self.world_size, tuple(sorted(self.options)))


@dataclass(frozen=True)
class Verdict:
    holds: bool
    reasons: tuple[str, ...]  # each condition checked, with its numbers; failures start with "NOT"


@dataclass(frozen=True)
class Table:
    columns: tuple[str, ...]
    rows: tuple[tuple[object, ...], ...]

    def to_dict(self) -> dict:
        return {"columns": list(self.columns), "rows": [list(row) for row in self.rows]}


@dataclass(frozen=True)
class Report:
    finding: str  # one or two sentences with the measured numbers
    table: Table
    charts: dict[str, str] = field(default_factory=dict)  # chart name -> SVG


@dataclass(frozen=True)
class Lab:
    info: LabInfo
    runs: Callable[[int], tuple[RunSpec, ...]]  # the configurations to measure at world size N
    check: Callable[[Measurements], Verdict]
    report: Callable[[Measurements], Report]

    @property
    def id(self) -> str:
        return self.info.id


class Conditions:
    """Collects the conditions a check tests, so a verdict lists every one with its numbers."""

    def __init__(self) -> None:
        self._results: list[tuple[bool, str]] = []

    def require(self, ok: bool, description: str) -> bool:
        self._results.append((bool(ok), description if ok else f"NOT {description}"))
        return bool(ok)

    def verdict(self) -> Verdict:
        return Verdict(
            holds=bool(self._results) and all(ok for ok, _ in self._results),
            reasons=tuple(text for _, text in self._results),
        )


def runs_at(*configs: tuple[str, str, dict]) -> Callable[[int], tuple[RunSpec, ...]]:
    """A lab's runs, all at the lab's world size: (key, strategy, options) each."""

    def runs(world_size: int) -> tuple[RunSpec, ...]:
        return tuple(
            RunSpec(key, strategy, world_size, tuple(sorted(options.items())))
            for key, strategy, options in configs
        )

    return runs


def percent(fraction: float) -> str:
    return f"{100 * fraction:.1f}%"


def shares_text(shares: list[float]) -> str:
    """Each rank's share as a percentage: "50.0% / 50.0%"."""
    return " / ".join(percent(s) for s in shares)


def near(value: float, target: float, tolerance: float) -> bool:
    """Whether value is within `tolerance` (relative) of target."""
    return abs(value - target) <= tolerance * abs(target)


def catalog_lab(
    lab_id: str,
    runs: Callable[[int], tuple[RunSpec, ...]],
    check: Callable[[Measurements], Verdict],
    report: Callable[[Measurements], Report],
) -> Lab:
    """The runnable lab for a catalogue id (KeyError for an id the catalogue does not have)."""
    return Lab(LABS_BY_ID[lab_id], runs, check, report)
