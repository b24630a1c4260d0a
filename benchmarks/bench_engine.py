"""The sharding_lab engine: what instrumentation costs a step, and what one measurement costs end to end.

- instrumented / plain step time: the same FSDP (zero3) training step on 2 CPU ranks, plain, under the
  collective tracker alone, under its dispatch reference (`comm-dispatch`: a TorchDispatchMode, a
  Python call on every op, which is what the tracker used to cost), and under the collective and
  memory trackers together (what the measured step runs under; the memory tracker is a
  TorchDispatchMode too). Reported for `tiny` and for a wider model (`tiny` at width 256, 128 tokens),
  where ops are bigger and a per-op cost matters less.
- wall time of `sharding-lab measure --strategy zero3 --world-size 2 --json` on `tiny`, from a fresh
  process: Python and torch start-up in the parent and both ranks, process group, warm-up, measured
  step, timed steps.

The machine is shared and noisy, so each ratio is the median of per-round ratios: a round times every
mode once (for `tiny`, over a few steps in a row), in an order that rotates from round to round, both
ranks starting together, and takes the slower rank's time (a synchronous step goes at its pace).
Warm-up rounds come first. The detail gives the spread and the ratio of CPU times.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from benchmarks.figure import Figure

WARMUP_ROUNDS = 2  # FSDP's lazy init, Adam's state, every mode's first use
ROUNDS = 30
# Model name -> (GPTConfig overrides, tracked steps per timed sample). A `tiny` step (~35 ms, 14
# blocking collectives) stalls whenever either rank loses its core; several per sample average that out
# (8: per-round quartiles about 0.93-1.09 of the ratio, where 4 gave 0.99-1.19 and once a median of 1.108).
MODELS: dict[str, tuple[dict, int]] = {
    "tiny": ({}, 8),
    "tiny at width 256": ({"n_embd": 256, "n_head": 4, "block_size": 128}, 1),
}
MODES = ("plain", "comm", "comm-dispatch", "comm+memory")
TARGETS = {"comm": "<= 1.10"}


def _bench_on_rank(ctx, models: dict[str, tuple[dict, int]]) -> dict[str, dict[str, list[tuple[float, float]]]]:
    import torch

    torch.set_num_threads(1)
    return {name: _time_modes(ctx, overrides, steps) for name, (overrides, steps) in models.items()}


def _time_modes(ctx, overrides: dict, steps: int) -> dict[str, list[tuple[float, float]]]:
    """Per mode, this rank's step time in each timed round: (wall, this process's CPU time), the mean
    of `steps` steps, each tracked on its own."""
    import gc

    import torch

    from sharding_lab.engine.comm import CommTracker
    from sharding_lab.engine.memory import MemoryTracker
    from sharding_lab.engine.model import GPT, config_for
    from sharding_lab.engine.parallelize import parallelize

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
    def tracked(method: str, memory: bool = False) -> Iterator[None]:
        # Built and removed inside the timed region: the measured step pays for its hooks too.
        with MemoryTracker(model, optimizer, ctx.device) if memory else _nothing():
            tracker = CommTracker(model, ctx.world_size, method=method, wait_for_gloo=memory)  # as measure does
            with tracker:
                yield
            tracker.remove_hooks()

    modes: dict[str, Callable[[], AbstractContextManager]] = {
        "plain": _nothing,
        "comm": lambda: tracked("wrap"),
        "comm-dispatch": lambda: tracked("dispatch"),
        "comm+memory": lambda: tracked("wrap", memory=True),
    }
    durations: dict[str, list[tuple[float, float]]] = {name: [] for name in modes}
    for round_index in range(WARMUP_ROUNDS + ROUNDS):
        shift = round_index % len(MODES)
        for name in MODES[shift:] + MODES[:shift]:  # rotated, so no mode always follows another
            gc.collect()  # not inside a timed step
            torch.distributed.barrier()
            started, cpu_started = time.perf_counter(), time.process_time()
            for _ in range(steps):
                with modes[name]():
                    step()
            if round_index >= WARMUP_ROUNDS:
                wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
                durations[name].append((wall / steps, cpu / steps))
    return durations


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def _quartiles(values: list[float]) -> tuple[float, float]:
    q1, _, q3 = statistics.quantiles(values, n=4)
    return q1, q3


def _step_time_figures() -> list[Figure]:
    from sharding_lab.engine.launch import run_ranks

    per_rank = run_ranks(_bench_on_rank, 2, MODELS, timeout_s=900)
    figures = []
    for name in MODELS:
        # Each round's step goes at the slower rank's pace. CPU time (a rank's own work, not its
        # waiting for the other or for a core) is less noisy on a shared machine: shown beside it.
        rounds = {mode: [max(r[name][mode][i][0] for r in per_rank) for i in range(ROUNDS)] for mode in MODES}
        cpu = {mode: [max(r[name][mode][i][1] for r in per_rank) for i in range(ROUNDS)] for mode in MODES}
        plain = rounds["plain"]
        for mode in MODES[1:]:
            ratios = [t / p for t, p in zip(rounds[mode], plain, strict=True)]
            cpu_ratio = statistics.median(t / p for t, p in zip(cpu[mode], cpu["plain"], strict=True))
            q1, q3 = _quartiles(ratios)
            figures.append(
                Figure(
                    f"engine: {mode} tracked / plain step time, zero3 {name}",
                    statistics.median(ratios),
                    "x",
                    TARGETS.get(mode, ""),
                    f"median of {ROUNDS} rounds of {MODELS[name][1]} step(s) (quartiles {q1:.3f}-{q3:.3f}, range {min(ratios):.3f}-"
                    f"{max(ratios):.3f}); {statistics.median(rounds[mode]) * 1000:.1f} ms against "
                    f"{statistics.median(plain) * 1000:.1f} ms, 2 CPU ranks; CPU time {cpu_ratio:.3f}x",
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
