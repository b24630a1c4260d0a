"""The simulated side of the labs' at-scale lines: each lab configuration at 7B on 64 GPUs and 70B on
1024, through the FSDP2 simulation, stored where `sharding_lab.labs.at_scale` reads it.

`sharding-lab at-scale --write` runs this (a few seconds per configuration with the extrapolating
simulation); the committed file keeps the app, the CLI and the Anki export torch-free.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from datetime import date

import torch

from sharding_lab import atomic_write
from sharding_lab.engine.simulate import simulate
from sharding_lab.labs.at_scale import SCALES, SIMULATED_FIGURES, lab_requests, request_key
from sharding_lab.labs.base import Lab
from sharding_lab.plan_command import run_config_for, simulation_unavailable
from sharding_lab.planner import PlanRequest


def simulated_requests(labs: Iterable[Lab]) -> dict[str, PlanRequest]:
    """Every configuration the labs show at scale that the simulation can answer (plan_command's rule:
    FSDP2 only, and no CPU offload, whose host memory the CPU-run simulation cannot tell from the
    device's), once each."""
    requests: dict[str, PlanRequest] = {}
    for lab in labs:
        for scale in SCALES:
            for request in lab_requests(lab, scale).values():
                if simulation_unavailable(request) is None:
                    requests.setdefault(request_key(request), request)
    return requests


def write_simulated_figures(labs: Iterable[Lab], on_progress: Callable[[str], None] | None = None) -> dict:
    """Simulate every configuration and write SIMULATED_FIGURES; returns what was written."""
    figures = {}
    started = time.perf_counter()
    requests = simulated_requests(labs)
    for i, (key, request) in enumerate(requests.items(), start=1):
        if on_progress:
            on_progress(f"{i}/{len(requests)}: {key}")
        simulation = simulate(run_config_for(request))
        figures[key] = {
            "peak_bytes": simulation.peak_bytes,
            "peak_breakdown": simulation.peak_breakdown,
            "model_states_bytes": simulation.model_states["total"],
            "method": simulation.method,
            "wall_s": round(simulation.wall_s, 2),
        }
    document = {
        "generated_on": date.today().isoformat(),
        "torch_version": str(torch.__version__),
        "seconds": round(time.perf_counter() - started, 1),
        "figures": figures,
    }
    atomic_write.write_text(SIMULATED_FIGURES, json.dumps(document, indent=1, sort_keys=True) + "\n")
    return document
