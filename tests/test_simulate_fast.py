"""The extrapolated simulation (3 and 4 blocks, after the quick warm-up) byte-equal to simulating every
block after a whole warm-up step, for every engine option; and the extrapolation itself, torch-free, on synthetic steps whose peak moves as L grows."""

from __future__ import annotations

import pytest

from sharding_lab.engine import simulate_extrapolate as extrapolation
from sharding_lab.engine.simulate_extrapolate import Event, NotExtrapolable, PeakKeeper, cut, extrapolate
from sharding_lab.run_config import RunConfig

# --- the extrapolation on synthetic steps (no torch) ------------------------------------------------------

# Categories: (sharded states, activations, gradients, temporaries) and the total, as the tracker's are.
STATES, ACTIVATION, GRAD = 100, 11, 7  # one block's sharded states, saved activations and gradient shard


def _v(*parts: int) -> tuple[int, ...]:
    return (*parts, sum(parts))


def synthetic_step(n: int, head_spike: int = 0, tail_spike: int = 0, optimizer_spike: int = 0) -> list[Event]:
    """A step shaped like FSDP's: the prefix, a forward pass saving ACTIVATION a block, a backward pass
    freeing it and making GRAD a block, then the optimizer. Temporaries differ at the ends of a pass."""
    root = 50
    events = [Event(None, False, False, _v(root + n * STATES, 0, 0, t)) for t in (3, 9, 4)]
    for j in range(n):  # forward
        edge = head_spike if j == 0 else (tail_spike if j == n - 1 else 0)
        for t in (5, 20 + edge, 2):
            events.append(Event(j, False, False, _v(root + n * STATES, j * ACTIVATION, 0, t)))
    events.append(Event(None, True, False, _v(root + n * STATES, n * ACTIVATION + 40, 0, 0)))  # the head
    for i, j in enumerate(range(n - 1, -1, -1)):  # backward
        for t in (6, 30, 1):
            events.append(Event(j, True, False, _v(root + n * STATES, (j + 1) * ACTIVATION, i * GRAD, t)))
    start = _v(root + n * STATES, 0, n * GRAD, 0)
    for t in (8, 0, 12, 0, *([9, 0] * n), 12 + optimizer_spike, 0):  # root, blocks, root again
        events.append(Event(None, False, True, tuple(s + d for s, d in zip(start, _v(0, 0, 0, t), strict=True))))
    return events


def synthetic_timeline(n: int, **spikes) -> extrapolation.Timeline:
    events = synthetic_step(n, **spikes)
    marks = {"after_step": _v(50 + n * STATES, 0, n * GRAD, 0)}
    return cut(events, n, _v(50 + n * STATES, 0, n * GRAD, 0), marks)


def directly(n: int, **spikes) -> extrapolation.StepMemory:
    keeper = PeakKeeper()
    for event in synthetic_step(n, **spikes):
        keeper.add(event.bytes)
    return keeper.result({"after_step": _v(50 + n * STATES, 0, n * GRAD, 0)})


@pytest.mark.parametrize("spikes", [{}, {"head_spike": 500}, {"tail_spike": 300}, {"optimizer_spike": 2000}])
def test_extrapolation_equals_the_step_worked_out_directly(spikes):
    three, four = synthetic_timeline(3, **spikes), synthetic_timeline(4, **spikes)
    for n in (3, 4, 5, 6, 17, 80, 1000):
        assert extrapolate(three, four, n) == directly(n, **spikes), n


def test_the_peak_moves_from_the_head_of_forward_to_the_start_of_backward_and_extrapolation_follows():
    # A spike on the first forward block wins while L is small; activations (L x 7) overtake it later.
    three, four = synthetic_timeline(3, head_spike=500), synthetic_timeline(4, head_spike=500)
    small, large = extrapolate(three, four, 5), extrapolate(three, four, 200)
    assert small.peak[3] == 20 + 500  # the peak moment is the head spike's (temporaries)
    assert large.peak[1] == 200 * ACTIVATION + 40  # ... and later the head, every activation saved
    assert (small, large) == (directly(5, head_spike=500), directly(200, head_spike=500))


def test_a_step_without_the_structure_is_refused():
    three, four = synthetic_timeline(3), synthetic_timeline(4)
    shorter_prefix = extrapolation.Timeline(
        four.n_blocks, four.prefix[:-1], four.passes, four.optimizer, four.optimizer_start, four.marks
    )
    with pytest.raises(NotExtrapolable, match="prefix"):
        extrapolate(three, shorter_prefix, 10)
    with pytest.raises(NotExtrapolable, match="visits blocks"):
        cut([Event(1, False, False, _v(1)), Event(0, False, False, _v(1))], 2, _v(0), {})


# --- the simulation: extrapolated against every block simulated ---------------------------------------------


