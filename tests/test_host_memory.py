"""The parent's check that CPU ranks can hold their model states in host memory (sharding_lab.host_memory):
the floor is arithmetic on the model's shape, the memory figure is the kernel's, and a launch over it is
refused before any rank starts."""

from __future__ import annotations

import pytest

from sharding_lab import cli
from sharding_lab.host_memory import (
    HostMemoryTooSmall,
    activations_floor,
    available_bytes,
    check_fits,
    model_state_bytes,
)
from sharding_lab.model_config import config_for, num_params
from sharding_lab.planner import BOUNDS
from sharding_lab.run_config import RunConfig


def gpt2_small_params() -> int:
    """Ψ of the `gpt2-small` size by hand: nanoGPT with biases and an untied head, vocabulary 50,304."""
    vocab, positions, width, layers = 50_304, 1_024, 768, 12
    block = (2 * width) + (width * 3 * width + 3 * width) + (width * width + width) + (2 * width) \
        + (width * 4 * width + 4 * width) + (4 * width * width + width)
    return vocab * width + positions * width + layers * block + 2 * width + vocab * width


PSI = gpt2_small_params()


@pytest.mark.parametrize(
    ("strategy", "world_size", "replicas", "expected"),
    [
        ("ddp", 2, 1, 2 * 16 * PSI),  # everything on every rank
        ("zero1", 4, 1, 4 * (4 + 4) * PSI + 8 * PSI),  # Adam state once across the ranks
        ("zero2", 4, 1, 16 * PSI),  # FSDP2 reshards parameters between steps as well
        ("zero3", 4, 1, 16 * PSI),
        ("zero3", 4, 2, 2 * 16 * PSI),  # HSDP: one sharded copy per replica
    ],
)
def test_the_floor_is_each_part_once_per_shard_group_or_once_per_rank(strategy, world_size, replicas, expected):
    config = RunConfig.of(strategy, world_size=world_size, replicas=replicas, size="gpt2-small")
    assert sum(model_state_bytes(config).values()) == expected


def test_available_memory_is_memavailable_capped_by_the_cgroups_own_limit(tmp_path):
    meminfo, cgroup = tmp_path / "meminfo", tmp_path / "cgroup"
    meminfo.write_text("MemTotal:       24000000 kB\nMemFree:         1000 kB\nMemAvailable:   20000000 kB\n")
    cgroup.mkdir()
    assert available_bytes(meminfo, cgroup) == 20_000_000 * 1024  # no cgroup files: MemAvailable
    (cgroup / "memory.max").write_text("max\n")
    (cgroup / "memory.current").write_text("5000000000\n")
    assert available_bytes(meminfo, cgroup) == 20_000_000 * 1024  # no limit set
    (cgroup / "memory.max").write_text("8000000000\n")
    assert available_bytes(meminfo, cgroup) == 3_000_000_000  # the container's own room is smaller
    assert available_bytes(tmp_path / "absent", tmp_path / "absent") is None


PROCESS = 128 * 2**20  # each rank process's floor: torch and gloo, measured at 138 MiB


def test_a_launch_over_the_floor_is_refused_with_its_figures_and_one_under_it_runs():
    # 8-token sequences save about 13 MB for backward per rank, under the gradients' 4 Ψ bytes: the
    # model states at the optimizer step are the floor.
    ddp = RunConfig.of("ddp", world_size=2, size="gpt2-small", seq_len=8)
    floor = 2 * 16 * PSI + 2 * PROCESS
    check_fits([ddp], available=floor, processes=2)  # exactly the floor: allowed
    with pytest.raises(HostMemoryTooSmall) as refused:
        check_fits([RunConfig.of("zero3", world_size=2, seq_len=8), ddp], available=floor - 1, processes=2)
    message = str(refused.value)
    assert "ddp(seq_len=8) on 2 CPU rank(s) of gpt2-small" in message and f"{PSI:,} parameters" in message
    assert "256.0 MiB for 2 rank process(es)" in message
    assert "or zero3, which shards them" in message and "sharding-lab plan --size gpt2-small" in message
    check_fits([ddp.replace(device="cuda")], available=2 * PROCESS, processes=2)  # GPU memory is not the host's
    check_fits([ddp], available=None, processes=2)  # unknown (not Linux): nothing to check


def test_more_rank_processes_than_the_host_can_start_are_refused_for_any_model():
    # zero3 of tiny shards its few KiB of states; 100,000 processes of torch are what cannot fit.
    many = RunConfig.of("zero3", world_size=100_000)
    with pytest.raises(HostMemoryTooSmall) as refused:
        check_fits([many], available=64 * 2**30, processes=100_000)
    message = str(refused.value)
    assert "starts 100,000 rank processes" in message and "12.2 TiB for all of them" in message
    assert "smaller --world-size" in message and "sharding-lab plan --size tiny --gpus 100000" in message
    with pytest.raises(HostMemoryTooSmall, match="starts 100,000 rank processes"):  # on GPUs too: host processes
        check_fits([many.replace(device="cuda")], available=64 * 2**30, processes=100_000)
    check_fits([many], available=64 * 2**30, processes=1)  # a rank view is one process: it fits


