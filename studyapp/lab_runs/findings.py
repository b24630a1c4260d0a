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

from studyapp.lab_runs.queue import aware, latest_done
from studyapp.models import LabRun

LAB_RESULTS_FILE = "lab-results.json"


@dataclass(frozen=True)
class LabFinding:
    """What a lab page, the labs index and a card's lab box show for one lab."""

    lab_id: str
    local: LabRun | None  # the latest done run on this machine
    reference: dict[str, Any] | None  # the committed result from lab-results.json

    @property
    def result(self) -> dict[str, Any] | None:
        """The result to show first: the local run's, else the reference."""
        if self.local is not None and isinstance(self.local.result, dict):
            return self.local.result
        return self.reference

    @property
    def is_reference(self) -> bool:
        return self.result is not None and self.result is self.reference

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


def where_measured(result: Mapping[str, Any] | None) -> list[str]:
    """device (and its GPU), ranks, backend, torch and CUDA versions of a result, as short phrases;
    what the result does not record is left out."""
    config = (result or {}).get("config")
    if not isinstance(config, Mapping):
        return []
    where = [str(config["device"])] if config.get("device") else []
    if config.get("gpu_name"):
        where.append(str(config["gpu_name"]))
    if config.get("world_size") is not None:
        where.append(f"{config['world_size']} ranks")
    if config.get("backend"):
        where.append(str(config["backend"]))
    if config.get("torch_version"):
        where.append(f"torch {config['torch_version']}")
    if config.get("cuda_version"):
        where.append(f"CUDA {config['cuda_version']}")
    return where


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