def _config(strategy: str = "zero3", world_size: int = 4, n_layer: int = 6, tied: bool = False, **options) -> RunConfig:
    options.setdefault("seq_len", 16)
    return RunConfig.of(
        strategy, world_size=world_size, size="tiny", model_overrides={"n_layer": n_layer, "tied": tied}, **options
    )


CONFIGS = {
    "zero3 N=4 L=5": _config(n_layer=5),
    "zero3 N=3 L=9 uneven shards": _config(world_size=3, n_layer=9, batch_size=1),
    "zero2 N=8 L=6": _config("zero2", world_size=8),
    "mixed precision N=4 L=7": _config(n_layer=7, mixed_precision=True),
    "no prefetch N=2 L=6": _config(world_size=2, prefetch=False),
    "checkpointing N=4 L=6 seq 32": _config(activation_checkpointing=True, seq_len=32),
    "cpu offload N=4 L=6": _config(cpu_offload=True),
    "hsdp 2x2 L=6": _config(replicas=2),
    "grad accum 3 N=4 L=6": _config(grad_accum_steps=3),
    "tied head N=4 L=6": _config(tied=True),
    "all at once: hsdp 2x4, zero2, bf16, checkpointing, accum 2, L=8": _config(
        "zero2", world_size=8, n_layer=8, replicas=2, mixed_precision=True, activation_checkpointing=True,
        grad_accum_steps=2, batch_size=3,
    ),
    "mini-shaped N=16 L=10 seq 64": RunConfig.of("zero3", world_size=16, size="mini", seq_len=64, batch_size=1),
}


def _bytes(result) -> tuple:
    return (result.peak_bytes, result.peak_breakdown, result.category_peaks, result.after_forward, result.after_step)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CONFIGS))
def test_extrapolated_is_byte_equal_to_every_block_simulated(name):
    from sharding_lab.engine.simulate import Warmup, simulate

    config = CONFIGS[name]
    # The slowest faithful simulation: every block, after a whole warm-up step as measure runs it.
    fast, full = simulate(config), simulate(config, method="full", warmup=Warmup.STEP)
    assert fast.extrapolated and not full.extrapolated, fast.notes
    assert "3 and 4 blocks, extrapolated exactly" in fast.method
    assert "every one of the" in full.method
    assert _bytes(fast) == _bytes(full)
    assert fast.model_states_match_prediction


@pytest.mark.slow
def test_a_model_of_four_blocks_or_fewer_is_simulated_whole():
    from sharding_lab.engine.simulate import simulate

    result = simulate(_config(n_layer=4))
    assert not result.extrapolated and "every one of the 4 blocks" in result.method
    assert "as fast as extrapolating" in result.notes[0]


@pytest.mark.slow
def test_without_the_structure_it_simulates_every_block_and_says_why(monkeypatch):
    from sharding_lab.engine import simulate as simulate_module

    def refuse(*_):
        raise NotExtrapolable("the two runs have different passes")

    monkeypatch.setattr(simulate_module.extrapolation, "extrapolate", refuse)
    config = _config(n_layer=6)
    result = simulate_module.simulate(config)
    assert not result.extrapolated
    assert "every one of the 6 blocks" in result.method
    assert result.notes == ("not extrapolated: the two runs have different passes",)
    monkeypatch.undo()
    assert _bytes(result) == _bytes(simulate_module.simulate(config))


@pytest.mark.parametrize("world_size", [2, 4])
def test_an_explicit_backward_prefetch_is_filed_as_an_all_gather_buffer(world_size):
    """FSDP2 issues an explicit backward prefetch after the parameter group's pre_backward hook, where
    torch's tracker files an all-gather's output as a backward temporary; ours files it as what it is."""
    import math

    from sharding_lab.engine.simulate import simulate
    from sharding_lab.model_config import config_for, parameter_shapes

    config = RunConfig.of("zero3", world_size=world_size, size="mini")
    result = simulate(config, method="full")
    # mini's peak is the loss's backward, with the last block's all-gather prefetched for its backward:
    # that block's fp32 parameters (every dim 0 of mini's blocks is a multiple of 4: no padding).
    block = sum(4 * math.prod(shape) for name, shape in parameter_shapes(config_for("mini")) if name.startswith("blocks.9."))
    assert block == 199_936
    assert result.peak_breakdown["all_gather_buffers"] == block
    # Beside it, the loss's backward: two logits-sized fp32 tensors, batch 2 x seq 64 x vocab 4096.
    assert result.peak_breakdown["temporaries"] == 2 * (2 * 64 * 4096 * 4)


