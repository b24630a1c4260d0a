"""Ask torch, in a lab process, which devices a lab can run on here.

    python -m sharding_lab.engine.devices      one JSON line: sharding_lab.lab_devices.LabDevices

The study app runs this as a child (studyapp.lab_runs.devices): the web process never imports torch.
"""

from __future__ import annotations

import sys

import torch

from sharding_lab.lab_devices import LabDevices


def detect() -> LabDevices:
    """The GPUs torch sees in this process (none on a CPU-only build), with torch's versions."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return LabDevices(
        cuda_gpus=gpus,
        gpu_names=tuple(torch.cuda.get_device_name(index) for index in range(gpus)),
        torch_version=torch.__version__,
        cuda_version=torch.version.cuda,
    )


def main() -> int:
    print(detect().to_json(), file=sys.stdout, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
