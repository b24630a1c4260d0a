"""The CUDA path: NCCL ranks, the tracker cross-checked with the caching allocator, overlap from the
profiler. Skips without CUDA; run it where a GPU is available."""

from __future__ import annotations

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def test_measure_on_cuda_with_nccl():
    from sharding_lab.engine.measure import measure_many
    from sharding_lab.run_config import RunConfig

    world_size = min(2, torch.cuda.device_count())
    runs = [RunConfig.of(s, world_size=world_size, device="cuda", check_gradients=True) for s in ("zero3", "ddp")]
    for m in (measurement.to_json() for measurement in measure_many(runs, timeout_s=300)):
        assert m["config"]["backend"] == "nccl" and m["config"]["device"].startswith("cuda")
        assert m["gradient_parity"]["holds"], m["gradient_parity"]
        for rank in m["memory"]["per_rank"]:
            allocated = rank["cuda_max_memory_allocated"]
            # The allocator saw at least what the tracker did (it rounds blocks up), within reason.
            assert allocated is not None and allocated >= rank["model_states_bytes"]
            assert allocated >= 0.5 * rank["peak_bytes"]
        overlap = m["overlap"]
        assert overlap is not None and overlap["compute_kernels"] > 0
        if world_size > 1:
            assert overlap["comm_kernels"] > 0
