"""The sharding_lab engine: what instrumentation costs a step, and what one measurement costs end to end.

- instrumented / plain step time: the same FSDP (zero3) training step on 2 CPU ranks, plain, under the
  collective tracker alone, and under the collective and memory trackers together (what the measured
  step runs under). Both trackers are TorchDispatchModes, so every op pays a Python call; the ratio
  falls as ops get bigger. Reported for `tiny` and for a wider model (`tiny` at width 256, 128 tokens).
- wall time of `sharding-lab measure --strategy zero3 --world-size 2 --json` on `tiny`, from a fresh
  process: Python and torch start-up in the parent and both ranks, process group, warm-up, measured
  step, timed steps.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from benchmarks.figure import Figure

STEPS = 9  # timed steps per mode, interleaved, after two warm-up steps; the median is reported
MODELS = {
    "tiny": {},
    "tiny at width 256": {"n_embd": 256, "n_head": 4, "block_size": 128},
}


def _bench_on_rank(ctx, models: dict[str, dict]) -> dict[str, dict[str, float]]:
    import torch

    torch.set_num_threads(1)
    return {name: _time_modes(ctx, overrides) for name, overrides in models.items()}


def _time_modes(ctx, overrides: dict) -> dict[str, float]:
    import torch

    from sharding_lab.comm import CommTracker
    from sharding_lab.memory import MemoryTracker
    from sharding_lab.model import GPT, config_for
    from sharding_lab.parallelize import parallelize

    config = config_for("tiny", **overrides)
    torch.manual_seed(0)
    with torch.device("meta"):
        model = GPT(config)
    model, make_optimizer = parallelize(model, "zero3", ctx.mesh)
    model.to_empty(device=ctx.device)
    with torch.no_grad():
        model.init_weights()
    optimizer = make_optimizer()
    idx = torch.randint(0, config.vocab_size, (2, config.block_size))

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        model(idx, idx).backward()
        optimizer.step()

    @contextmanager
    def plain():
        yield

    @contextmanager
    def comm_only():
        tracker = CommTracker(model, ctx.world_size)
        with tracker:
            yield
        tracker.remove_hooks()

    @contextmanager
    def comm_and_memory():
        with MemoryTracker(model, optimizer, ctx.device):
            with comm_only():
                yield

    modes = {"plain": plain, "comm": comm_only, "comm+memory": comm_and_memory}
    durations: dict[str, list[float]] = {name: [] for name in modes}
    step()
    step()  # warm-up: FSDP's lazy init and Adam's state
    for _ in range(STEPS):
        for name, mode in modes.items():  # interleaved, so drift in machine load hits every mode alike
            torch.distributed.barrier()
            started = time.perf_counter()
            with mode():
                step()
            durations[name].append(time.perf_counter() - started)
    return {name: statistics.median(times) for name, times in durations.items()}


def _step_time_figures() -> list[Figure]:
    from sharding_lab.launch import run_ranks

    per_rank = run_ranks(_bench_on_rank, 2, MODELS, timeout_s=600)
    figures = []
    for name in MODELS:
        plain = max(r[name]["plain"] for r in per_rank)
        for mode, target in (("comm", "<= 1.10"), ("comm+memory", "")):
            instrumented = max(r[name][mode] for r in per_rank)
            figures.append(
                Figure(
                    f"engine: {mode} tracked / plain step time, zero3 {name}",
                    instrumented / plain,
                    "x",
                    target,
                    f"{instrumented * 1000:.1f} ms against {plain * 1000:.1f} ms, 2 CPU ranks, median of {STEPS}",
                )
            )
    return figures


def _measure_wall_time() -> Figure:
    command = [str(Path(sys.executable).parent / "sharding-lab"), "measure", "--strategy", "zero3",
               "--world-size", "2", "--json"]
    started = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, timeout=600)
    elapsed = time.perf_counter() - started
    return Figure("engine: 2-rank tiny measure, wall time from a fresh process", elapsed, "s", "<= 15",
                  " ".join(command[1:]))


def run() -> list[Figure]:
    return [_measure_wall_time(), *_step_time_figures()]
