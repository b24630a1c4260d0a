"""Run labs: measure the configurations they need, then check and report on the measurements.

Starting ranks and importing torch is the slow part on a small machine, so every configuration the
requested labs need at one world size is measured in a single batch on warm ranks (`pool.Pools`: one
pool per world size, shared by every lab of the call, or kept across calls by a caller that passes its
own, as `sharding-lab serve-labs` does), and labs that need the same configuration (equal `RunConfig`s)
share its measurement.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext
from datetime import datetime, timezone

from sharding_lab.engine.measure import measure_many
from sharding_lab.engine.pool import Pools
from sharding_lab.labs.base import RunSpec
from sharding_lab.labs.evaluate import evaluate
from sharding_lab.labs.registry import LABS, get_lab
from sharding_lab.measurement import Measurement
from sharding_lab.run_config import RunConfig

Progress = Callable[[str], None]


def run_lab(
    lab_id: str,
    world_size: int = 2,
    *,
    size: str = "tiny",
    device: str = "cpu",
    on_progress: Progress | None = None,
    on_status: Progress | None = None,
    pools: Pools | None = None,
    timeout_s: float = 600.0,
) -> dict:
    """Measure, check and report one lab; the run JSON (see `sharding_lab.labs.evaluate.evaluate`)."""
    return run_labs(
        [lab_id], world_size, size=size, device=device, on_progress=on_progress, on_status=on_status, pools=pools,
        timeout_s=timeout_s,
    )[0]


def lab_specs(lab_id: str, world_size: int, *, size: str = "tiny", device: str = "cpu") -> tuple[RunSpec, ...]:
    """The lab's runs at `world_size`, on the model `size` (unless a run needs its own) and `device`."""
    return tuple(
        RunSpec(
            spec.key,
            spec.config.replace(device=device, **({} if spec.size_fixed else {"size": size})),
            spec.size_fixed,
        )
        for spec in get_lab(lab_id).runs(world_size)
    )


def run_labs(
    lab_ids: Iterable[str] | None = None,
    world_size: int = 2,
    *,
    size: str = "tiny",
    device: str = "cpu",
    on_progress: Progress | None = None,
    on_status: Progress | None = None,
    pools: Pools | None = None,
    timings: dict[str, float] | None = None,
    timeout_s: float = 600.0,
) -> list[dict]:
    """Run several labs (all by default) with one batch per world size; their run JSONs in order.

    `on_progress` hears each milestone (a launch, a lab's verdict); `on_status` also hears rank 0's
    live position inside a launch (e.g. "zero3: step 2 backward"), for a status line. `pools`: warm
    ranks to run on (kept running afterwards); without it, pools live for this call only. `timings`,
    when given, receives "rank_s": the seconds the ranks spent measuring (slowest rank, summed over
    batches), the labs' own cost without process start-up.
    """
    if world_size < 2:
        raise ValueError(f"labs compare sharded ranks: world_size must be at least 2, got {world_size}")
    labs = [get_lab(lab_id) for lab_id in (LABS if lab_ids is None else lab_ids)]
    specs = {lab.id: lab_specs(lab.id, world_size, size=size, device=device) for lab in labs}
    all_configs = [spec.config for lab_specs_ in specs.values() for spec in lab_specs_]
    with nullcontext(pools) if pools is not None else Pools(idle_timeout_s=None) as in_use:
        measured, seconds = measure_configs(
            all_configs, on_progress=on_progress, on_status=on_status, pools=in_use, timings=timings,
            timeout_s=timeout_s,
        )
    measured_at = datetime.now(timezone.utc).isoformat(timespec="seconds")  # when, for the record
    runs = []
    for lab in labs:
        measurements = {spec.key: measured[spec.config] for spec in specs[lab.id]}
        launch_seconds = sum(seconds[n] for n in {spec.config.world_size for spec in specs[lab.id]})
        runs.append({**evaluate(lab, world_size, specs[lab.id], measurements, launch_seconds), "measured_at": measured_at})
        if on_progress:
            verdict = "holds" if runs[-1]["holds"] else "DOES NOT HOLD"
            on_progress(f"{lab.id}: {verdict}")
    return runs


def measure_configs(
    configs: Sequence[RunConfig],
    *,
    on_progress: Progress | None = None,
    on_status: Progress | None = None,
    pools: Pools | None = None,
    timings: dict[str, float] | None = None,
    timeout_s: float = 600.0,
) -> tuple[dict[RunConfig, Measurement], dict[int, float]]:
    """Measure each distinct configuration once, one batch per world size (on `pools`' warm ranks
    when given, else one launch each).

    Returns the measurements keyed by their RunConfig and each batch's wall seconds. A configuration
    that times no steps, asked beside the same one timed, gets the timed one's measurement: it has all
    the untimed one would.
    """
    source = _with_timed_twins(configs)
    # One batch per world size and placement (a rank view runs apart from real ranks).
    batches: dict[tuple[int, str], list[RunConfig]] = {}
    for config in dict.fromkeys(source.values()):
        batches.setdefault((config.world_size, str(config.placement)), []).append(config)
    measured: dict[RunConfig, Measurement] = {}
    seconds: dict[int, float] = {}
    rank_seconds_before = pools.rank_seconds if pools is not None else 0.0
    for (world_size, _placement), distinct in sorted(batches.items()):
        if on_progress:
            names = ", ".join(config.label for config in distinct)
            on_progress(f"launching {world_size} rank{'s' if world_size > 1 else ''}: {names}")
        started = time.perf_counter()
        # Labs read every rank's figures: with fewer GPUs than ranks, real ranks share one GPU.
        results = measure_many(distinct, on_progress=on_status, every_rank=True, pools=pools, timeout_s=timeout_s)

        for note in {m.config.placement_note for m in results if m.config.placement_note}:
            if on_progress:
                on_progress(note)
        seconds[world_size] = seconds.get(world_size, 0.0) + time.perf_counter() - started
        measured.update(zip(distinct, results, strict=True))
    if timings is not None and pools is not None:
        timings["rank_s"] = timings.get("rank_s", 0.0) + pools.rank_seconds - rank_seconds_before
    return {config: measured[measured_as] for config, measured_as in source.items()}, seconds


def _with_timed_twins(configs: Sequence[RunConfig]) -> dict[RunConfig, RunConfig]:
    """Each distinct configuration and the one to measure for it: itself, or for one with
    timed_steps=0 the same configuration with timed steps, when that is asked too."""
    timed = {config.replace(timed_steps=0): config for config in configs if config.timed_steps > 0}
    return {
        config: timed.get(config, config) if config.timed_steps == 0 else config for config in dict.fromkeys(configs)
    }