def test_inside_a_blocks_backward_the_two_methods_file_unsharded_gradients_apart():
    """Where the peak falls inside a block's backward, torch's tracker files the unsharded gradients
    computed so far as temporaries (it labels them only at their unit's post-backward); the analytic model
    files them as gradients. The totals agree; the bytes moved are exactly those gradients."""
    from sharding_lab.engine.simulate import simulate
    from sharding_lab.plan_command import plan_from_simulation, request_for_config
    from sharding_lab.planner import analytic_peak, filing_difference

    width, vocab = 256, 512
    config = RunConfig.of("zero3", world_size=4, size="tiny", batch_size=2, seq_len=128,
                          model_overrides={"n_layer": 4, "n_embd": width, "n_head": 4, "vocab_size": vocab,
                                           "block_size": 128})
    request = request_for_config(config)
    analytic = analytic_peak(request)
    assert analytic.moment == "block 3 backward (mlp.c_proj's weight gradient)"
    simulated = plan_from_simulation(request, simulate(config)).peak
    assert analytic.total == simulated.total
    # Alive by then, not yet reduce-scattered: the root's head weight and final LayerNorm (the root's
    # post-backward comes last), and the last block's mlp.c_proj weight being computed and its bias.
    gradients = 4 * (vocab * width + 2 * width + 4 * width * width + width)
    assert gradients == 1_575_936
    assert analytic["gradients"].bytes - simulated["gradients"].bytes == gradients
    assert simulated["temporaries"].bytes - analytic["temporaries"].bytes == gradients
    by_category = [{str(c): f.bytes for c, f in peak.categories} for peak in (analytic, simulated)]
    assert filing_difference(*by_category) == (
        "the categories differ only in filing: 1.5 MiB of unsharded gradients, which the analytic model counts "
        "as gradients from the moment they are computed and FSDPMemTracker as temporaries until their unit's "
        "post-backward hands them to its reduce-scatter")


# Run in a fresh interpreter: a process with no other thread, as the fork needs (pytest's may hold a
# thread an earlier test left), which the real `_can_fork` must then allow.
_FORKED_AGAINST_SERIAL = """
import json, os, sys
from sharding_lab.engine import simulate as simulate_module
from sharding_lab.run_config import RunConfig

step_timeline = simulate_module._step_timeline
runs = sys.argv[1]

def noting_the_process(config, model_config, mesh, n_blocks, warmup):
    with open(runs, "a") as log:  # the forked child inherits this wrapper and appends its own line
        log.write(f"{n_blocks} {os.getpid()}\\n")
    return step_timeline(config, model_config, mesh, n_blocks, warmup)

def where():
    with open(runs) as log:
        found = dict(line.split() for line in log.read().splitlines())
    os.remove(runs)
    return found

def as_bytes(result):
    return [result.extrapolated, result.peak_bytes, result.peak_breakdown, result.category_peaks,
            result.after_forward, result.after_step]

def autograd_refused():
    raise simulate_module.AutogradUnusableInFork("as torch refuses a backward in a fork after its device threads")

simulate_module._step_timeline = noting_the_process
config = RunConfig.of("zero2", world_size=8, size="tiny", seq_len=16, batch_size=3, replicas=2, mixed_precision=True,
                      activation_checkpointing=True, grad_accum_steps=2, model_overrides={"n_layer": 8})
can_fork = simulate_module._can_fork()
forked = as_bytes(simulate_module.simulate(config))
forked_where = where()
# A forked copy that cannot run a backward (a CUDA build after this process's first backward): the
# process runs that block count itself, and forks no more.
simulate_module._check_autograd_runs = autograd_refused
refused = as_bytes(simulate_module.simulate(config))
refused_where = where()
can_fork_after = simulate_module._can_fork()
serial = as_bytes(simulate_module.simulate(config))
print(json.dumps({"pid": os.getpid(), "can_fork": can_fork, "forked": forked, "forked_where": forked_where,
                  "refused": refused, "refused_where": refused_where, "can_fork_after": can_fork_after,
                  "serial": serial, "serial_where": where()}))
"""


@pytest.mark.slow
def test_the_forked_run_gives_the_bytes_of_both_runs_in_one_process(tmp_path):
    """The 4-block run goes to a forked copy of the process while the process runs 3 blocks: the same
    bytes as both runs in one process, one after the other, and as when the copy cannot run a backward."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    completed = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", _FORKED_AGAINST_SERIAL, str(tmp_path / "runs")],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    assert completed.returncode == 0, completed.stderr
    found = json.loads(completed.stdout)
    pid = str(found["pid"])
    assert found["can_fork"]
    assert found["forked_where"]["3"] == pid != found["forked_where"]["4"]
    assert found["refused_where"]["3"] == pid and found["refused_where"]["4"] == pid
    assert not found["can_fork_after"]
    assert found["serial_where"] == {"3": pid, "4": pid}
    assert found["forked"][0] and found["serial"][0]  # both extrapolated
    assert found["forked"] == found["refused"] == found["serial"]
