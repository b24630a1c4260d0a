"""A lab's verdict and report on measurements already taken, as the run JSON; and its stored summary.

Torch-free: the engine side (`sharding_lab.engine.run_labs`) measures and then calls `evaluate`; tests
call it on stored or doctored measurements.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from sharding_lab import atomic_write
from sharding_lab.labs.at_scale import at_scale_line
from sharding_lab.labs.base import Lab, Report, RunSpec, Table, Verdict
from sharding_lab.measurement import Measurements
from sharding_lab.model_config import model_label

# The run JSON's bulky parts, left out of stored summaries (exports, the web app's list).
BULKY_FIELDS = ("measurements", "charts")
# What a check or a report raises on measurements that lack what it reads (a doctored run, an engine change).
_UNREADABLE = (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError, AttributeError)


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
    measured, in a sentence or two with the numbers; at_scale: the same configurations planned for 7B
    on 64 GPUs and 70B on 1024 (sharding_lab.labs.at_scale); table: {"columns", "rows"} the finding rests on;
    charts: {name: SVG}; measurements: {run key: the engine's measurement JSON}; config: strategy (and
    strategies), world_size (and world_sizes), each run's options, size, backend, device,
    torch_version; duration_s: seconds of the launches it used (shared with other labs under
    --all) plus its check and report.
    """
    started = time.perf_counter()
    verdict, report = _assess(lab, measurements)
    first = next(iter(measurements.values())).config
    strategies = list(dict.fromkeys(str(spec.config.strategy) for spec in specs))  # in the lab's order
    return {
        "lab": lab.id,
        "title": lab.info.title,
        "claim": lab.info.claim,
        "questions": list(lab.info.questions),
        "holds": verdict.holds,
        "finding": f"{report.finding} {where_it_holds(measurements)}",
        "at_scale": at_scale_line(lab),
        "reasons": list(verdict.reasons),
        "table": report.table.to_dict(),
        "charts": report.charts,
        "measurements": {key: m.to_json() for key, m in measurements.items()},
        "config": {
            "strategy": ", ".join(strategies),
            "strategies": strategies,
            "world_size": world_size,
            "world_sizes": sorted({spec.config.world_size for spec in specs}),
            "runs": [spec.to_json() for spec in specs],
            "size": " and ".join(dict.fromkeys(model_label(m.config.size, m.config.model) for m in measurements.values())),
            "backend": first.backend,
            "device": first.device,
            "torch_version": first.torch_version,
            "cuda_version": first.cuda_version,
            "gpu_name": first.gpu_name,
        },
        "duration_s": round(launch_seconds + time.perf_counter() - started, 3),
    }


def measured_where(result: Mapping | None) -> list[str]:
    """Where a run JSON (or its stored summary) was measured, read back from its `config` as short
    phrases: device (and GPU), world size(s), backend, torch and CUDA versions, model size, strategies.
    What it does not record, or records as other than a name or a whole number (a hand-edited file),
    is left out. The app's pages and the Anki back both say it so."""
    config = result.get("config") if isinstance(result, Mapping) else None
    if not isinstance(config, Mapping):
        return []
    one = {key: str(value) for key, value in config.items() if _is_name(value)}
    many = {key: [str(v) for v in value if _is_name(v)] for key, value in config.items() if isinstance(value, list)}
    where = []
    if "device" in one:
        where.append(one["device"] + (f" ({one['gpu_name']})" if "gpu_name" in one else ""))
    if len(many.get("world_sizes", [])) > 1:
        where.append("world sizes " + ", ".join(many["world_sizes"]))
    elif "world_size" in one:
        where.append(f"world size {one['world_size']}")
    labels = (("backend", "{} backend"), ("torch_version", "torch {}"), ("cuda_version", "CUDA {}"), ("size", "{} model"))
    where += [label.format(one[key]) for key, label in labels if key in one]
    if len(many.get("strategies", [])) > 1:
        where.append("strategies " + ", ".join(many["strategies"]))
    elif "strategy" in one:
        where.append(f"strategy {one['strategy']}")
    return where


def _is_name(value: object) -> bool:
    return (isinstance(value, str) and value != "") or type(value) is int


