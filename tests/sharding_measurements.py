"""The engine runs the sharding tests read: one 2-rank launch, measured once per test session.

Starting ranks and importing torch is the slow part, so every configuration the tests need runs in
the same launch, one after another, and test modules share the result. `measurements()` gives each
run as its JSON (the `measure --json` contract the tests hold), `typed()` as `Measurement`s.
"""

from __future__ import annotations

import functools

from sharding_lab.measurement import Measurement
from sharding_lab.run_config import RunConfig

WORLD_SIZE = 2
# A tiny GPT with a tied head and a wide vocabulary, so the end of backward (the tied weight's two gradients
# summed) holds the peak: measured on real ranks in test_simulate, planned in test_planner.
WIDE_TIED = (("n_embd", 64), ("n_head", 2), ("n_layer", 2), ("tied", True), ("vocab_size", 8192))
HEAVY_ROOT = (("vocab_size", 2048),)


def _run(strategy: str, **options) -> RunConfig:
    return RunConfig.of(strategy, world_size=WORLD_SIZE, timed_steps=1, **options)


RUNS: dict[str, RunConfig] = {
    "ddp": _run("ddp", check_gradients=True),
    "zero1": _run("zero1", check_gradients=True),
    "zero2": _run("zero2", check_gradients=True),
    "zero3": _run("zero3", check_gradients=True),
    "zero3 no prefetch": _run("zero3", prefetch=False),
    "zero3 reshard off": _run("zero3", reshard_after_forward=False),
    # vocab 129 rows do not split in two: FSDP pads wte and lm_head to 130 rows.
    "zero3 padded": _run("zero3", model_overrides={"vocab_size": 129}, check_gradients=True),
    # FSDP made to sum gradients instead of averaging them: the parity check must fail.
    "zero3 summing": _run("zero3", gradient_divide_factor=1.0, check_gradients=True),
    "zero3 bf16": _run("zero3", mixed_precision=True),
    # A vocabulary of 2,048 makes the root unit (embeddings and head) about ten blocks' worth, as real
    # vocabularies do: the step's most gathered bytes are then the root's own all-gather.
    "zero3 heavy root": _run("zero3", model_overrides=HEAVY_ROOT),
    "zero3 heavy root no prefetch": _run("zero3", model_overrides=HEAVY_ROOT, prefetch=False),
}


@functools.cache
def typed() -> dict[str, Measurement]:
    from sharding_lab.engine.measure import measure_many

    return dict(zip(RUNS, measure_many(list(RUNS.values()), timeout_s=300), strict=True))


@functools.cache
def measurements() -> dict[str, dict]:
    return {key: m.to_json() for key, m in typed().items()}
