"""Did communication overlap computation? Read off a CUDA profiler trace of one step.

NCCL collectives run as kernels on their own streams; a step overlaps communication with computation
when an NCCL kernel runs while a compute kernel runs. We take the union of NCCL kernel intervals and
the union of every other kernel's intervals and report how much of the first lies inside the second.
CUDA only: on CPU, gloo runs collectives on the calling thread and there is nothing to overlap.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _length(intervals: list[tuple[float, float]]) -> float:
    return sum(end - start for start, end in intervals)


def _intersection(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, end - start)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def overlap_of(comm: list[tuple[float, float]], compute: list[tuple[float, float]]) -> dict:
    """Overlap figures for kernel intervals in microseconds."""
    comm_union, compute_union = _union(comm), _union(compute)
    overlapped = _intersection(comm_union, compute_union)
    comm_time = _length(comm_union)
    return {
        "comm_kernel_us": comm_time,
        "compute_kernel_us": _length(compute_union),
        "overlapped_us": overlapped,
        "overlapped_fraction_of_comm": overlapped / comm_time if comm_time else 0.0,
        "overlapped": overlapped > 0,
    }


def profile_overlap(run_step: Callable[[], object], device: torch.device) -> dict:
    """Profile one call of `run_step` on CUDA and report how much NCCL time overlapped compute."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run_step()
        torch.cuda.synchronize(device)
    comm, compute = [], []
    for event in prof.events():
        if event.device_type != DeviceType.CUDA:
            continue
        interval = (event.time_range.start, event.time_range.end)
        name = event.name.lower()
        if "nccl" in name:
            comm.append(interval)
        elif "memcpy" not in name and "memset" not in name:
            compute.append(interval)
    return {**overlap_of(comm, compute), "comm_kernels": len(comm), "compute_kernels": len(compute)}
