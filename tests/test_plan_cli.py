"""`sharding-lab plan`: tables, --json, the simulation column, and plain errors for bad input."""

from __future__ import annotations

import argparse
import json
from types import SimpleNamespace

import pytest

from sharding_lab import plan_command
from sharding_lab.cli import main


def run(argv, capsys):
    code = main(["plan", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_all_strategies_side_by_side(capsys):
    code, out, _ = run(["--size", "7b", "--gpus", "64", "--micro-batch", "1", "--seq", "2048",
                        "--strategy", "all", "--mixed-precision"], capsys)
    assert code == 0
    for text in ("ddp", "zero1", "zero2", "zero3", "Side by side", "DeepSpeed", "wire (derived)", "leaves out"):
        assert text in out


def test_the_side_by_side_table_names_its_bytes(capsys, monkeypatch):
    # tiny (Ψ = 60,096) on 2 GPUs, fp32: DDP's all-reduce is 4 B x Ψ = 240,384 B (234.8 KiB) at the API and
    # zero2's all-gather plus reduce-scatter 2 x 240,384 B (469.5 KiB): logical bytes, not `estimate`'s
    # comm/step (the paper's volume, equal for the two), which the column was once called.
    monkeypatch.setenv("COLUMNS", "200")
    code, out, _ = run(["--size", "tiny", "--gpus", "2", "--strategy", "all"], capsys)
    assert code == 0
    summary = out[out.index("Side by side"):].splitlines()
    header = [cell.strip() for cell in summary[2].split("┃")]
    assert header[6:8] == ["DeepSpeed GB", "logical/step"]
    rows = {cells[1]: cells for line in summary if line.startswith("│")
            for cells in [[cell.strip() for cell in line.split("│")]]}
    assert rows["ddp"][7] == "234.8 KiB" and rows["zero2"][7] == "469.5 KiB"


@pytest.mark.parametrize("argv", [["--size", "7b", "--gpus", "64", "--mixed-precision"],
                                  ["--size", "70b", "--mesh", "128x8", "--strategy", "zero2", "--grad-accum", "8"]])
def test_the_communication_table_reads_whole_in_80_columns(capsys, monkeypatch, argv):
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = run(argv, capsys)
    assert code == 0
    table = out[out.index("communication per optimizer step"):out.index("analytic holds for")].splitlines()
    assert max(len(line) for line in table) <= 80
    rows = [line for line in table if line.startswith("│")]
    assert all(line.rstrip()[-1] in "┓┃┩│┘" for line in table[1:] if line.strip()), table  # the right edge not cropped
    assert sum("│ reduce_scatter │" in line for line in rows) == 1 and not any("…" in line for line in table)


def test_a_strategy_that_does_not_fit_even_one_sequence_says_so(capsys):
    # 7b's DDP replica alone is 16 B x 6.86e9 = 110 GB, beyond 72 GB usable: no micro-batch fits.
    code, out, _ = run(["--size", "7b", "--gpus", "64", "--strategy", "all"], capsys)
    assert code == 0
    summary = out[out.index("Side by side"):]
    ddp_row = next(line for line in summary.splitlines() if line.startswith("│ ddp"))
    assert [cell.strip() for cell in ddp_row.split("│")][4:6] == ["NO", "none"]
    code, out, _ = run(["--size", "7b", "--gpus", "64", "--strategy", "ddp", "--json"], capsys)
    assert json.loads(out)["strategies"]["ddp"]["analytic"]["largest_micro_batch"] == 0  # JSON keeps the number


def test_json_carries_every_category_and_the_deepspeed_figure(capsys):
    code, out, _ = run(["--size", "1b", "--gpus", "8", "--micro-batch", "4", "--seq", "512",
                        "--mixed-precision", "--json"], capsys)
    assert code == 0
    zero3 = json.loads(out)["strategies"]["zero3"]
    categories = zero3["analytic"]["peak"]["categories"]
    assert set(categories) == {"parameters", "gradients", "optimizer_state", "activations", "temporaries",
                               "all_gather_buffers", "reduce_scatter_buffers"}
    assert zero3["analytic"]["peak"]["total_bytes"] == sum(c["bytes"] for c in categories.values())
    assert zero3["deepspeed"]["gpu_bytes"] == 3_151_260_672  # 2.93 GiB, as DeepSpeed prints
    assert zero3["analytic"]["fits"] is True and zero3["analytic"]["largest_micro_batch"] > 4
    assert "derived" in json.loads(out)["wire_bytes_derived_from"]


def test_a_shape_by_hand_and_an_hsdp_mesh(capsys):
    code, out, _ = run(["--layers", "2", "--width", "64", "--heads", "4", "--vocab", "512", "--seq", "64",
                        "--mesh", "2x4", "--strategy", "zero2", "--grad-accum", "2", "--json"], capsys)
    assert code == 0
    comm = json.loads(out)["strategies"]["zero2"]["analytic"]["communication"]
    assert {(c["op"], c["mesh_dim"], c["ranks"]) for c in comm} == {
        ("all_gather", "shard", 4), ("reduce_scatter", "shard", 4), ("all_reduce", "replicate", 2)}


def test_simulation_column_from_the_simulator_it_is_given(capsys):
    parser = argparse.ArgumentParser()
    breakdown = {"params": 100, "unsharded_params": 20, "optimizer": 200, "activations": 50, "inputs": 6,
                 "temporaries": 30, "total": 406}
    fake = SimpleNamespace(peak_breakdown=breakdown, num_params=1, wall_s=0.5, method="fake")
    plan_command.register(parser.add_subparsers(), simulate=lambda request: fake)
    args = parser.parse_args(["plan", "--size", "mini", "--gpus", "2", "--simulate", "--strategy", "all", "--json"])
    assert args.func(args) == 0
    strategies = json.loads(capsys.readouterr().out)["strategies"]
    assert strategies["zero3"]["simulation"]["peak"]["total_bytes"] == 406
    assert strategies["zero3"]["simulation"]["peak"]["categories"]["parameters"]["bytes"] == 120
    assert strategies["ddp"]["simulation"] == {"unavailable": "simulation not available for ddp (it simulates FSDP2: zero2, zero3)"}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--layers", "2", "--width", "10", "--heads", "3", "--vocab", "32", "--seq", "8", "--gpus", "2"], "divide"),
        (["--size", "13b", "--gpus", "8"], "unknown model size"),
        (["--size", "mini", "--gpus", "8", "--strategy", "zero1", "--cpu-offload"], "CPU offload"),
        (["--size", "mini", "--mesh", "2x4", "--strategy", "ddp"], "HSDP"),
        (["--size", "mini", "--gpus", "2", "--seq", "65"], "exceeds"),
        (["--width", "8", "--gpus", "2"], "missing"),
        (["--size", "mini", "--gpus", "2", "--seq-len", "32"], "a named size has its own"),
        (["--size", "tiny", "--layers", "2", "--width", "64", "--gpus", "2"],
         "--layers --width give a shape of your own; --size tiny has its own"),
        (["--layers", "2", "--width", "64", "--heads", "4", "--vocab", "512", "--seq-len", "32", "--seq", "64",
          "--gpus", "2"], "exceeds"),
    ],
)
def test_bad_input_is_a_message_not_a_traceback(argv, message, capsys):
    code, out, err = run(argv, capsys)
    assert code == 2 and message in err and "Traceback" not in err and out == ""


