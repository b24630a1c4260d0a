"""Every lab's effect at scale: the lab's own configurations, planned for 7B on 64 GPUs and 70B on 1024."""

from __future__ import annotations

import pytest

from sharding_lab.labs.at_scale import SCALES, at_scale_line, lab_requests, scaled_request, simulated_figures
from sharding_lab.labs.registry import LABS, get_lab
from sharding_lab.run_config import RunConfig
from sharding_lab.strategies import Strategy

SEVEN_B = SCALES[0]
# 7b: 32 blocks of width 4096 (12C^2 + 13C each, with biases), vocab 50304 embedding and untied head,
# 2048 positions, final LayerNorm: worked out by hand, not by the code under test.
C, L, V, T = 4096, 32, 50304, 2048
PSI_7B = L * (12 * C * C + 13 * C) + 2 * V * C + T * C + 2 * C


def test_the_scales_are_7b_on_64_and_70b_on_1024():
    assert [(s.size, s.gpus) for s in SCALES] == [("7b", 64), ("70b", 1024)]
    assert "6.9B parameters" in SEVEN_B.label and "64 x 80 GB GPUs" in SEVEN_B.label
    assert PSI_7B == 6_864_642_048  # the figure the label rounds to 6.9B


def test_a_lab_configuration_keeps_its_strategy_and_options_at_scale():
    config = RunConfig.of("zero3", world_size=4, replicas=2, activation_checkpointing=True, grad_accum_steps=3,
                          mixed_precision=True, cpu_offload=True, prefetch=False)
    request = scaled_request(config, SEVEN_B)
    assert request.strategy is Strategy.ZERO3 and request.model.name == "7b"
    assert (request.mesh.replicas, request.mesh.shards) == (8, 8)  # HSDP shards within a node of 8
    assert request.activation_checkpointing and request.mixed_precision and request.cpu_offload
    assert request.grad_accum_steps == 3 and not request.prefetch
    assert (request.micro_batch, request.seq, request.gpu_memory_gb) == (1, 2048, 80)
    # zero3 with reshard-after-forward off is what the engine runs as zero2.
    assert scaled_request(RunConfig.of("zero3", reshard_after_forward=False), SEVEN_B).strategy is Strategy.ZERO2


def test_ddp_at_7b_on_64_gpus_does_not_fit_and_zero3_does():
    line = at_scale_line(get_lab("what-fsdp-shards"))
    requests = lab_requests(get_lab("what-fsdp-shards"), SEVEN_B)
    assert list(requests) == ["ddp", "zero3"]
    # DDP holds 16 bytes per parameter before any activation: 110 GB > 80 GB.
    assert 16 * PSI_7B > 80e9
    assert "ddp" in line and "does NOT fit" in line.split("70b")[0]
    seven_b = line.split("; 70b")[0] if "; 70b" in line else line.split("70b (")[0]
    zero3_part = seven_b.split("zero3 ")[1]
    assert zero3_part.split(",")[1].strip() == "fits"
    ddp_gb = float(seven_b.split("ddp ")[1].split(" GB")[0])
    assert ddp_gb * 1e9 >= 16 * PSI_7B - 0.05e9  # at least the model states, to the printed rounding


@pytest.mark.parametrize("lab_id", list(LABS))
def test_every_lab_has_a_line_for_each_scale_naming_each_configuration(lab_id):
    lab = get_lab(lab_id)
    line = at_scale_line(lab)
    assert line.startswith("At scale (")
    for scale in SCALES:
        assert scale.label in line
        for label in lab_requests(lab, scale):
            assert f"{label} " in line
    assert ("(simulated)" in line) or ("(analytic)" in line)


def test_simulated_figures_are_labelled_simulated_only_where_stored():
    stored = simulated_figures()
    for lab in LABS.values():
        line = at_scale_line(lab)
        if "(simulated)" in line:
            assert stored, "a line says simulated but no simulated figures are stored"


@pytest.mark.slow
def test_the_stored_simulated_figures_cover_every_lab_configuration_and_are_current():
    from sharding_lab.engine.at_scale import simulated_requests
    from sharding_lab.engine.simulate import simulate
    from sharding_lab.plan_command import run_config_for

    requests = simulated_requests(LABS.values())
    assert set(simulated_figures()) == set(requests), "rerun `sharding-lab at-scale --write`"
    # One stored figure simulated again, byte for byte.
    key = next(k for k in requests if k.startswith("7b zero3 mesh=64 ") and "mp=1" in k)
    simulation = simulate(run_config_for(requests[key]))
    assert simulation.peak_bytes == simulated_figures()[key]["peak_bytes"]
    assert simulation.model_states["total"] == simulated_figures()[key]["model_states_bytes"]


def test_the_committed_lab_results_carry_todays_at_scale_lines():
    # exports/lab-results.json (what the app shows before a lab is run here, and the Anki decks carry)
    # stores each lab's at-scale line as written when it was committed: a planner change must rewrite it.
    import json
    from pathlib import Path

    committed = json.loads((Path(__file__).parents[1] / "exports" / "lab-results.json").read_text(encoding="utf-8"))
    stale = [lab_id for lab_id, result in committed.items() if result.get("at_scale") != at_scale_line(get_lab(lab_id))]
    assert stale == [], f"stale at-scale lines in exports/lab-results.json: {stale}"


def test_the_line_says_where_its_figures_hold():
    # Every claim says where it holds: these are planned (not measured) for PyTorch's implementations,
    # and a configuration not marked bf16 is fp32 (the lines marked only the bf16 ones).
    line = at_scale_line(get_lab("fsdp2-mixed-precision"))
    assert "PyTorch's implementations, planned, not measured" in line
    assert "fp32 unless marked bf16" in line and "torch.optim.Adam" in line
    assert "zero3 (bf16) " in line and "zero3 " in line
