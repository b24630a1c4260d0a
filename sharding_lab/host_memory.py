"""Whether CPU ranks can hold their model states in this host's memory, checked before any rank starts.

CPU ranks share the host's memory. Between steps each rank holds at least its model states, fp32
parameters, gradients and Adam state (4 + 4 + 8 bytes per parameter), minus what its strategy shards.
Summed over the ranks, that is exact arithmetic and a floor: activations, temporaries, gathered
parameters and torch itself come on top. A launch whose floor exceeds the memory available is
refused with these figures, instead of ending in the kernel's out-of-memory killer (SIGKILL) minutes
later. Torch-free: the parent runs it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from sharding_lab.analytic import FP32_ADAM_BYTES
from sharding_lab.model_config import config_for, num_params
from sharding_lab.run_config import RunConfig
from sharding_lab.strategies import MODEL_STATE_PARTS
from sharding_lab.units import human_bytes

MEMINFO = Path("/proc/meminfo")
CGROUP = Path("/sys/fs/cgroup")  # cgroup v2: a container's own limit, which MemAvailable does not show


class HostMemoryTooSmall(ValueError):
    """The ranks' model states alone exceed the host memory available."""


def _num_params(config: RunConfig) -> int:
    return num_params(config_for(config.size, **dict(config.model_overrides)))


def model_states_floor(config: RunConfig) -> int:
    """Bytes of model states all of `config`'s ranks hold together between steps, at the least.

    A part a rank shards is held once per shard group (Ψ elements over its ranks; FSDP's padding only
    adds); a part it replicates, once per rank. FSDP2 reshards parameters between steps under zero2 too.
    """
    psi = _num_params(config)
    sharded = set(config.strategy.sharded_parts) | ({"params"} if config.strategy.fully_sharded else set())
    copies = {part: config.options.replicas if part in sharded else config.world_size for part in MODEL_STATE_PARTS}
    return sum(FP32_ADAM_BYTES[part] * psi * copies[part] for part in MODEL_STATE_PARTS)


def available_bytes(meminfo: Path = MEMINFO, cgroup: Path = CGROUP) -> int | None:
    """Memory a new process can take without swapping: MemAvailable, capped by this cgroup's own limit
    (memory.max less memory.current) where one is set. None where neither can be read (not Linux)."""
    found = []
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)  # the kernel writes kB, meaning KiB
    except OSError:
        pass
    try:
        limit = (cgroup / "memory.max").read_text().strip()
        if limit != "max":
            found.append(int(limit) - int((cgroup / "memory.current").read_text()))
    except (OSError, ValueError):
        pass
    return min(found) if found else None


def check_fits(configs: Sequence[RunConfig], available: int | None) -> None:
    """Raise HostMemoryTooSmall, with the figures, for the first CPU configuration whose ranks' model
    states alone exceed `available` bytes (None: unknown, nothing is checked)."""
    if available is None:
        return
    for config in configs:
        if config.device != "cpu":
            continue
        floor = model_states_floor(config)
        if floor > available:
            raise HostMemoryTooSmall(
                f"{config.label} on {config.world_size} CPU rank(s) of {config.size} ({_num_params(config):,} "
                f"parameters) needs "
                f"at least {human_bytes(floor)} of host memory for its model states alone (fp32 parameters, "
                f"gradients and Adam state, 16 bytes per parameter, summed over the ranks: exact arithmetic, "
                f"before activations and torch itself); this machine has {human_bytes(available)} available. "
                f"Choose a smaller --size{'' if config.strategy.fully_sharded else ' or zero3, which shards them'}, "
                f"or get the figures without running from `sharding-lab plan --size {config.size}`."
            )
