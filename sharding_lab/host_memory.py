"""Whether a launch's ranks fit in this host's memory, checked before any rank starts.

CPU ranks share the host's memory. At its optimizer step each rank holds at least its model states,
fp32 parameters, gradients and Adam state (4 + 4 + 8 bytes per parameter), minus what its strategy
shards; at the end of each forward, its parameters and Adam state beside what its micro-batch saved
for backward. Summed over the ranks, the states are exact arithmetic and the saved activations the
planner's count, tensor by tensor. Every rank is also a process with torch imported (on CPU or GPU),
which takes host memory before any model: a measured floor per process. Together they are a floor:
temporaries and gathered parameters come on top. A launch whose floor exceeds the memory available is
refused with these figures, instead of ending in the kernel's out-of-memory killer (SIGKILL) or a
rank's allocation error minutes later. Torch-free: the parent runs it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sharding_lab.analytic import FP32_ADAM_BYTES
from sharding_lab.model_config import config_for, num_params
from sharding_lab.plan_command import request_for_config
from sharding_lab.planner import BOUNDS, step_shape
from sharding_lab.planner_memory import saved_activations_bytes
from sharding_lab.run_config import RunConfig
from sharding_lab.strategies import MODEL_STATE_PARTS
from sharding_lab.units import human_bytes

MEMINFO = Path("/proc/meminfo")
CGROUP = Path("/sys/fs/cgroup")  # cgroup v2: a container's own limit, which MemAvailable does not show


class HostMemoryTooSmall(ValueError):
    """The ranks' floor (their model states and their processes) exceeds the host memory available."""


def _num_params(config: RunConfig) -> int:
    return num_params(config_for(config.size, **dict(config.model_overrides)))


def model_state_bytes(config: RunConfig, ranks: int | None = None) -> dict[str, int]:
    """Bytes of each model state part ("params", "grads", "optimizer") that `ranks` of `config`'s ranks
    (default all; a rank view holds rank 0 alone) hold together, at the least, while it is held
    (gradients from backward to the step's zero_grad).

    A part a rank shards is held once per shard group (Ψ elements over its ranks; FSDP's padding only
    adds); a part it replicates, once per rank. FSDP2 reshards parameters between steps under zero2 too.
    """
    ranks = config.world_size if ranks is None else ranks
    psi = _num_params(config)
    sharded = set(config.strategy.sharded_parts) | ({"params"} if config.strategy.fully_sharded else set())
    return {part: FP32_ADAM_BYTES[part] * psi * ranks // (config.shards if part in sharded else 1)
            for part in MODEL_STATE_PARTS}


def activations_floor(config: RunConfig, ranks: int | None = None) -> int:
    """Bytes that `ranks` of `config`'s ranks (default all) hold saved for backward at the end of a forward:
    each rank's micro-batch, as the planner counts it tensor by tensor (`planner_memory.saved_activations_bytes`)."""
    ranks = config.world_size if ranks is None else ranks
    return ranks * saved_activations_bytes(step_shape(request_for_config(config)))


@dataclass(frozen=True)
class CpuFloor:
    """What some of a configuration's CPU ranks hold together at the two fullest moments this floor knows."""

    states: dict[str, int]  # model state bytes by part, each while it is held
    activations: int  # saved for backward at the end of a forward

    @property
    def at_optimizer_step(self) -> int:
        """Every state part: the gradients are still there and Adam's state is."""
        return sum(self.states.values())

    @property
    def at_forward_end(self) -> int:
        """Parameters and Adam state beside the saved activations; gradients were freed by zero_grad."""
        return self.states["params"] + self.states["optimizer"] + self.activations

    @property
    def total(self) -> int:
        return max(self.at_optimizer_step, self.at_forward_end)


def cpu_floor(config: RunConfig, ranks: int) -> CpuFloor:
    """The floor of `ranks` of `config`'s ranks (all for real ranks; 1 for a rank view) on CPU."""
    return CpuFloor(model_state_bytes(config, ranks), activations_floor(config, ranks))


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


