"""The engine runs the sharding tests read: one 2-rank launch, measured once per test session.

Starting ranks and importing torch is the slow part, so every configuration the tests need runs in
the same launch, one after another, and test modules share the result through `measurements()`.
"""

from __future__ import annotations

import functools

WORLD_SIZE = 2

RUNS: dict[str, dict] = {
    "ddp": {"strategy": "ddp", "check_gradients": True},
    "zero1": {"strategy": "zero1", "check_gradients": True},
    "zero2": {"strategy": "zero2", "check_gradients": True},
    "zero3": {"strategy": "zero3", "check_gradients": True},
    "zero3 no prefetch": {"strategy": "zero3", "prefetch": False},
    "zero3 reshard off": {"strategy": "zero3", "reshard_after_forward": False},
    # vocab 129 rows do not split in two: FSDP pads wte and lm_head to 130 rows.
    "zero3 padded": {"strategy": "zero3", "model_overrides": {"vocab_size": 129}, "check_gradients": True},
    # FSDP made to sum gradients instead of averaging them: the parity check must fail.
    "zero3 summing": {"strategy": "zero3", "gradient_divide_factor": 1.0, "check_gradients": True},
    "zero3 bf16": {"strategy": "zero3", "mixed_precision": True},
}


@functools.cache
def measurements() -> dict[str, dict]:
    from sharding_lab.engine.measure import measure_many

    runs = [{"timed_steps": 1, **run} for run in RUNS.values()]
    return dict(zip(RUNS, measure_many(runs, WORLD_SIZE, timeout_s=300), strict=True))
