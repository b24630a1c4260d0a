"""The simulator held against reality: the same configuration simulated (FakeTensorMode, fake process
group: no memory at all) and measured as a rank view (rank 0 of N in one process: every allocation
real), side by side.

On CPU the tracker is the measurement, and the simulated peak equals the rank view's to the byte. On
CUDA the rank view also reports `torch.cuda.max_memory_allocated`, which the caching allocator
rounds up and which counts cuBLAS's workspaces (no tensor holds them), and the simulated peak plus those
workspaces must come within `CUDA_TOLERANCE` of it. `scripts/gpu-check` runs
the CUDA comparison and writes `exports/gpu-results.json`.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

from sharding_lab.engine.measure import measure_many
from sharding_lab.run_config import Placement, RunConfig

CUDA_TOLERANCE = 0.03

# cuBLAS keeps a workspace in the caching allocator for each thread and stream that runs a matmul: in a
# training step two, the forward's (the main thread) and the backward's (autograd's device thread), both
# on the default stream. No tensor holds them, so neither the tracker nor the simulation sees them; on the
# H200 they made up 64 MiB of the allocator's peak (two 32 MiB blocks after one forward and backward).
MATMUL_THREADS = 2


def cublas_workspace_bytes(capability: tuple[int, int], config: str | None = None) -> int:
    """One cuBLAS workspace, as torch sizes it (aten/src/ATen/cuda/CublasHandlePool.cpp): the sum of
    CUBLAS_WORKSPACE_CONFIG's `:KiB:COUNT` pairs when set, else 32 MiB on Hopper and later (compute
    capability 9, 10 or 12) and `:4096:2:16:8` (8 MiB + 128 KiB) before them."""
    if config:
        pairs = re.findall(r":([0-9]+):([0-9]+)", config)
        if pairs:
            return sum(int(kib) * 1024 * int(count) for kib, count in pairs)
    return 32 * 1024 * 1024 if capability[0] in (9, 10, 12) else 4096 * 1024 * 2 + 16 * 1024 * 8


def cuda_workspaces_here() -> int:
    """What this machine's GPU 0 keeps in cuBLAS workspaces during a training step (derived)."""
    import torch

    return MATMUL_THREADS * cublas_workspace_bytes(torch.cuda.get_device_capability(0),
                                                   os.environ.get("CUBLAS_WORKSPACE_CONFIG"))


@dataclass(frozen=True)
class Case:
    size: str
    world_size: int
    seq: int
    batch: int
    mixed_precision: bool
    options: tuple[tuple[str, Any], ...] = ()  # more RunConfig.of keywords: strategy, activation_checkpointing, ...

    def run_config(self, device: str, placement: Placement = Placement.RANK_VIEW) -> RunConfig:
        options = dict(self.options)
        return RunConfig.of(
            options.pop("strategy", "zero3"), world_size=self.world_size, size=self.size, seq_len=self.seq,
            batch_size=self.batch, mixed_precision=self.mixed_precision, device=device, placement=placement,
            timed_steps=1, **options,
        )


# Three sizes, two world sizes, fp32 and bf16, two sequence lengths: six configurations for a GPU; then
# each engine option the simulation takes, on gpt2-small at 8 ranks.
CUDA_CASES: tuple[Case, ...] = (
    Case("gpt2-small", 8, 512, 4, False),
    Case("gpt2-small", 64, 128, 4, True),
    Case("gpt2-medium", 8, 512, 4, True),
    Case("gpt2-medium", 64, 128, 4, False),
    Case("1b", 8, 128, 4, False),
    Case("1b", 64, 512, 4, True),
    Case("gpt2-small", 8, 512, 4, True, (("activation_checkpointing", True),)),
    Case("gpt2-small", 8, 512, 4, False, (("strategy", "zero2"),)),
    Case("gpt2-small", 8, 512, 4, True, (("replicas", 2),)),
    Case("gpt2-small", 8, 256, 2, False, (("grad_accum_steps", 2),)),
    # A tied head where the end of backward holds the peak: is the tied gradients' sum out of place on CUDA too?
    Case("gpt2-small", 8, 128, 1, False, (("model_overrides", (("tied", True),)),)),
)
# The same comparison at CPU sizes, for CI.
CPU_CASES: tuple[Case, ...] = (
    Case("tiny", 4, 32, 2, False),
    Case("mini", 8, 64, 2, False),
    Case("mini", 8, 32, 2, True),
    Case("mini", 8, 32, 2, False, (("activation_checkpointing", True),)),
    Case("mini", 4, 32, 2, False, (("replicas", 2), ("grad_accum_steps", 2))),
)


