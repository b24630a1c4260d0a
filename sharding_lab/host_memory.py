"""Whether a launch's ranks fit in this host's memory, checked before any rank starts.

CPU ranks share the host's memory. Between steps each rank holds at least its model states, fp32
parameters, gradients and Adam state (4 + 4 + 8 bytes per parameter), minus what its strategy shards.
Summed over the ranks, that is exact arithmetic. Every rank is also a process with torch imported
(on CPU or GPU), which takes host memory before any model: a measured floor per process. Together
they are a floor: activations, temporaries and gathered parameters come on top. A launch whose floor
exceeds the memory available is refused with these figures, instead of ending in the kernel's
out-of-memory killer (SIGKILL) minutes later. Torch-free: the parent runs it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from sharding_lab.analytic import FP32_ADAM_BYTES
from sharding_lab.model_config import config_for, num_params
from sharding_lab.planner import BOUNDS
from sharding_lab.run_config import RunConfig
from sharding_lab.strategies import MODEL_STATE_PARTS
from sharding_lab.units import human_bytes

MEMINFO = Path("/proc/meminfo")
CGROUP = Path("/sys/fs/cgroup")  # cgroup v2: a container's own limit, which MemAvailable does not show


class HostMemoryTooSmall(ValueError):
    """The ranks' floor (their model states and their processes) exceeds the host memory available."""


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


# Each rank is a process with torch imported and its process group up. Measured on this project's
# torch 2.13.0+cpu: 138 MiB of anonymous (private) memory after gloo's first all_reduce, before any
# model (Python 3.11, /proc/self/smaps_rollup). The floor takes a round figure under it.
RANK_PROCESS_BYTES = 128 * 2**20


def _plan_instead(config: RunConfig) -> str:
    """Where a large world's figures come from without running it: the planner, within its bounds."""
    if config.world_size > BOUNDS.gpus:
        return f"or plan it without running at up to {BOUNDS.gpus:,} GPUs: `sharding-lab plan --size {config.size}`."
    return (f"or get a large world's figures without running from "
            f"`sharding-lab plan --size {config.size} --gpus {config.world_size}`.")


def check_fits(configs: Sequence[RunConfig], available: int | None, processes: int) -> None:
    """Raise HostMemoryTooSmall, with the figures, when the `processes` rank processes this launch starts,
    plus (CPU ranks) the first configuration's model states, exceed `available` bytes (None: unknown,
    nothing is checked). A floor: activations, temporaries and torch's own allocations come on top."""
    if available is None:
        return
    ranks_bytes = processes * RANK_PROCESS_BYTES
    for config in configs:
        states = model_states_floor(config) if config.device == "cpu" else 0
        floor = ranks_bytes + states
        if floor <= available:
            continue
        on = f"{config.label} on {config.world_size} {config.device.upper()} rank(s) of {config.size}"
        if states < ranks_bytes:  # the processes are the most of it: fewer ranks is the remedy
            raise HostMemoryTooSmall(
                f"{on} starts {processes:,} rank processes; each needs at least "
                f"{human_bytes(RANK_PROCESS_BYTES)} of host memory for torch and its process group alone "
                f"(measured), {human_bytes(ranks_bytes)} for all of them"
                + (f", plus {human_bytes(states)} for model states" if states else "")
                + f"; this machine has {human_bytes(available)} available. Choose a smaller --world-size, "
                + _plan_instead(config)
            )
        raise HostMemoryTooSmall(
            f"{on} ({_num_params(config):,} parameters) needs "
            f"at least {human_bytes(floor)} of host memory: {human_bytes(states)} for its model states (fp32 "
            f"parameters, gradients and Adam state, 16 bytes per parameter, summed over the ranks: exact "
            f"arithmetic, before activations) and {human_bytes(ranks_bytes)} for {processes:,} rank process(es) "
            f"(torch and its process group, measured); this machine has {human_bytes(available)} available. "
            f"Choose a smaller --size{'' if config.strategy.fully_sharded else ' or zero3, which shards them'}, "
            f"or get the figures without running from `sharding-lab plan --size {config.size}`."
        )
