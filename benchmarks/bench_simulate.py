"""A 70B-shaped GPT at 1024 ranks, simulated on this machine's CPU: wall time and peak host memory."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from benchmarks.figure import Figure

SIZE, WORLD_SIZE, BATCH, SEQ = "70b", 1024, 1, 128

# A fresh process, so its peak RSS is the simulation's own and not this runner's.
_SIMULATE = (
    "import json, sys; from sharding_lab.engine.simulate import simulate; "
    f"print(json.dumps(simulate({SIZE!r}, {WORLD_SIZE}, batch={BATCH}, seq={SEQ})))"
)


def run() -> list[Figure]:
    started = time.perf_counter()
    completed = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", _SIMULATE], capture_output=True, text=True, check=True, timeout=600
    )
    process_wall_s = time.perf_counter() - started
    result = json.loads(completed.stdout)
    per_rank = result["per_rank"]
    gib = 1024**3
    setting = f"{SIZE} ({result['num_params'] / 1e9:.1f}B params) at {WORLD_SIZE} ranks, batch {BATCH} x seq {SEQ}"
    return [
        Figure(
            name=f"simulate {SIZE} at {WORLD_SIZE} ranks: wall time incl. process start",
            value=process_wall_s,
            unit="s",
            target="<= 60",
            detail=(
                f"{setting}; {result['wall_s']:.1f} s inside simulate(); rank 0 per step: model states "
                f"{per_rank['model_states'] / gib:.2f} GiB (matches analytic: "
                f"{result['model_states_match_prediction']}), activations {per_rank['activations'] / gib:.2f} GiB, "
                f"peak {per_rank['peak'] / gib:.2f} GiB"
            ),
        ),
        Figure(
            name=f"simulate {SIZE} at {WORLD_SIZE} ranks: peak host RSS",
            value=result["peak_rss_bytes"] / 2**20,
            unit="MiB",
            target="",
            detail="ru_maxrss of the simulating process, torch import included",
        ),
    ]
