"""The simulator held against reality: the same configuration simulated (FakeTensorMode, fake process
group: no memory at all) and measured as a rank view (rank 0 of N in one process: every allocation
real), side by side.

On CPU the tracker is the measurement, and the simulated peak equals the rank view's to the byte. On
CUDA the rank view also reports `torch.cuda.max_memory_allocated`, which the caching allocator
rounds up, and the simulated peak must come within `CUDA_TOLERANCE` of it. `scripts/gpu-check` runs
the CUDA comparison and writes `exports/gpu-results.json`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict, dataclass

from sharding_lab.engine.measure import measure_many
from sharding_lab.run_config import Placement, RunConfig

CUDA_TOLERANCE = 0.03


@dataclass(frozen=True)
class Case:
    size: str
    world_size: int
    seq: int
    batch: int
    mixed_precision: bool


# Three sizes, two world sizes, fp32 and bf16, two sequence lengths: six configurations for a GPU.
CUDA_CASES: tuple[Case, ...] = (
    Case("gpt2-small", 8, 512, 4, False),
    Case("gpt2-small", 64, 128, 4, True),
    Case("gpt2-medium", 8, 512, 4, True),
    Case("gpt2-medium", 64, 128, 4, False),
    Case("1b", 8, 128, 4, False),
    Case("1b", 64, 512, 4, True),
)
# The same comparison at CPU sizes, for CI.
CPU_CASES: tuple[Case, ...] = (
    Case("tiny", 4, 32, 2, False),
    Case("mini", 8, 64, 2, False),
    Case("mini", 8, 32, 2, True),
)


@dataclass(frozen=True)
class Comparison:
    case: Case
    simulated_peak: int  # bytes, the simulator's prediction for rank 0
    tracked_peak: int  # bytes, the tracker over the rank view's real tensors
    cuda_peak: int | None  # bytes, torch.cuda.max_memory_allocated of the rank view (CUDA only)
    simulated_model_states: int
    measured_model_states: int  # exact local tensors (without Adam's step counters)

    @property
    def cuda_error(self) -> float | None:
        if not self.cuda_peak:
            return None
        return abs(self.simulated_peak - self.cuda_peak) / self.cuda_peak

    def to_json(self) -> dict:
        return {**asdict(self), "cuda_error": self.cuda_error}


def simulate_in_a_fresh_process(case: Case) -> dict:
    """The simulation needs a process without a process group: one of its own."""
    code = (
        "import json; from sharding_lab.engine.simulate import simulate; "
        f"print(json.dumps(simulate({case.size!r}, {case.world_size}, batch={case.batch}, seq={case.seq}, "
        f"mixed_precision={case.mixed_precision})))"
    )
    completed = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True)
    if completed.returncode != 0:
        raise RuntimeError(f"simulating {case}: {completed.stderr.strip()[-2000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def compare(case: Case, device: str, timeout_s: float = 600.0) -> Comparison:
    simulated = simulate_in_a_fresh_process(case)
    config = RunConfig.of(
        "zero3", world_size=case.world_size, size=case.size, seq_len=case.seq, batch_size=case.batch,
        mixed_precision=case.mixed_precision, device=device, placement=Placement.RANK_VIEW, timed_steps=1,
    )
    rank0 = measure_many([config], timeout_s=timeout_s)[0].ranks[0]
    return Comparison(
        case,
        simulated["per_rank"]["peak"],
        rank0.peak_bytes,
        rank0.cuda_max_memory_allocated,
        simulated["per_rank"]["model_states"],
        rank0.model_states_bytes,
    )