def test_past_the_planners_bound_the_refusal_suggests_no_plan_the_planner_would_refuse():
    beyond = RunConfig.of("zero3", world_size=BOUNDS.gpus + 1)
    with pytest.raises(HostMemoryTooSmall) as refused:
        check_fits([beyond], available=64 * 2**30, processes=beyond.world_size)
    message = str(refused.value)
    assert f"--gpus {beyond.world_size}" not in message
    assert "at up to 131,072 GPUs: `sharding-lab plan --size tiny`" in message
    # and the planner's CLI does refuse that many
    with pytest.raises(SystemExit) as usage:
        cli.main(["plan", "--size", "tiny", "--gpus", str(beyond.world_size)])
    assert usage.value.code == 2


def test_the_cli_refuses_a_world_no_host_can_start_before_any_rank_starts(capsys):
    assert cli.main(["measure", "--strategy", "zero3", "--world-size", "100000", "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "starts 100,000 rank processes" in captured.err and "Traceback" not in captured.err


def test_the_cli_refuses_a_model_no_machine_here_can_hold_before_any_rank_starts(capsys):
    # 70b under DDP on 2 CPU ranks: 2 x 16 bytes x 65.3e9 parameters, about 1.9 TiB.
    assert cli.main(["measure", "--strategy", "ddp", "--world-size", "2", "--size", "70b", "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "needs at least 1.9 TiB of host memory" in captured.err and "Traceback" not in captured.err


def saved_for_backward(size: str, batch: int, seq: int, activation_checkpointing: bool) -> int:
    """Bytes autograd really holds at the end of a forward of the engine's GPT on CPU in fp32: every
    storage a saved tensor lives in (parameters aside, each storage once), the batch and the loss."""
    import torch

    from sharding_lab.engine.model import GPT

    torch.manual_seed(0)
    config = config_for(size)
    model = GPT(config)
    model.activation_checkpointing = activation_checkpointing
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    idx, targets = (torch.randint(0, config.vocab_size, (batch, seq)) for _ in range(2))
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in (idx, targets)}

    def pack(tensor):
        if (pointer := tensor.untyped_storage().data_ptr()) not in parameters:
            storages[pointer] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = model(idx, targets)
    storages[loss.untyped_storage().data_ptr()] = loss.untyped_storage().nbytes()
    return sum(storages.values())


@pytest.mark.parametrize(
    ("size", "batch", "seq", "activation_checkpointing"),
    [("tiny", 2, 32, False), ("mini", 3, 64, False), ("mini", 1, 17, False), ("mini", 3, 64, True)],
)
def test_the_activation_floor_is_what_a_real_forward_saves_for_backward(size, batch, seq, activation_checkpointing):
    config = RunConfig.of("ddp", world_size=3, size=size, batch_size=batch, seq_len=seq,
                          activation_checkpointing=activation_checkpointing)
    assert activations_floor(config) == 3 * saved_for_backward(size, batch, seq, activation_checkpointing)
    assert activations_floor(config, ranks=1) == saved_for_backward(size, batch, seq, activation_checkpointing)


def test_a_micro_batch_no_host_can_hold_is_refused_at_its_floor_with_the_flags_that_shrink_it():
    # tiny's states (a few hundred KiB) are nothing beside 1,024 sequences' saved activations: the end of
    # a forward (parameters and Adam state, 12 bytes per parameter, beside them) is the fuller moment.
    config = RunConfig.of("ddp", world_size=2, batch_size=1024, seq_len=32)
    saved = saved_for_backward("tiny", 1024, 32, False)
    floor = 2 * 12 * num_params(config_for("tiny")) + 2 * saved + 2 * PROCESS
    check_fits([config], available=floor, processes=2)
    with pytest.raises(HostMemoryTooSmall) as refused:
        check_fits([config], available=floor - 1, processes=2)
    message = str(refused.value)
    assert "with micro-batches of 1,024 x 32 tokens" in message and "saved for backward" in message
    assert "smaller --micro-batch or --seq, or --activation-checkpointing" in message
    checkpointed = RunConfig.of("ddp", world_size=2, batch_size=1024, seq_len=32, activation_checkpointing=True)
    assert activations_floor(checkpointed) == 2 * saved_for_backward("tiny", 1024, 32, True) < 2 * saved


def test_a_rank_view_holds_rank_0s_share_alone():
    zero3 = RunConfig.of("zero3", world_size=4, size="gpt2-small")
    assert model_state_bytes(zero3, ranks=1) == {"params": PSI, "grads": PSI, "optimizer": 2 * PSI}  # 16 Ψ / 4
    ddp = RunConfig.of("ddp", world_size=8, size="gpt2-small", seq_len=8)
    assert model_state_bytes(ddp, ranks=1) == {"params": 4 * PSI, "grads": 4 * PSI, "optimizer": 8 * PSI}
    room = 16 * PSI + 8 * PROCESS  # what one process of ddp needs, far from what 8 real ranks would
    check_fits([ddp], available=room, processes=1)
    with pytest.raises(HostMemoryTooSmall, match="summed over the ranks"):
        check_fits([ddp], available=room, processes=8)


def test_the_cli_refuses_a_micro_batch_no_machine_here_can_hold_before_any_rank_starts(capsys):
    # 10^7 sequences of tiny's 32 tokens save about 2.6 TiB per rank for backward.
    assert cli.main(["measure", "--strategy", "ddp", "--world-size", "2", "--micro-batch", "10000000", "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    assert "saved for backward" in captured.err and "smaller --micro-batch" in captured.err