@pytest.mark.parametrize(("argv", "message"), [
    (["--gpus", "131073"], "argument --gpus: must be at most 131,072, got '131073'"),  # as the app's page
    (["--gpus", "2", "--layers", "1025", "--width", "8", "--heads", "1", "--vocab", "8", "--seq", "8"],
     "argument --layers: must be at most 1,024"),
    (["--gpus", "2", "--gpu-memory-gb", "inf"], "argument --gpu-memory-gb: must be a positive, finite number, got 'inf'"),
    (["--gpus", "2", "--gpu-memory-gb", "10001"], "argument --gpu-memory-gb: must be at most 10,000"),
    (["--gpus", "2", "--grad-accum", "4097"], "argument --grad-accum: must be at most 4,096"),
    # These were one-line errors naming no flag ("headroom is a fraction ...", "a mesh needs ...").
    (["--mesh", "1000x1000"], "argument --mesh: '1000x1000' is 1,000,000 GPUs, more than the 131,072 a plan takes"),
    (["--mesh", "2by2"], "argument --mesh: not a mesh: '2by2'"),
    (["--mesh", "2x0"], "argument --mesh: a mesh needs at least 1 x 1 GPUs, got 2 x 0"),
    (["--gpus", "2", "--headroom", "1"], "argument --headroom: must be a fraction in [0, 1), got '1'"),
    (["--gpus", "2", "--headroom", "-0.1"], "argument --headroom: must be a fraction in [0, 1), got '-0.1'"),
    (["--gpus", "2", "--headroom", "nan"], "argument --headroom: must be a fraction in [0, 1), got 'nan'"),
])
def test_inputs_beyond_a_plans_bounds_are_usage_errors(argv, message, capsys):
    # The bounds are the app's too; unbounded, --gpus 100000000 planned ZeRO-1 for minutes in 11 GB.
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", "--size", "tiny", *argv] if "--layers" not in argv else ["plan", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_argument_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", "--size", "mini"])  # neither --gpus nor --mesh
    assert exit_info.value.code == 2
    assert "--gpus" in capsys.readouterr().err


