"""The shapes every lab shares: what it runs, its verdict and its report.

A lab pairs a catalogue entry (`sharding_lab.catalog.LabInfo`: id, title, claim, questions) with
the engine configurations it needs, an analysis of their measurements, a check that can fail and a
report with numbers. The check and the report read the same analysis, computed once. Everything
reads typed `Measurement`s (sharding_lab.measurement), so labs run without torch and can be fed
doctored measurements in tests.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar

from sharding_lab.catalog import LABS_BY_ID, LabInfo
from sharding_lab.measurement import Measurements
from sharding_lab.run_config import RunConfig
from sharding_lab.strategies import Strategy

A = TypeVar("A")  # a lab's analysis


@dataclass(frozen=True)
class RunSpec:
    """One engine configuration a lab needs, and the key its check and report find it by."""

    key: str  # e.g. "zero3" or "zero3, N=4"
    config: RunConfig  # hashable: labs that need the same configuration share one measurement
    size_fixed: bool = False  # the run needs its own model size, whatever size the labs are run on

    def to_json(self) -> dict:
        """How a run is listed: its key, strategy, world size and the options that differ from the defaults."""
        config = self.config
        return {
            "key": self.key,
            "strategy": str(config.strategy),
            "world_size": config.world_size,
            "options": config.changed_options(),
        }


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

    @classmethod
    def from_json(cls, raw: Any) -> Table | None:
        """`to_dict`'s JSON back, from a stored result that may be hand-edited: None unless there are
        columns; a row that is not a list is left out, and a cell that is a list or an object becomes
        its JSON text."""
        if not isinstance(raw, Mapping) or not isinstance(raw.get("columns"), list) or not raw["columns"]:
            return None
        rows = raw.get("rows") if isinstance(raw.get("rows"), list) else []
        return cls(tuple(_cell(c) for c in raw["columns"]),
                   tuple(tuple(_cell(v) for v in row) for row in rows if isinstance(row, list)))


def _cell(value: Any) -> object:
    return value if value is None or isinstance(value, (str, int, float)) else json.dumps(value)


@dataclass(frozen=True)
class Report:
    finding: str  # one or two sentences with the measured numbers
    table: Table
    charts: dict[str, str] = field(default_factory=dict)  # chart name -> SVG


@dataclass(frozen=True)
class Lab(Generic[A]):
    info: LabInfo
    runs: Callable[[int], tuple[RunSpec, ...]]  # the configurations to measure at world size N
    analyse: Callable[[Measurements], A]  # every figure the check and the report use, computed once
    check_analysis: Callable[[A], Verdict]
    report_analysis: Callable[[A], Report]
    reads_step_time: bool = False  # False: its runs time no steps (timed_steps=0), see catalog_lab

    @property
    def id(self) -> str:
        return self.info.id

    def world_sizes(self, world_size: int) -> tuple[int, ...]:
        """The rank counts its runs use when asked for world size N: N itself for most labs, but a
        scaling lab compares N with 2N (and 1), so asking for 4 starts 8 ranks."""
        return tuple(sorted({spec.config.world_size for spec in self.runs(world_size)}))

    def assess(self, measurements: Measurements) -> tuple[Verdict, Report]:
        """The verdict and the report, from one analysis of the measurements."""
        analysis = self.analyse(measurements)
        return self.check_analysis(analysis), self.report_analysis(analysis)

    def check(self, measurements: Measurements) -> Verdict:
        return self.check_analysis(self.analyse(measurements))

    def report(self, measurements: Measurements) -> Report:
        return self.report_analysis(self.analyse(measurements))


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


def runs_at(*configs: tuple[str, Strategy, dict[str, Any]]) -> Callable[[int], tuple[RunSpec, ...]]:
    """A lab's runs, all at the lab's world size: (key, strategy, RunConfig.of's options) each."""

    def runs(world_size: int) -> tuple[RunSpec, ...]:
        return tuple(
            RunSpec(key, RunConfig.of(strategy, world_size=world_size, **options))
            for key, strategy, options in configs
        )

    return runs


def world_size_key(strategy: Strategy | str, world_size: int) -> str:
    """The key of a lab run that varies the world size: "zero3, N=4"."""
    return f"{strategy}, N={world_size}"


def runs_across(strategies: tuple[Strategy, ...], world_sizes: tuple[int, ...]) -> tuple[RunSpec, ...]:
    """Each strategy at each world size, keyed by `world_size_key`."""
    return tuple(
        RunSpec(world_size_key(strategy, n), RunConfig(strategy, world_size=n))
        for n in world_sizes
        for strategy in strategies
    )


def percent(fraction: float) -> str:
    return f"{100 * fraction:.1f}%"


def shares_text(shares: list[float]) -> str:
    """Each rank's share as a percentage: "50.0% / 50.0%"."""
    return " / ".join(percent(s) for s in shares)


def count_of(flags: list[bool]) -> str:
    """How many of a per-block condition held: "3 of 4"."""
    return f"{sum(flags)} of {len(flags)}"


def near(value: float, target: float, tolerance: float) -> bool:
    """Whether value is within `tolerance` (relative) of target."""
    return abs(value - target) <= tolerance * abs(target)


def catalog_lab(
    lab_id: str,
    runs: Callable[[int], tuple[RunSpec, ...]],
    analyse: Callable[[Measurements], A],
    check: Callable[[A], Verdict],
    report: Callable[[A], Report],
    *,
    reads_step_time: bool = False,
) -> Lab[A]:
    """The runnable lab for a catalogue id (KeyError for an id the catalogue does not have).

    A lab whose analysis reads no step time has its runs time no steps: they cost a figure it never
    shows (reshard-after-forward through the app, 2 CPU cores: 0.76 s untimed against 1.09 s with 3
    timed steps a configuration). Where another lab in the same call times the same configuration,
    both read that one measurement (`run_labs.measure_configs`).
    """
    runs = runs if reads_step_time else _untimed(runs)
    return Lab(LABS_BY_ID[lab_id], runs, analyse, check, report, reads_step_time)


def _untimed(runs: Callable[[int], tuple[RunSpec, ...]]) -> Callable[[int], tuple[RunSpec, ...]]:
    def untimed_runs(world_size: int) -> tuple[RunSpec, ...]:
        return tuple(replace(spec, config=spec.config.replace(timed_steps=0)) for spec in runs(world_size))

    return untimed_runs