def _seq(config: RunConfig) -> int:
    return config.seq_len or config_for(config.size, **dict(config.model_overrides)).block_size


def _plan_instead(config: RunConfig) -> str:
    """Where a large world's figures come from without running it: the planner, within its bounds."""
    if config.world_size > BOUNDS.gpus:
        return f"or plan it without running at up to {BOUNDS.gpus:,} GPUs: `sharding-lab plan --size {config.size}`."
    return (f"or get a large world's figures without running from "
            f"`sharding-lab plan --size {config.size} --gpus {config.world_size}`.")


def check_fits(configs: Sequence[RunConfig], available: int | None, processes: int) -> None:
    """Raise HostMemoryTooSmall, with the figures, when the `processes` rank processes this launch starts,
    plus (CPU ranks) a configuration's model states and saved activations, exceed `available` bytes (None:
    unknown, nothing is checked). Each real rank is a process; a rank view is one, holding rank 0 alone.
    A floor: temporaries and torch's own allocations come on top."""
    if available is None:
        return
    ranks_bytes = processes * RANK_PROCESS_BYTES
    for config in configs:
        held = cpu_floor(config, ranks=processes) if config.device == "cpu" else None
        models = held.total if held else 0
        floor = ranks_bytes + models
        if floor <= available:
            continue
        on = f"{config.label} on {config.world_size} {config.device.upper()} rank(s) of {config.size}"
        if models < ranks_bytes:  # the processes are the most of it: fewer ranks is the remedy
            raise HostMemoryTooSmall(
                f"{on} starts {processes:,} rank processes; each needs at least "
                f"{human_bytes(RANK_PROCESS_BYTES)} of host memory for torch and its process group alone "
                f"(measured), {human_bytes(ranks_bytes)} for all of them"
                + (f", plus {human_bytes(models)} for model states and activations" if models else "")
                + f"; this machine has {human_bytes(available)} available. Choose a smaller --world-size, "
                + _plan_instead(config)
            )
        assert held is not None  # GPU ranks hold nothing here beyond their processes
        whose = "summed over the ranks" if processes == config.world_size else "rank 0's alone, in a rank view"
        processes_part = (f"{human_bytes(ranks_bytes)} for {processes:,} rank process(es) (torch and its process "
                          f"group, measured); this machine has {human_bytes(available)} available.")
        if ranks_bytes + held.at_optimizer_step > available:  # no micro-batch fits: the model is the remedy
            raise HostMemoryTooSmall(
                f"{on} ({_num_params(config):,} parameters) needs at least "
                f"{human_bytes(ranks_bytes + held.at_optimizer_step)} of host memory: "
                f"{human_bytes(held.at_optimizer_step)} for its model states at the optimizer step (fp32 "
                f"parameters, gradients and Adam state, 16 bytes per parameter, {whose}: exact arithmetic, "
                f"before activations) and {processes_part} Choose a smaller --size"
                f"{'' if config.strategy.fully_sharded else ' or zero3, which shards them'}, "
                f"or get the figures without running from `sharding-lab plan --size {config.size}`."
            )
        raise HostMemoryTooSmall(
            f"{on} with micro-batches of {config.batch_size:,} x {_seq(config):,} tokens needs at least "
            f"{human_bytes(floor)} of host memory at the end of each forward: {human_bytes(held.activations)} "
            f"saved for backward (counted tensor by tensor as the planner does), "
            f"{human_bytes(held.at_forward_end - held.activations)} for fp32 parameters and Adam state (4 + 8 "
            f"bytes per parameter, less what is sharded: exact arithmetic), both {whose}, and {processes_part} "
            f"Choose a smaller --micro-batch or --seq"
            + ("" if config.options.activation_checkpointing else ", or --activation-checkpointing")
            + f", or get the figures without running from `sharding-lab plan --size {config.size}`."
        )