@dataclass(frozen=True)
class MeasuredRun:
    """What one measured configuration's figures are true of, as `where_it_holds` words it."""

    model: str  # e.g. "tiny", "mini with n_embd=256"
    parameters: int
    ranks: str  # the backend of real ranks ("gloo", "nccl"), or "rank view"
    world_size: int
    mixed_precision: bool


def where_it_holds(measurements: Measurements) -> str:
    """One sentence on what the finding's numbers are true of: the implementation, the models, the
    dtypes and the ranks they were measured on."""
    configs = [m.config for m in measurements.values()]
    runs = [
        MeasuredRun(model_label(c.size, c.model), c.num_params, "rank view" if c.placement == "rank-view" else c.backend,
                    c.world_size, c.mixed_precision)
        for c in configs
    ]
    return f"(Measured with PyTorch {configs[0].torch_version}'s implementations on {configs[0].device}: {where_phrase(runs)}.)"


def where_phrase(runs: Iterable[MeasuredRun]) -> str:
    """The models, ranks and dtypes of `runs`, each said once: "the tiny model (60,096 parameters) on
    1, 2 and 4 gloo ranks, fp32", or "on 2 gloo ranks, fp32 and bf16 mixed precision"."""
    by_model: dict[tuple[str, int], dict[str, dict[str, set[int]]]] = {}
    for run in runs:
        dtype = "bf16 mixed precision" if run.mixed_precision else "fp32"
        ranks = by_model.setdefault((run.model, run.parameters), {}).setdefault(dtype, {})
        ranks.setdefault(run.ranks, set()).add(run.world_size)
    parts = []
    for (model, parameters), dtypes in by_model.items():
        placed = {dtype: " and ".join(_ranks_phrase(kind, sizes) for kind, sizes in ranks.items())
                  for dtype, ranks in dtypes.items()}
        if len(set(placed.values())) == 1:  # every dtype on the same ranks
            on = f"{next(iter(placed.values()))}, {' and '.join(placed)}"
        else:
            on = " and ".join(f"{ranks} ({dtype})" for dtype, ranks in placed.items())
        parts.append(f"the {model} model ({parameters:,} parameters) on {on}")
    return "; ".join(parts)


def _ranks_phrase(kind: str, world_sizes: set[int]) -> str:
    sizes = sorted(world_sizes)
    listed = ", ".join(map(str, sizes[:-1])) + " and " + str(sizes[-1]) if len(sizes) > 1 else str(sizes[0])
    if kind == "rank view":
        return f"a rank view of {listed} ranks" if len(sizes) == 1 else f"rank views of {listed} ranks"
    return f"{listed} {kind} rank{'' if sizes == [1] else 's'}"


def _assess(lab: Lab, measurements: Measurements) -> tuple[Verdict, Report]:
    """The lab's verdict and report; measurements it cannot read give "not shown", not a crash."""
    try:
        analysis = lab.analyse(measurements)
    except _UNREADABLE as error:
        reason = f"{type(error).__name__}: {error}"
        return (
            Verdict(False, (f"NOT checkable: {reason}",)),
            Report(f"No report: the measurements lack what it reads ({reason}).", Table((), ())),
        )
    try:
        verdict = lab.check_analysis(analysis)
    except _UNREADABLE as error:
        verdict = Verdict(False, (f"NOT checkable: {type(error).__name__}: {error}",))
    try:
        report = lab.report_analysis(analysis)
    except _UNREADABLE as error:
        report = Report(
            f"No report: the measurements lack what it reads ({type(error).__name__}: {error}).", Table((), ())
        )
    return verdict, report


def summarize(run: Mapping) -> dict:
    """A run without its bulky parts (measurements, charts): what exports and listings store."""
    return {name: value for name, value in run.items() if name not in BULKY_FIELDS}


def write_summaries(runs: Iterable[Mapping], path: Path) -> None:
    """Write {lab id: summarize(run)} to `path` (exports/lab-results.json), formatted as the Anki
    export writes it, so a rebuild of the decks leaves the file's layout unchanged. Its folder must exist
    (`run --export` refuses a missing one before any lab runs)."""
    summaries = {run["lab"]: summarize(run) for run in runs}
    atomic_write.write_text(path, json.dumps(summaries, indent=1, sort_keys=True) + "\n")
