"""What a lab process on this machine can run on: its GPUs as torch sees them, and torch's versions.

`sharding_lab.engine.devices` asks torch in a lab process and prints one `LabDevices` as a JSON line;
the study app reads that line (studyapp.lab_runs.devices), so the web process never imports torch.
No torch here: this is the contract between the two.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

from sharding_lab.run_config import DEVICES, Placement, resolve_placement


@dataclass(frozen=True)
class LabDevices:
    """The devices a lab process sees."""

    cuda_gpus: int
    """torch.cuda.device_count() in the lab process: 0 on a CPU-only build or machine."""
    gpu_names: tuple[str, ...]
    """torch.cuda.get_device_name(i) for each GPU, in index order."""
    torch_version: str
    """The version of torch in the lab process, e.g. "2.13.0+cpu"."""
    cuda_version: str | None
    """torch.version.cuda: the CUDA torch was built with; None on a CPU-only build."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "gpu_names", tuple(self.gpu_names))
        if isinstance(self.cuda_gpus, bool) or not isinstance(self.cuda_gpus, int) or self.cuda_gpus < 0:
            raise ValueError(f"cuda_gpus must be a whole number of at least 0, got {self.cuda_gpus!r}")
        if len(self.gpu_names) != self.cuda_gpus:
            raise ValueError(f"{self.cuda_gpus} GPU(s) but {len(self.gpu_names)} name(s): {self.gpu_names!r}")
        if not isinstance(self.torch_version, str) or not self.torch_version:
            raise ValueError(f"torch_version must be a non-empty string, got {self.torch_version!r}")

    @property
    def devices(self) -> tuple[str, ...]:
        """The devices a lab can run on here, in run_config.DEVICES' terms: cpu always, cuda with a GPU."""
        return ("cpu", "cuda") if self.cuda_gpus >= 1 else ("cpu",)

    @property
    def gpus(self) -> str:
        """The GPUs in a few words: "no CUDA GPU", "1 GPU (NVIDIA H200)", "8 GPUs (8 x NVIDIA H200)"."""
        if not self.cuda_gpus:
            return "no CUDA GPU"
        names = ", ".join(name if count == 1 else f"{count} x {name}" for name, count in Counter(self.gpu_names).items())
        return f"{self.cuda_gpus} GPU{'s' if self.cuda_gpus > 1 else ''} ({names})"

    def refusal(self, device: str) -> str | None:
        """Why a lab cannot run on `device` here, naming what was asked and what the machine has; None
        when it can."""
        if device not in DEVICES:
            return f"unknown device {device!r}; choose one of {', '.join(DEVICES)}"
        if device not in self.devices:
            return (f"device {device} asked, but the lab process sees no CUDA GPU on this machine "
                    f"(torch {self.torch_version}); use cpu")
        return None

    def placement_note(self, device: str, world_size: int) -> str:
        """In one line, what a lab run of `world_size` ranks on `device` does here. Labs read every
        rank's figures, so with fewer GPUs than ranks they run real ranks sharing one GPU (see
        run_config.resolve_placement). ValueError (the refusal) for a device this machine lacks."""
        if (why := self.refusal(device)) is not None:
            raise ValueError(why)
        ranks = f"{world_size} rank{'s' if world_size != 1 else ''} on {device}"
        if device == "cpu":
            return f"{ranks}: {world_size} process{'es' if world_size != 1 else ''} on this machine's CPUs over gloo"
        choice = resolve_placement(Placement.AUTO, device, world_size, self.cuda_gpus, every_rank=True)
        if choice.placement is Placement.RANKS:
            return f"{ranks}: this machine has {self.gpus}: one GPU per rank over NCCL"
        if choice.placement is Placement.SHARED_GPU:
            return f"{ranks}: this machine has {self.gpus}: {world_size} real ranks share cuda:0 over gloo"
        raise AssertionError(f"labs never run as {choice.placement}")  # every_rank=True rules out a rank view

    def to_json(self) -> str:
        return json.dumps({"cuda_gpus": self.cuda_gpus, "gpu_names": list(self.gpu_names),
                           "torch_version": self.torch_version, "cuda_version": self.cuda_version})

    @classmethod
    def from_json(cls, text: str) -> LabDevices:
        """The LabDevices of `to_json`'s line; ValueError for anything else."""
        body: Any = json.loads(text)
        if not isinstance(body, dict) or set(body) != {"cuda_gpus", "gpu_names", "torch_version", "cuda_version"}:
            raise ValueError(f"not a LabDevices object: {text.strip()[:200]!r}")
        names, cuda_version = body["gpu_names"], body["cuda_version"]
        if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
            raise ValueError(f"gpu_names must be a list of strings, got {names!r}")
        if cuda_version is not None and not isinstance(cuda_version, str):
            raise ValueError(f"cuda_version must be a string or null, got {cuda_version!r}")
        return cls(body["cuda_gpus"], tuple(names), body["torch_version"], cuda_version)
