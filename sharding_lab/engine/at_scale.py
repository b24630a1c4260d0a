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

from sharding_lab.engine.simulate import simulate
from sharding_lab.labs.at_scale import SCALES, SIMULATED_FIGURES, lab_requests, request_key
from sharding_lab.labs.base import Lab
from sharding_lab.planner import PlanRequest
from sharding_lab.run_config import RunConfig


def run_config_for(request: PlanRequest) -> RunConfig:
    """The engine configuration a plan request describes (a named model size)."""
    if request.model.name is None:
        raise ValueError("the at-scale simulation takes a named model size")
    return RunConfig.of(
        request.strategy,
        world_size=request.mesh.world_size,
        replicas=request.mesh.replicas,
        size=request.model.name,
        batch_size=request.micro_batch,
        seq_len=request.seq,
        mixed_precision=request.mixed_precision,
        activation_checkpointing=request.activation_checkpointing,
        cpu_offload=request.cpu_offload,
        grad_accum_steps=request.grad_accum_steps,
        prefetch=request.prefetch,
    )


def simulated_requests(labs: Iterable[Lab]) -> dict[str, PlanRequest]:
    """Every FSDP configuration the labs show at scale, once each (the simulation builds FSDP2 only).
    CPU offload is left to the planner: the simulation runs on the CPU, where the host memory the
    offloaded states move to is the same device, so its peak would count them as GPU memory."""
    requests: dict[str, PlanRequest] = {}
    for lab in labs:
        for scale in SCALES:
            for request in lab_requests(lab, scale).values():
                if request.strategy.fully_sharded and not request.cpu_offload:
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
    SIMULATED_FIGURES.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return document
