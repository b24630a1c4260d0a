"""Run labs: measure the configurations they need, then check and report on the measurements.

Starting ranks and importing torch is the slow part on a small machine, so every configuration the
requested labs need at one world size is measured in a single launch, and labs that need the same
configuration share its measurement. The engine is imported only here, lazily.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from sharding_lab.labs.base import Lab, Measurements, Report, RunSpec, Table, Verdict
from sharding_lab.labs.registry import LABS, get_lab

EngineConfig = tuple  # RunSpec.engine_config: (strategy, world_size, options)
Progress = Callable[[str], None]

# The run JSON's bulky parts, left out of stored summaries (exports, the web app's list).
BULKY_FIELDS = ("measurements", "charts")


def run_lab(
    lab_id: str,
    world_size: int = 2,
    *,
    size: str = "tiny",
    device: str = "cpu",
    on_progress: Progress | None = None,
    on_status: Progress | None = None,
) -> dict:
    """Measure, check and report one lab; the run JSON (see `evaluate`)."""
    return run_labs(
        [lab_id], world_size, size=size, device=device, on_progress=on_progress, on_status=on_status
    )[0]


def run_labs(
    lab_ids: Iterable[str] | None = None,
    world_size: int = 2,
    *,
    size: str = "tiny",
    device: str = "cpu",
    on_progress: Progress | None = None,
    on_status: Progress | None = None,
) -> list[dict]:
    """Run several labs (all by default) with one launch per world size; their run JSONs in order.

    `on_progress` hears each milestone (a launch, a lab's verdict); `on_status` also hears rank 0's
    live position inside a launch (e.g. "zero3: step 2 backward"), for a status line.
    """
    if world_size < 2:
        raise ValueError(f"labs compare sharded ranks: world_size must be at least 2, got {world_size}")
    labs = [get_lab(lab_id) for lab_id in (LABS if lab_ids is None else lab_ids)]
    specs = {lab.id: lab.runs(world_size) for lab in labs}
    all_specs = [spec for lab_specs in specs.values() for spec in lab_specs]
    measured, seconds = measure_specs(
        all_specs, size, device=device, on_progress=on_progress, on_status=on_status
    )
    runs = []
    for lab in labs:
        measurements = {spec.key: measured[spec.engine_config] for spec in specs[lab.id]}
        launch_seconds = sum(seconds[n] for n in {spec.world_size for spec in specs[lab.id]})
        runs.append(evaluate(lab, world_size, specs[lab.id], measurements, launch_seconds))
        if on_progress:
            verdict = "holds" if runs[-1]["holds"] else "DOES NOT HOLD"
            on_progress(f"{lab.id}: {verdict}")
    return runs


def measure_specs(
    specs: Sequence[RunSpec],
    size: str = "tiny",
    *,
    device: str = "cpu",
    on_progress: Progress | None = None,
    on_status: Progress | None = None,
) -> tuple[dict[EngineConfig, dict], dict[int, float]]:
    """Measure each distinct configuration once, one launch per world size, on `device` (cpu: gloo,
    cuda: NCCL with one GPU per rank).

    Returns the measurements keyed by `RunSpec.engine_config` and each launch's wall seconds.
    """
    from sharding_lab.engine.measure import measure_many  # torch and the engine: only when something runs

    by_world_size: dict[int, dict[EngineConfig, RunSpec]] = {}
    for spec in specs:
        by_world_size.setdefault(spec.world_size, {}).setdefault(spec.engine_config, spec)
    measured: dict[EngineConfig, dict] = {}
    seconds: dict[int, float] = {}
    for world_size, distinct in sorted(by_world_size.items()):
        if on_progress:
            names = ", ".join(_describe(spec) for spec in distinct.values())
            on_progress(f"launching {world_size} rank{'s' if world_size > 1 else ''}: {names}")
        started = time.perf_counter()
        configs = [
            {"strategy": spec.strategy, "size": size, **dict(spec.options)} for spec in distinct.values()
        ]
        results = measure_many(configs, world_size, device=device, on_progress=on_status)
        seconds[world_size] = time.perf_counter() - started
        measured.update(zip(distinct, results, strict=True))
    return measured, seconds


def _describe(spec: RunSpec) -> str:
    options = ", ".join(f"{name}={value}" for name, value in spec.options)
    return f"{spec.strategy}({options})" if options else spec.strategy


def evaluate(
    lab: Lab,
    world_size: int,
    specs: Sequence[RunSpec],
    measurements: Measurements,
    launch_seconds: float = 0.0,
) -> dict:
    """The run JSON of one lab (what `sharding-lab run LAB --json` prints):

    lab, title, claim, questions: the catalogue entry; holds: whether every condition of the check
    held; reasons: each condition with its numbers ("NOT ..." when it failed); finding: what was
    measured, in a sentence or two with the numbers; table: {"columns", "rows"} the finding rests on;
    charts: {name: SVG}; measurements: {run key: the engine's measurement}; config: strategy (and
    strategies), world_size (and world_sizes), each run's options, size, backend, device,
    torch_version; duration_s: seconds of the launches it used (shared with other labs under
    --all) plus its check and report.
    """
    started = time.perf_counter()
    verdict = _safe_check(lab, measurements)
    report = _safe_report(lab, measurements)
    first = next(iter(measurements.values()))["config"]
    strategies = list(dict.fromkeys(spec.strategy for spec in specs))  # in the lab's order
    return {
        "lab": lab.id,
        "title": lab.info.title,
        "claim": lab.info.claim,
        "questions": list(lab.info.questions),
        "holds": verdict.holds,
        "finding": report.finding,
        "reasons": list(verdict.reasons),
        "table": report.table.to_dict(),
        "charts": report.charts,
        "measurements": dict(measurements),
        "config": {
            "strategy": ", ".join(strategies),
            "strategies": strategies,
            "world_size": world_size,
            "world_sizes": sorted({spec.world_size for spec in specs}),
            "runs": [
                {"key": s.key, "strategy": s.strategy, "world_size": s.world_size, "options": dict(s.options)}
                for s in specs
            ],
            "size": first.get("size"),
            "backend": first.get("backend"),
            "device": first.get("device"),
            "torch_version": first.get("torch_version"),
        },
        "duration_s": round(launch_seconds + time.perf_counter() - started, 3),
    }


def _safe_check(lab: Lab, measurements: Measurements) -> Verdict:
    # Measurements missing what the check reads (a doctored run, an engine change) mean "not shown".
    try:
        return lab.check(measurements)
    except (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError) as error:
        return Verdict(False, (f"NOT checkable: {type(error).__name__}: {error}",))


def _safe_report(lab: Lab, measurements: Measurements) -> Report:
    try:
        return lab.report(measurements)
    except (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError, AttributeError) as error:
        return Report(
            f"No report: the measurements lack what it reads ({type(error).__name__}: {error}).",
            Table((), ()),
        )


def summarize(run: Mapping) -> dict:
    """A run without its bulky parts (measurements, charts): what exports and listings store."""
    return {name: value for name, value in run.items() if name not in BULKY_FIELDS}


def write_summaries(runs: Iterable[Mapping], path: Path) -> None:
    """Write {lab id: summarize(run)} to `path` (exports/lab-results.json), formatted as the Anki
    export writes it, so a rebuild of the decks leaves the file's layout unchanged."""
    path.parent.mkdir(parents=True, exist_ok=True)
    summaries = {run["lab"]: summarize(run) for run in runs}
    path.write_text(json.dumps(summaries, indent=1, sort_keys=True) + "\n", encoding="utf-8")