@pytest.mark.slow
def test_simulate_runs_the_engine(capsys):
    code, out, _ = run(["--size", "mini", "--gpus", "2", "--micro-batch", "2", "--seq", "64", "--simulate", "--json"],
                       capsys)
    assert code == 0
    zero3 = json.loads(out)["strategies"]["zero3"]
    assert zero3["simulation"]["peak"]["total_bytes"] == zero3["analytic"]["peak"]["total_bytes"]


def test_a_shape_takes_its_length_from_seq_len_and_a_shorter_sequence_from_seq(capsys):
    shape = ["--layers", "2", "--width", "64", "--heads", "4", "--vocab", "512", "--gpus", "2", "--json"]
    code, out, _ = run([*shape, "--seq-len", "128", "--seq", "32"], capsys)
    assert code == 0
    request = json.loads(out)["strategies"]["zero3"]["analytic"]["request"]
    # 128 positions in the embedding (its parameters), 32 tokens per sequence in the step.
    assert request["seq"] == 32
    longer = json.loads(run([*shape, "--seq-len", "128"], capsys)[1])["strategies"]["zero3"]["analytic"]
    shorter = json.loads(out)["strategies"]["zero3"]["analytic"]
    assert longer["num_params"] == shorter["num_params"] == 2 * (12 * 64 * 64 + 13 * 64) + 2 * 512 * 64 + 128 * 64 + 2 * 64
    assert longer["request"]["seq"] == 128


def test_all_with_cpu_offload_says_which_strategies_it_left_out(capsys):
    code, out, err = run(["--size", "mini", "--gpus", "8", "--strategy", "all", "--cpu-offload", "--json"], capsys)
    assert code == 0 and list(json.loads(out)["strategies"]) == ["zero2", "zero3"]
    assert "ddp, zero1 left out: CPU offload and HSDP are FSDP2's (planning zero2, zero3)" in err


