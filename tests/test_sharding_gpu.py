"""The CUDA path: NCCL ranks, the tracker cross-checked with the caching allocator, overlap from the
profiler. Skips without CUDA; run it where a GPU is available."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from gpu_records import record

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


def test_configurations_in_one_launch_measure_on_cuda_what_each_measures_alone():
    """The issue's leak: `compare --world-size 1 --device cuda --size gpt2-medium` once reported the
    allocator's peaks 10.29, 13.32, 16.35 and 21.28 GiB for ddp, zero1, zero2 and zero3, each
    configuration's tensors outliving it, where ddp and zero3 alone gave 10.29 and 9.17 GiB."""
    from sharding_lab.engine.measure import measure_many
    from sharding_lab.run_config import RunConfig

    strategies = ("ddp", "zero1", "zero2", "zero3")
    together = measure_many([RunConfig.of(s, world_size=1, device="cuda", size="gpt2-medium") for s in strategies],
                            timeout_s=300)
    alone = {s: measure_many([RunConfig.of(s, world_size=1, device="cuda", size="gpt2-medium")], timeout_s=300)[0]
             for s in ("ddp", "zero3")}
    for strategy, measured in zip(strategies, together, strict=True):
        rank = measured.ranks[0]
        row = {"strategy": strategy, "size": "gpt2-medium", "world_size": 1, "tracked_peak": rank.peak_bytes,
               "cuda_peak_in_one_launch": rank.cuda_max_memory_allocated,
               "cuda_peak_alone": alone[strategy].ranks[0].cuda_max_memory_allocated if strategy in alone else None}
        record("independence", row)
        # No configuration carries an earlier one's memory: its allocator peak stays near its own tracker's
        # (the leak added 3 to 12 GiB to 10 GiB peaks).
        assert rank.cuda_max_memory_allocated <= 1.05 * rank.peak_bytes, row
        if strategy in alone:
            assert rank.cuda_max_memory_allocated == pytest.approx(row["cuda_peak_alone"], rel=0.005), row
            # fp32 DDP and zero3 at 1 rank: the tracker agrees with the allocator within 1% (seen before the fix
            # too, when each was measured alone).
            assert rank.peak_bytes == pytest.approx(rank.cuda_max_memory_allocated, rel=0.01), row


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sharding_lab.cli", *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="the one-GPU case: this machine has two or more")
def test_two_ranks_on_one_gpu_run_as_a_rank_view_or_shared_and_never_raise_a_cuda_traceback():
    """The issue's first failure: `measure --strategy zero3 --world-size 2 --device cuda` on one H200 ended
    in a raw CUDA traceback ("invalid device ordinal")."""
    base = ("measure", "--strategy", "zero3", "--world-size", "2", "--device", "cuda", "--size", "gpt2-small", "--json")
    auto = _cli(*base)
    assert auto.returncode == 0 and "Traceback" not in auto.stderr, auto.stderr[-3000:]
    view = json.loads(auto.stdout)
    assert view["config"]["placement"] == "rank-view"
    assert "this machine has 1 GPU" in view["config"]["placement_note"]
    assert view["memory"]["per_rank"][0]["cuda_max_memory_allocated"] > 0

    shared = _cli(*base, "--placement", "shared-gpu")
    assert shared.returncode == 0 and "Traceback" not in shared.stderr, shared.stderr[-3000:]
    ranks = json.loads(shared.stdout)["memory"]["per_rank"]
    assert len(ranks) == 2 and all(rank["cuda_max_memory_allocated"] > 0 for rank in ranks)
    record("one_gpu", {"rank_view_rank0_cuda_peak": view["memory"]["per_rank"][0]["cuda_max_memory_allocated"],
                       "rank_view_rank0_tracked_peak": view["memory"]["per_rank"][0]["peak_bytes"],
                       "shared_gpu_cuda_peaks": [rank["cuda_max_memory_allocated"] for rank in ranks],
                       "shared_gpu_tracked_peaks": [rank["peak_bytes"] for rank in ranks]})

    refused = _cli(*base, "--placement", "ranks")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "need 2 GPUs; this machine has 1 GPU" in refused.stderr, refused.stderr[-2000:]