def case_id(case: Case) -> str:
    """A readable test id: size, ranks, sequence, dtype and any option."""
    options = "".join(f"-{name}={value}" for name, value in case.options)
    return f"{case.size}-N{case.world_size}-seq{case.seq}-{'bf16' if case.mixed_precision else 'fp32'}{options}"


@dataclass(frozen=True)
class Comparison:
    case: Case
    simulated_peak: int  # bytes, the simulator's prediction for rank 0
    tracked_peak: int  # bytes, the tracker over the rank view's real tensors
    cuda_peak: int | None  # bytes, torch.cuda.max_memory_allocated of the rank view (CUDA only)
    simulated_model_states: int
    measured_model_states: int  # exact local tensors (without Adam's step counters)
    measured_step_counters: int = 0  # Adam's step counters, read off the tensors (the simulation counts them)
    cuda_workspaces: int = 0  # bytes, derived: cuBLAS's workspaces, which the allocator counts and no tensor shows

    @property
    def predicted_cuda_peak(self) -> int:
        """The simulated peak plus cuBLAS's workspaces: what the allocator should report."""
        return self.simulated_peak + self.cuda_workspaces

    @property
    def tracked_error(self) -> float:
        """The simulated peak against the tracker's over real tensors."""
        return abs(self.simulated_peak - self.tracked_peak) / self.tracked_peak

    @property
    def cuda_error(self) -> float | None:
        if not self.cuda_peak:
            return None
        return abs(self.predicted_cuda_peak - self.cuda_peak) / self.cuda_peak

    def to_json(self) -> dict:
        return {**asdict(self), "predicted_cuda_peak": self.predicted_cuda_peak, "cuda_error": self.cuda_error,
                "tracked_error": self.tracked_error}


def simulate_in_fresh_processes(configs: Sequence[RunConfig], parallel: int | None = None) -> list[dict]:
    """Each configuration simulated in a process of its own (the simulation needs a process without a
    process group), up to `parallel` at once (default: one per CPU): their `to_json()`, in order."""
    code = (
        "import json, pickle, sys; from sharding_lab.engine.simulate import simulate; "
        "print(json.dumps(simulate(pickle.loads(sys.stdin.buffer.read())).to_json()))"
    )

    def simulate_one(config: RunConfig) -> dict:
        completed = subprocess.run(
            [sys.executable, "-W", "ignore", "-c", code], input=pickle.dumps(config), capture_output=True
        )
        if completed.returncode != 0:
            raise RuntimeError(f"simulating {config.label}: {completed.stderr.decode().strip()[-2000:]}")
        return json.loads(completed.stdout.decode().strip().splitlines()[-1])

    with ThreadPoolExecutor(max_workers=parallel or os.cpu_count() or 1) as pool:
        return list(pool.map(simulate_one, configs))


def compare(
    case: Case,
    device: str,
    timeout_s: float = 600.0,
    placement: Placement = Placement.RANK_VIEW,
    simulated: dict | None = None,
) -> Comparison:
    """`case` simulated and measured (by default as a rank view; Placement.RANKS: real ranks, gloo on CPU).
    `simulated`: its simulation's `to_json()`, when already run (simulate_in_fresh_processes)."""
    config = case.run_config(device, placement)
    if simulated is None:
        (simulated,) = simulate_in_fresh_processes([config])
    rank0 = measure_many([config], timeout_s=timeout_s)[0].ranks[0]
    return Comparison(
        case,
        simulated["peak_bytes"],
        rank0.peak_bytes,
        rank0.cuda_max_memory_allocated,
        simulated["model_states"]["total"],
        rank0.model_states_bytes,
        rank0.optimizer_scalar_bytes,
        cuda_workspaces_here() if device == "cuda" else 0,
    )