@pytest.mark.slow
def test_the_command_exits_without_teardown_once_its_whole_answer_is_out(tmp_path):
    """`sharding-lab plan` as a process (cli.entry): the JSON arrives whole through a pipe, with the
    exit status main returns, and the atexit handlers a teardown would run are skipped."""
    import subprocess
    import sys

    marker = tmp_path / "atexit-ran"
    # The simulation imports torch; an atexit handler registered before shows whether teardown ran.
    script = (f"import atexit, sys; atexit.register(lambda: open({str(marker)!r}, 'w').close()); "
              "sys.argv[0] = 'sharding-lab'; from sharding_lab.cli import entry; entry()")
    argv = ["plan", "--size", "mini", "--gpus", "2", "--micro-batch", "2", "--seq", "64", "--simulate", "--json"]
    done = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["strategies"]["zero3"]["simulation"]["peak"]["total_bytes"] > 0
    assert not marker.exists(), "no teardown: atexit handlers skipped"

    refused = subprocess.run([sys.executable, "-c", script, "plan", "--size", "mini", "--gpus", "2", "--seq", "0"],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "--seq" in refused.stderr and "Traceback" not in refused.stderr

    # A command that starts processes keeps its teardown (multiprocessing's cleanup runs at exit).
    listed = subprocess.run([sys.executable, "-c", script, "list"], capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0 and marker.exists()


# 7b: Ψ = 6,864,642,048 parameters; its largest layer is wte (or lm_head), 50,304 x 4,096 = 206,045,184.
def test_the_deepspeed_row_under_hsdp_splits_the_states_over_the_shard_group(capsys):
    code, out, _ = run(["--size", "7b", "--mesh", "8x8", "--strategy", "zero3", "--json"], capsys)
    assert code == 0
    deepspeed = json.loads(out)["strategies"]["zero3"]["deepspeed"]
    # 4 B x the largest layer + 18 B x Ψ / 8: 824,180,736 + 15,445,444,608 (not / 64, the world size).
    assert deepspeed["gpu_bytes"] == 16_269_625_344
    assert "N = 8, the shard group of the 8x8 mesh" in deepspeed["counts"]


@pytest.mark.parametrize(
    ("strategy", "gpu_bytes", "counts"),
    [
        ("zero3", 824_180_736, "only a buffer of the largest layer, 4 B per parameter of it"),  # 4 B x 206,045,184
        ("zero2", 13_729_284_096, "2 B per parameter, the fp16 parameters every GPU keeps"),  # 2 B x Ψ
    ],
)
def test_the_deepspeed_row_with_cpu_offload_says_what_it_counts(strategy, gpu_bytes, counts, capsys):
    code, out, _ = run(["--size", "7b", "--gpus", "8", "--strategy", strategy, "--cpu-offload", "--json"], capsys)
    assert code == 0
    deepspeed = json.loads(out)["strategies"][strategy]["deepspeed"]
    assert deepspeed["gpu_bytes"] == gpu_bytes
    assert deepspeed["counts"].startswith(counts)
    assert "18/N" not in deepspeed["counts"]  # offloaded: the N-split states are not on the GPU


SHAPE = ["--layers", "1", "--width", "16", "--heads", "1", "--vocab", "8", "--seq-len", "1"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("argv", "strategy"),
    [
        # Gaps the fuzz found, now counted (each had a note here):
        ([*SHAPE, "--gpus", "1"], "zero3"),  # one GPU gathers nothing (was 476 B high)
        (["--layers", "2", "--width", "32", "--heads", "2", "--vocab", "64", "--seq-len", "4", "--gpus", "1",
          "--grad-accum", "2"], "zero2"),  # (was 11.9% high)
        (["--layers", "2", *SHAPE[2:], "--gpus", "2", "--grad-accum", "2", "--activation-checkpointing"],
         "zero3"),  # a checkpointed block's forward holds 10 x tokens x width at its gelu (was 320 B low)
        # FSDP2 holds the root's last gradient (lm_head's) through its reduce on 2 GPUs or more (was 16 KiB low):
        ([*SHAPE[:6], "--vocab", "512", "--seq-len", "1", "--gpus", "2", "--mixed-precision"], "zero3"),
        # torch's FSDPMemTracker held the root's last gradient through its reduce (the simulation was 2.1% high):
        (["--layers", "1", "--width", "34", "--heads", "2", "--vocab", "601", "--seq-len", "1", "--gpus", "1",
          "--micro-batch", "2"], "zero3"),
        # Accumulation in fp32 adds wpe's new gradient to the kept one before wte's is made (was 64 B high):
        ([*SHAPE[:6], "--vocab", "512", "--seq-len", "1", "--gpus", "1", "--grad-accum", "2"], "zero3"),
        # Under bf16 a micro-batch's new gradients wait in .grad for their unit's post-backward beside the kept
        # fp32 ones (was 206 B low; 4.7% on a 4-block 7b):
        ([*SHAPE, "--gpus", "2", "--mixed-precision", "--grad-accum", "2"], "zero3"),
        # Under bf16 an all-gather's input is a bf16 copy of the unit's shard, alive beside its output (with the
        # kept gradients the forward's prefetch is the peak; was 11,604 B low):
        (["--layers", "2", "--width", "32", *SHAPE[4:], "--gpus", "2", "--mixed-precision", "--grad-accum", "2"],
         "zero3"),
        # Under bf16 a middle micro-batch ends its backward with every kept fp32 gradient and the root's new
        # bf16 ones, a tied head's three included (was 3,096 B low):
        (["--layers", "2", "--width", "16", "--heads", "1", "--vocab", "512", "--seq-len", "1", "--gpus", "3",
          "--mixed-precision", "--tied", "--grad-accum", "3"], "zero3"),
    ],
)
def test_where_the_fuzz_found_a_gap_now_counted_the_analytic_peak_is_the_simulations(argv, strategy, capsys):
    code, out, _ = run([*argv, "--strategy", strategy, "--simulate", "--json"], capsys)
    assert code == 0
    plan = json.loads(out)["strategies"][strategy]
    assert plan["analytic"]["peak"]["total_bytes"] == plan["simulation"]["peak"]["total_bytes"]
