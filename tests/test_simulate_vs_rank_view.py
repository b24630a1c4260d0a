"""The simulator against the rank view of the same configuration: byte-equal on CPU's tracker, and
within 3% of CUDA's allocator where a GPU is lent."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

import pytest
import torch
from gpu_records import record

from sharding_lab.engine.validation import (
    CPU_CASES,
    CUDA_CASES,
    CUDA_TOLERANCE,
    Case,
    Comparison,
    case_id,
    compare,
    cublas_workspace_bytes,
    cuda_workspaces_here,
    simulate_in_fresh_processes,
)

# Rank views measured at once on the one GPU: each is a process of its own, so its allocator figures are
# its own, and the H200's 141 GB holds several (the largest case here peaks near 10 GB).
RANK_VIEWS_AT_ONCE = 4


def _simulated(cases: tuple[Case, ...], device: str) -> dict[Case, dict]:
    """Every case simulated up front, side by side: the simulation needs only CPUs (16 on the lent GPU
    machine, where scripts/gpu-check has minutes), the rank views then take the device one at a time."""
    return dict(zip(cases, simulate_in_fresh_processes([case.run_config(device) for case in cases]), strict=True))


@pytest.fixture(scope="module")
def cpu_simulations() -> dict[Case, dict]:
    return _simulated(CPU_CASES, "cpu")


@pytest.fixture(scope="module")
def cuda_comparisons() -> dict[Case, Future]:
    """Every CUDA case simulated, then measured as a rank view, RANK_VIEWS_AT_ONCE at a time; each test
    reads its own (a failure stays that case's)."""
    simulations = _simulated(CUDA_CASES, "cuda")
    with ThreadPoolExecutor(max_workers=RANK_VIEWS_AT_ONCE) as pool:
        return {case: pool.submit(compare, case, "cuda", 600, simulated=simulations[case]) for case in CUDA_CASES}


@pytest.mark.slow
@pytest.mark.parametrize("case", CPU_CASES, ids=case_id)
def test_the_simulated_peak_is_the_rank_views_tracked_peak_on_cpu(case, cpu_simulations):
    result = compare(case, "cpu", timeout_s=300, simulated=cpu_simulations[case])
    assert result.simulated_peak == result.tracked_peak
    # The simulation counts Adam's 4-byte step counters with the optimizer state; the measured model
    # states leave them out (`optimizer_scalar_bytes`): 53 tensors in tiny, 125 in mini.
    counters = 4 * (12 * {"tiny": 4, "mini": 10}[case.size] + 5)
    assert result.simulated_model_states == result.measured_model_states + counters


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")  # a mark: no simulations set up for nothing
@pytest.mark.parametrize("case", CUDA_CASES, ids=case_id)
def test_the_simulated_peak_is_within_3_percent_of_cuda_on_a_rank_view(case, cuda_comparisons):
    result: Comparison = cuda_comparisons[case].result()
    record("comparisons", result.to_json())  # held or not
    assert result.cuda_peak is not None and result.cuda_workspaces == cuda_workspaces_here()
    assert result.cuda_error <= CUDA_TOLERANCE, result.to_json()


# The analytic planner against real CUDA memory, CPU offload included (the simulation cannot take it:
# on the CPU, host and device are one).
PLANNER_CUDA_CASES = (
    Case("gpt2-small", 8, 512, 4, False),
    Case("gpt2-small", 8, 512, 4, True, (("activation_checkpointing", True),)),
    Case("gpt2-small", 8, 512, 4, False, (("cpu_offload", True),)),
    Case("gpt2-small", 8, 512, 4, True, (("cpu_offload", True),)),
)


@pytest.fixture(scope="module")
def planner_rank_views() -> dict[Case, Future]:
    from sharding_lab.engine.measure import measure_many

    with ThreadPoolExecutor(max_workers=RANK_VIEWS_AT_ONCE) as pool:
        return {case: pool.submit(measure_many, [case.run_config("cuda")], timeout_s=600)
                for case in PLANNER_CUDA_CASES}


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("case", PLANNER_CUDA_CASES, ids=case_id)
def test_the_analytic_plan_is_within_3_percent_of_cuda_on_a_rank_view(case, request):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from sharding_lab.plan_command import request_for_config
    from sharding_lab.planner import plan_analytic

    rank0 = request.getfixturevalue("planner_rank_views")[case].result()[0].ranks[0]
    planned = plan_analytic(request_for_config(case.run_config("cuda"))).peak.total
    workspaces = cuda_workspaces_here()  # the allocator counts cuBLAS's workspaces; the plan counts tensors
    error = abs(planned + workspaces - rank0.cuda_max_memory_allocated) / rank0.cuda_max_memory_allocated
    record("planner", {"case": case_id(case), "planned_peak": planned, "cuda_workspaces": workspaces,
                       "tracked_peak": rank0.peak_bytes, "cuda_peak": rank0.cuda_max_memory_allocated,
                       "cuda_error": error})
    assert error <= CUDA_TOLERANCE, (case_id(case), planned, workspaces, rank0.cuda_max_memory_allocated)


@pytest.mark.slow
def test_the_analytic_plan_is_the_rank_views_tracked_peak_on_cpu():
    # The same comparison on CPU, where the tracker is the measurement (no offload: the host is the device).
    from sharding_lab.engine.measure import measure_many
    from sharding_lab.plan_command import request_for_config
    from sharding_lab.planner import plan_analytic

    config = Case("mini", 8, 32, 2, False, (("activation_checkpointing", True),)).run_config("cpu")
    rank0 = measure_many([config], timeout_s=300)[0].ranks[0]
    assert plan_analytic(request_for_config(config)).peak.total == rank0.peak_bytes


@pytest.mark.parametrize(("capability", "config", "expected"), [
    ((9, 0), None, 33_554_432),  # Hopper: 32 MiB, and 33,554,432 B measured on the H200 after one matmul
    ((10, 0), None, 33_554_432),
    ((8, 0), None, 8_519_680),  # before Hopper: 2 x 4 MiB + 8 x 16 KiB
    ((9, 0), ":4096:8", 33_554_432),
    ((9, 0), ":4096:2:16:8", 8_519_680),
    ((8, 6), ":16:8", 131_072),
    ((9, 0), "garbage", 33_554_432),  # torch warns and keeps its default
])
def test_a_cublas_workspace_is_sized_as_torch_sizes_it(capability, config, expected):
    assert cublas_workspace_bytes(capability, config) == expected
