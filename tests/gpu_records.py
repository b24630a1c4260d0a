"""What the gpu tests hand scripts/gpu-check: each figure appended as a JSON line to
$GPU_RESULTS_DIR/NAME.jsonl (held or not), which scripts/gpu_results.py gathers into
exports/gpu-results.json. Outside gpu-check nothing is written."""

from __future__ import annotations

import json
import os
from pathlib import Path


def record(name: str, row: dict) -> None:
    if folder := os.environ.get("GPU_RESULTS_DIR"):
        with (Path(folder) / f"{name}.jsonl").open("a") as out:
            out.write(json.dumps(row) + "\n")
