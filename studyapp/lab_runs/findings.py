"""Which finding a lab shows: its latest local run, else the committed reference.

`exports/lab-results.json` holds each lab's committed finding (written by `sharding-lab run --all
--export`, carried by the Anki decks), so a fresh install shows a measured finding from the first
minute. Once this machine has run a lab, that run is the latest and the reference stays beside it
for comparison. `choose` is the one rule; the pages (`lab_findings`) and `studyapp export-anki`
both go through it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlmodel import Session

from sharding_lab.labs.base import Table
from sharding_lab.labs.evaluate import measured_where
from studyapp.lab_runs.queue import aware, latest_done
from studyapp.models import LabRun

LAB_RESULTS_FILE = "lab-results.json"


@dataclass(frozen=True)
class ShownResult:
    """A lab result as the pages show it, read field by field from its JSON (a local run's, or an
    entry of lab-results.json, which may be hand-edited or older than today's fields): a field of the
    wrong type is shown as absent, never as a 500 or as a verdict the file did not record."""

    holds: bool  # only a JSON true holds; anything else reads "did NOT hold"
    title: str
    finding: str
    at_scale: str
    reasons: tuple[str, ...]
    table: Table | None
    where: tuple[str, ...]  # measured_where: device, GPU, ranks, backend, torch, CUDA, model, strategies
    measured_at: datetime | None  # the result's own date, when it records one

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> ShownResult:
        reasons = raw.get("reasons")
        return cls(
            holds=raw.get("holds") is True,
            title=_text(raw.get("title")),
            finding=_text(raw.get("finding")),
            at_scale=_text(raw.get("at_scale")),
            reasons=tuple(r for r in reasons if isinstance(r, str)) if isinstance(reasons, list) else (),
            table=Table.from_json(raw.get("table")),
            where=tuple(measured_where(raw)),
            measured_at=measured_date(raw),
        )


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


@dataclass(frozen=True)
class LabFinding:
    """What a lab page, the labs index and a card's lab box show for one lab."""

    lab_id: str
    local: LabRun | None  # the latest done run on this machine
    reference: dict[str, Any] | None  # the committed result from lab-results.json

    @property
    def is_reference(self) -> bool:
        """True when no local run has a result, so the reference is what is shown."""
        return self.reference is not None and not (self.local is not None and isinstance(self.local.result, dict))

    @property
    def result(self) -> dict[str, Any] | None:
        """The result to show first: the local run's, else the reference."""
        if self.is_reference:
            return self.reference
        return self.local.result if self.local is not None and isinstance(self.local.result, dict) else None

    @property
    def shown(self) -> ShownResult | None:
        """`result`, typed for the pages."""
        return ShownResult.parse(self.result) if self.result is not None else None

    @property
    def measured_at(self) -> datetime | None:
        """When the shown result was measured, if known: a local run's finish time, else the
        reference's `measured_at` (absent from files exported before it was recorded)."""
        if not self.is_reference:
            return aware(self.local.finished_at) if self.local else None
        return measured_date(self.reference)


def measured_date(result: Mapping[str, Any] | None) -> datetime | None:
    """A result's recorded `measured_at`; None when the file predates it or it is not a date."""
    raw = (result or {}).get("measured_at")
    try:
        return datetime.fromisoformat(raw) if isinstance(raw, str) else None
    except ValueError:
        return None


def choose(local: Mapping[str, dict[str, Any] | None], reference: Mapping[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per lab, the result to show and export: the latest local run's, else the reference."""
    chosen = {lab: result for lab, result in reference.items() if isinstance(result, dict)}
    chosen.update({lab: result for lab, result in local.items() if isinstance(result, dict)})
    return chosen


_reference_cache: dict[Path, tuple[float, dict[str, dict[str, Any]]]] = {}


def reference_results(exports_dir: str | Path | None) -> dict[str, dict[str, Any]]:
    """The committed results in `exports_dir`/lab-results.json; {} when absent, unreadable or not
    lab results (the pages then show no reference). Re-read only when the file changes (the pages
    ask on every request)."""
    from studyapp.anki.manifest import ExportFileError
    from studyapp.anki.package import read_lab_results  # the one reader of the file

    if not exports_dir:
        return {}
    path = Path(exports_dir) / LAB_RESULTS_FILE
    try:
        mtime = path.stat().st_mtime
    except OSError:
        return {}
    cached = _reference_cache.get(path)
    if cached is None or cached[0] != mtime:
        try:
            cached = (mtime, read_lab_results(path))
        except (OSError, ExportFileError):
            cached = (mtime, {})
        _reference_cache[path] = cached
    return cached[1]


def lab_findings(session: Session, exports_dir: str | Path | None, lab_id: str | None = None) -> dict[str, LabFinding]:
    """Per lab (only `lab_id`'s when given): its latest local run and its reference. A lab with
    neither is absent."""
    runs = latest_done(session, lab_id)
    reference = reference_results(exports_dir)
    if lab_id is not None:
        reference = {lab_id: reference[lab_id]} if lab_id in reference else {}
    chosen = choose({lab: run.result for lab, run in runs.items()}, reference)
    return {lab: LabFinding(lab, runs.get(lab), reference.get(lab)) for lab in chosen}
