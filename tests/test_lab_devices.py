"""The devices a lab can run on (sharding_lab.lab_devices): the torch-free contract, and the real
detection in a lab process (sharding_lab.engine.devices), checked against torch asked on its own.
No flask here: scripts/gpu-check runs this file's gpu test with `--noconftest` on a machine without
the web app's packages. The app's side (studyapp.lab_runs.devices, the page, the POST) is in
tests/test_lab_runs.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from sharding_lab.lab_devices import LabDevices
from sharding_lab.run_config import DEVICES

H200 = "NVIDIA H200"
ONE_GPU = LabDevices(1, (H200,), "2.11.0+cu130", "13.0")
TWO_GPUS = LabDevices(2, (H200, H200), "2.11.0+cu130", "13.0")
NO_GPU = LabDevices(0, (), "2.13.0", None)


def detect_in_a_lab_process() -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sharding_lab.engine.devices"], capture_output=True, text=True,
                          timeout=120)


def torch_asked_on_its_own() -> dict:
    """torch's own answer, from a process of its own (not the code under test)."""
    script = ("import json, torch; print(json.dumps({'version': torch.__version__, 'cuda': torch.version.cuda, "
              "'gpus': torch.cuda.device_count() if torch.cuda.is_available() else 0}))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# --- the contract --------------------------------------------------------------------------------


def test_cpu_is_always_offered_and_cuda_only_with_a_gpu():
    assert NO_GPU.devices == ("cpu",)
    assert ONE_GPU.devices == TWO_GPUS.devices == ("cpu", "cuda") == DEVICES
    assert NO_GPU.gpus == "no CUDA GPU"
    assert ONE_GPU.gpus == "1 GPU (NVIDIA H200)"
    assert TWO_GPUS.gpus == "2 GPUs (2 x NVIDIA H200)"
    assert LabDevices(2, ("NVIDIA A100", H200), "2.11.0", "12.8").gpus == "2 GPUs (NVIDIA A100, NVIDIA H200)"


def test_placement_notes_say_what_a_run_on_each_device_does():
    assert ONE_GPU.placement_note("cuda", 2) == (
        "2 ranks on cuda: this machine has 1 GPU (NVIDIA H200): 2 real ranks share cuda:0 over gloo"
    )
    assert TWO_GPUS.placement_note("cuda", 2) == (
        "2 ranks on cuda: this machine has 2 GPUs (2 x NVIDIA H200): one GPU per rank over NCCL"
    )
    assert TWO_GPUS.placement_note("cuda", 4) == (
        "4 ranks on cuda: this machine has 2 GPUs (2 x NVIDIA H200): 4 real ranks share cuda:0 over gloo"
    )
    assert NO_GPU.placement_note("cpu", 4) == "4 ranks on cpu: 4 processes on this machine's CPUs over gloo"


def test_cuda_without_a_gpu_and_an_unknown_device_are_refused_naming_what_was_asked():
    refusal = "device cuda asked, but the lab process sees no CUDA GPU on this machine (torch 2.13.0); use cpu"
    assert NO_GPU.refusal("cuda") == refusal
    assert NO_GPU.refusal("cpu") is None and ONE_GPU.refusal("cuda") is None
    assert ONE_GPU.refusal("tpu") == "unknown device 'tpu'; choose one of cpu, cuda"
    with pytest.raises(ValueError, match=r"^device cuda asked, but the lab process sees no CUDA GPU"):
        NO_GPU.placement_note("cuda", 2)


def test_the_json_line_round_trips_and_anything_else_is_refused():
    for devices in (NO_GPU, ONE_GPU, TWO_GPUS):
        assert LabDevices.from_json(devices.to_json()) == devices
    assert json.loads(ONE_GPU.to_json()) == {
        "cuda_gpus": 1, "gpu_names": ["NVIDIA H200"], "torch_version": "2.11.0+cu130", "cuda_version": "13.0"
    }
    for bad in ('{"cuda_gpus": 1, "gpu_names": [], "torch_version": "2.13.0", "cuda_version": null}',  # no name
                '{"cuda_gpus": -1, "gpu_names": [], "torch_version": "2.13.0", "cuda_version": null}',
                '{"cuda_gpus": true, "gpu_names": ["x"], "torch_version": "2.13.0", "cuda_version": null}',
                '{"cuda_gpus": 0, "gpu_names": [], "torch_version": "", "cuda_version": null}',
                '{"cuda_gpus": 0, "gpu_names": [], "torch_version": "2.13.0", "cuda_version": 13}',
                '{"cuda_gpus": 0, "gpu_names": [], "torch_version": "2.13.0"}',
                '[0]', 'not json'):
        with pytest.raises(ValueError):
            LabDevices.from_json(bad)


# --- the real detection ----------------------------------------------------------------------------


@pytest.mark.slow  # imports torch in two processes
def test_the_lab_process_reports_what_torch_sees_on_this_machine():
    done = detect_in_a_lab_process()
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1, "one JSON line, nothing else on stdout"
    found = LabDevices.from_json(lines[0])
    torch_says = torch_asked_on_its_own()
    assert found.torch_version == torch_says["version"] and found.cuda_version == torch_says["cuda"]
    assert found.cuda_gpus == torch_says["gpus"]
    assert found.devices == (("cpu", "cuda") if torch_says["gpus"] else ("cpu",))  # ("cpu",) on a CPU machine


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_a_gpu_machine_the_lab_process_offers_cuda_and_names_the_gpu():
    done = detect_in_a_lab_process()
    assert done.returncode == 0, done.stderr[-2000:]
    found = LabDevices.from_json(done.stdout.strip().splitlines()[-1])
    assert "cuda" in found.devices and found.cuda_gpus == torch.cuda.device_count()
    assert all(name.strip() for name in found.gpu_names) and found.gpu_names[0] == torch.cuda.get_device_name(0)
    assert found.cuda_version == torch.version.cuda and found.cuda_version
    note = found.placement_note("cuda", 2)
    assert note.startswith(f"2 ranks on cuda: this machine has {found.gpus}: ")
