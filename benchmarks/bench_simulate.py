"""The FSDP2 simulation on this machine's CPU: a 70B-shaped GPT at 1024 ranks and 7b at 8, each
simulated block by block (full) and from 3 and 4 blocks (extrapolated), in the same run.

Targets: the extrapolated 70B at 1024 ranks answers within 5 s, process start and torch's import
included (what `plan --simulate` costs), and takes at most 1/8 of the full simulation's time inside
`simulate()` (the import is the same for both, so the ratio leaves it out). Both must give the same
bytes: a figure that does not is reported as missed.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import time

from benchmarks.figure import Figure

BATCH, SEQ = 1, 128
CASES = (("70b", 1024), ("7b", 8))
FAST_TARGET_S = 5.0
RATIO_TARGET = 1 / 8

# A fresh process per simulation, so its wall time includes start and import, and its peak RSS is its own.
_SIMULATE = (
    "import json, pickle, sys; from sharding_lab.engine.simulate import simulate; "
    "config, method = pickle.loads(sys.stdin.buffer.read()); "
    "print(json.dumps(simulate(config, method=method).to_json()))"
)


def _simulate(size: str, world_size: int, method: str) -> tuple[float, dict]:
    from sharding_lab.run_config import RunConfig

    config = RunConfig.of("zero3", world_size=world_size, size=size, batch_size=BATCH, seq_len=SEQ)
    started = time.perf_counter()
    completed = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", _SIMULATE],
        input=pickle.dumps((config, method)), capture_output=True, check=True, timeout=600,
    )
    return time.perf_counter() - started, json.loads(completed.stdout.decode())


def _same_bytes(full: dict, fast: dict) -> bool:
    keys = ("peak_bytes", "peak_breakdown", "category_peaks", "after_forward", "after_step")
    return all(full[k] == fast[k] for k in keys)


def run() -> list[Figure]:
    gib = 1024**3
    figures = []
    for size, world_size in CASES:
        full_process_s, full = _simulate(size, world_size, "full")
        fast_process_s, fast = _simulate(size, world_size, "extrapolated")
        same = _same_bytes(full, fast)
        ratio = fast["wall_s"] / full["wall_s"]
        states = fast["model_states"]
        setting = (
            f"{size} ({fast['num_params'] / 1e9:.1f}B params) at {world_size} ranks, batch {BATCH} x seq {SEQ}: "
            f"peak {fast['peak_bytes'] / gib:.2f} GiB, model states {states['total'] / gib:.2f} GiB, "
            f"activations after forward {fast['activations_after_forward'] / gib:.2f} GiB"
        )
        label = f"simulate {size} at {world_size} ranks"
        figures += [
            Figure(
                name=f"{label}: full, incl. process start",
                value=full_process_s,
                unit="s",
                target="",
                detail=f"{full['wall_s']:.2f} s inside simulate(); peak host RSS "
                f"{full['peak_rss_bytes'] / 2**20:.0f} MiB; {setting}",
            ),
            Figure(
                name=f"{label}: extrapolated, incl. process start",
                value=fast_process_s,
                unit="s",
                target=f"<= {FAST_TARGET_S:g}" if size == "70b" else "",
                detail=f"{fast['wall_s']:.2f} s inside simulate(); peak host RSS "
                f"{fast['peak_rss_bytes'] / 2**20:.0f} MiB; {fast['method']}",
            ),
            Figure(
                name=f"{label}: extrapolated / full inside simulate()",
                value=ratio if same else float("inf"),
                unit="x",
                target=f"<= {RATIO_TARGET:.3f}" if size == "70b" else "",
                detail=f"{fast['wall_s']:.2f} s / {full['wall_s']:.2f} s = 1/{1 / ratio:.1f}; the same bytes "
                f"(peak, its breakdown, each category's peak, after forward, after the step): "
                f"{'yes' if same else 'NO'}",
            ),
        ]
    return figures
