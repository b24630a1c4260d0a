"""`sharding-lab serve-labs`: run labs on warm ranks, one request per line, for as long as stdin is open.

The study app's lab worker owns one of these as a child process (the web process itself never imports
torch). Each request is one JSON line on stdin, each answer one JSON line on stdout:

    {"lab": "reshard-after-forward", "world_size": 2, "device": "cpu"}
        ->   {"result": {the `sharding-lab run --json` object}}
        or   {"error": "rank 1 failed: ..."}

"device" is one of run_config.DEVICES, "cpu" when absent.

The ranks stay up between requests (`pool.Pools`: a pool per world size and device, started on its first
lab and ended after `idle_timeout_s` without one), so a lab costs its own training steps. A rank that fails or
hangs ends that request with an error; its pool is torn down and the next request starts a fresh one.
The server ends when stdin closes, and when its parent dies, even by SIGKILL: the kernel then sends it
SIGTERM (Linux), which unwinds it as a stop does, ranks ended and their folders removed. Killed itself with
SIGKILL, its ranks die with it (their own parent-death signal) and the next pool to start removes its folders.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import IO

from sharding_lab.engine import launch
from sharding_lab.engine.pool import IDLE_TIMEOUT_S, Pools
from sharding_lab.labs.registry import LABS
from sharding_lab.parent_death import die_with_parent
from sharding_lab.run_config import DEVICES


def serve(requests: IO[str], answers: IO[str], *, idle_timeout_s: float | None = IDLE_TIMEOUT_S,
          timeout_s: float = 600.0) -> None:
    """Answer each request line until `requests` ends; every pool is gone when it returns."""
    with Pools(idle_timeout_s=idle_timeout_s) as pools:
        for line in requests:
            if not line.strip():
                continue
            answers.write(json.dumps(answer(line, pools, timeout_s)) + "\n")
            answers.flush()


def answer(line: str, pools: Pools, timeout_s: float) -> dict:
    from sharding_lab.engine.run_labs import run_lab

    shape = 'a JSON object such as {"lab": "what-fsdp-shards", "world_size": 2, "device": "cpu"}'
    try:
        request = json.loads(line)
    except (ValueError, RecursionError) as error:
        return {"error": f"bad request {line.strip()[:200]!r}: not JSON ({error}); send {shape}"}
    if not isinstance(request, dict):
        return {"error": f"bad request {line.strip()[:200]!r}: {type(request).__name__}, not {shape}"}
    if missing := [key for key in ("lab", "world_size") if key not in request]:
        return {"error": f"bad request {line.strip()[:200]!r}: no {' or '.join(map(repr, missing))}; send {shape}"}
    lab_id, world_size, device = request["lab"], request["world_size"], request.get("device", "cpu")
    if not isinstance(lab_id, str) or lab_id not in LABS:
        return {"error": f"unknown lab {lab_id!r}"}
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 2:
        return {"error": f"world size must be a whole number of at least 2, got {world_size!r}"}
    if not isinstance(device, str) or device not in DEVICES:
        return {"error": f"unknown device {device!r}; choose one of {', '.join(DEVICES)}"}
    try:
        return {"result": run_lab(lab_id, world_size, device=device, pools=pools, timeout_s=timeout_s)}
    except Exception as error:  # noqa: BLE001 - a rank failed or hung, or the lab's code raised: an answer
        return {"error": f"the engine failed: {launch.for_user(error)}"}


def main(idle_timeout_s: float | None, timeout_s: float) -> int:
    # SIGTERM, not SIGKILL: `sharding-lab` turns it into an exit that unwinds (launch.sigterm_unwinds), so the
    # pools end their ranks and remove their folders.
    die_with_parent(os.getppid(), signal.SIGTERM)
    # Ranks and torch print to stderr; stdout carries answers only.
    answers = sys.stdout
    sys.stdout = sys.stderr
    serve(sys.stdin, answers, idle_timeout_s=idle_timeout_s, timeout_s=timeout_s)
    return 0