def test_ddp_mixed_precision_on_cuda_reports_what_the_tracker_cannot_see():
    """The tracker misses DDP's bf16 parameter copies (made by resizing storage); the report says so and
    points at the allocator. The figures are recorded to find what else makes up the gap."""
    from sharding_lab.engine.measure import measure_many
    from sharding_lab.report import allocator_lines
    from sharding_lab.run_config import RunConfig

    measured = measure_many([RunConfig.of("ddp", world_size=1, device="cuda", size="gpt2-medium",
                                          mixed_precision=True)], timeout_s=300)[0]
    rank = measured.ranks[0]
    record("ddp_mixed_precision", {"size": "gpt2-medium", "num_params": measured.config.num_params,
                                   "tracked_peak": rank.peak_bytes, "cuda_peak": rank.cuda_max_memory_allocated,
                                   "tracked_categories_at_peak": rank.categories})
    lines = allocator_lines(measured)
    assert len(lines) == 2 and "the tracker's figures do not hold" in lines[1] and "Read the allocator's peak" in lines[1]
    assert rank.cuda_max_memory_allocated > rank.peak_bytes


def test_a_matmul_leaves_cublas_workspaces_allocated_until_they_are_cleared():
    """Why a configuration's end clears them before checking that its CUDA memory is back: torch keeps
    each cuBLAS workspace in the caching allocator from the first matmul on."""
    import gc

    from sharding_lab.engine import _torch_internals as internals

    gc.collect()
    internals.clear_cublas_workspaces()
    before = torch.cuda.memory_allocated()
    a = torch.randn(256, 256, device="cuda")
    (a @ a).sum().item()
    del a
    torch.cuda.synchronize()
    kept = torch.cuda.memory_allocated() - before
    internals.clear_cublas_workspaces()
    record("cublas_workspace", {"bytes_kept_after_a_matmul": kept})
    assert kept > 0 and torch.cuda.memory_allocated() == before


# Bare DDP, none of the engine's trackers: does deleting a DDP model give back its gradient buckets on
# CUDA? On the H200 (2026-12-04) every DDP configuration of the engine left them allocated (tiny: one
# bucket, 240,640 B; gpt2-medium in bf16: exactly Ψ × 4 B), allocated at DDP's `_rebuild_buckets`, while
# on CPU they are freed. Each variant below turns off one suspect, so the recorded rows say whose they are.
DDP_LEAK_PROBE = r"""
import gc, json, socket, sys, torch, torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP
from sharding_lab.engine import _torch_internals as internals

backend, device = sys.argv[1], torch.device(sys.argv[2])
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
cuda = device.type == "cuda"

def settle():
    gc.collect()
    if cuda:
        torch.cuda.synchronize(); internals.clear_cublas_workspaces(); torch.cuda.empty_cache()
        return torch.cuda.memory_allocated()
    return 0

def left_after(comm_hook, as_view, steps):
    base = settle()
    model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(6)]).to(device)
    ddp = DDP(model, device_ids=[0] if cuda else None, gradient_as_bucket_view=as_view, bucket_cap_mb=1)
    if comm_hook:
        ddp.register_comm_hook(None, allreduce_hook)
    optimizer = torch.optim.Adam(ddp.parameters())
    for _ in range(steps):  # DDP rebuilds its buckets in its second forward
        optimizer.zero_grad(set_to_none=True)
        ddp(torch.randn(8, 512, device=device)).sum().backward()
        optimizer.step()
    del ddp, model, optimizer
    return settle() - base

rows = [{"backend": backend, "comm_hook": hook, "gradient_as_bucket_view": view, "steps": steps,
         "bytes_left": left_after(hook, view, steps)}
        for hook, view, steps in ((False, False, 3), (False, True, 3), (True, True, 3), (True, True, 1))]
print(json.dumps(rows))
"""


def _ddp_leak_probe(backend: str, device: str) -> list[dict]:
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", DDP_LEAK_PROBE, backend, device],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_deleted_ddp_model_gives_back_its_cuda_memory():
    rows = [row for backend in ("nccl", "gloo") for row in _ddp_leak_probe(backend, "cuda")]
    for row in rows:
        record("ddp_leak_probe", row)  # held or not: which variant keeps what
    assert all(row["bytes_left"] == 0 for row in rows), rows
