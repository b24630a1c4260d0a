"""`sharding-lab plan`: tables, --json, the simulation column, and plain errors for bad input."""

from __future__ import annotations

import argparse
import io
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


def side_by_side_lines(out: str) -> list[list[str]]:
    """The side-by-side table's body lines as cells: the label (or the part of it on that line), then one
    per strategy."""
    summary = out[out.index("Side by side"):].splitlines()
    return [[cell.strip() for cell in line.split("│")][1:-1] for line in summary if line.startswith("│")]


def side_by_side_rows(out: str) -> dict[str, list[str]]:
    """The side-by-side table's rows by the label on their first line: a cell per strategy."""
    rows: dict[str, list[str]] = {}
    for label, *cells in side_by_side_lines(out):
        rows.setdefault(label, cells)
    return rows


def test_the_side_by_side_table_names_its_bytes(capsys, monkeypatch):
    # tiny (Ψ = 60,096) on 2 GPUs, fp32: DDP's all-reduce is 4 B x Ψ = 240,384 B (234.8 KiB) at the API and
    # zero2's all-gather plus reduce-scatter 2 x 240,384 B (469.5 KiB): logical bytes, not `estimate`'s
    # comm/step (the paper's volume, equal for the two), which the row was once called.
    monkeypatch.setenv("COLUMNS", "200")
    code, out, _ = run(["--size", "tiny", "--gpus", "2", "--strategy", "all"], capsys)
    assert code == 0
    header = next(line for line in out[out.index("Side by side"):].splitlines() if line.startswith("┃"))
    assert [cell.strip() for cell in header.split("┃")][2:-1] == ["ddp", "zero1", "zero2", "zero3"]
    logical = side_by_side_rows(out)["logical bytes per step"]
    assert logical[0] == "234.8 KiB" and logical[2] == "469.5 KiB"


def _plan(strategy: str, peak: int, fits: bool, largest: str, logical: int, wire: int) -> SimpleNamespace:
    """What the side-by-side table reads of a Plan."""
    return SimpleNamespace(request=SimpleNamespace(strategy=strategy), peak=SimpleNamespace(total=peak), fits=fits,
                           largest_micro_batch_label=largest,
                           communication=[SimpleNamespace(logical_bytes=logical, wire_bytes_derived=wire)])


# 70b's figures on 8 GPUs: ddp's peak 1,132.59 GB ("1.13e+03" with `.3g`, cut to "1.13e+…" at 80 columns),
# its all-reduce 243.2 GiB at the API, 2 x 7/8 of it (425.6 GiB) on the wire; zero3's DeepSpeed figure
# 148.51 GB; tiny's peak 1.6384 MB ("0.00" with two decimals).
SIDE_BY_SIDE = [
    (_plan("ddp", 1_132_590_000_000, False, "none", 261_119_688_704, 456_959_455_232), None, None, None),
    (_plan("zero3", 1_638_400, True, "12", 780_000_000_000, 682_500_000_000), None, None,
     SimpleNamespace(gpu_bytes=148_510_000_000)),
]


@pytest.mark.parametrize(("width", "lines"), [
    (80, ["┃                               ┃       ddp ┃     zero3 ┃",
          "│ peak GB                       │     1,133 │   0.00164 │",
          "│ fits                          │        NO │       yes │",
          "│ largest micro-batch that fits │      none │        12 │",
          "│ DeepSpeed formula GB (mixed   │         - │       149 │",
          "│ precision, model states only) │           │           │",
          "│ logical bytes per step        │ 243.2 GiB │ 726.4 GiB │",
          "│ wire bytes per step (derived) │ 425.6 GiB │ 635.6 GiB │"]),
    (200, ["│ peak GB                       │     1,133 │   0.00164 │"]),
])
def test_the_side_by_side_table_shows_every_figure_whole(width, lines):
    from rich.console import Console
    from rich.table import Table

    console = Console(file=io.StringIO(), width=width)
    console.print(plan_command._side_by_side(console, Table, SIDE_BY_SIDE))
    shown = console.file.getvalue().splitlines()
    assert all(line in shown for line in lines), "\n".join(shown)


@pytest.mark.parametrize("columns", ["80", "200"])
def test_the_70b_side_by_side_reads_whole_at_80_and_200_columns(columns, capsys, monkeypatch):
    # The README's first example: at 80 columns its headers were cut ("strate…", "DeepSp…"), ddp's peak read
    # "1.13e+…" and every wire figure took two lines ("425.5 / GiB").
    monkeypatch.setenv("COLUMNS", columns)
    argv = ["--size", "70b", "--gpus", "8", "--strategy", "all"]
    code, out, _ = run(argv, capsys)
    assert code == 0
    summary = out[out.index("Side by side"):out.index("GB = 1e9 bytes")].splitlines()
    assert max(len(line) for line in summary) <= int(columns)
    assert not any("…" in line or "e+" in line for line in summary), summary
    assert summary[1].startswith("┏") and summary[-1].startswith("└")  # no row is cropped or wrapped apart
    lines = side_by_side_lines(out)
    assert all(all(cells) or not any(cells) for _, *cells in lines), lines  # a figure never spills onto a second line
    rows = side_by_side_rows(out)
    assert rows["fits"] == ["NO", "NO", "NO", "NO"] and rows["logical bytes per step"][0].endswith(" GiB")
    strategies = json.loads(run([*argv, "--json"], capsys)[1])["strategies"]
    total = strategies["ddp"]["analytic"]["peak"]["total_bytes"]
    assert total > 1000e9 and rows["peak GB"][0] == f"{round(total / 1e9):,}"  # e.g. "1,133", whole GB kept whole


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
    rows = side_by_side_rows(out)
    assert rows["fits"][0] == "NO" and rows["largest micro-batch that fits"][0] == "none"
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
        # Both once ran, rc 0, with "simulation not available ..." in a table cell: the flag dropped.
        (["--size", "mini", "--gpus", "8", "--cpu-offload", "--simulate"],
         "sharding-lab: --simulate cannot take --cpu-offload: the simulation runs on the CPU"),
        (["--size", "mini", "--gpus", "8", "--strategy", "ddp", "--simulate"],
         "sharding-lab: --simulate simulates FSDP2 (zero2, zero3): ddp has no simulation"),
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
    # Python's float() and int() read "1_000" as 1000; a typo, as the plan page refuses it.
    (["--gpus", "2", "--gpu-memory-gb", "1_000"], "argument --gpu-memory-gb: must be a positive, finite number, got '1_000'"),
    (["--gpus", "1_6"], "argument --gpus: must be a whole number >= 1, got '1_6'"),
    (["--gpus", "2", "--headroom", "0.1_0"], "argument --headroom: must be a fraction in [0, 1), got '0.1_0'"),
])
def test_inputs_beyond_a_plans_bounds_are_usage_errors(argv, message, capsys):
    # The bounds are the app's too; unbounded, --gpus 100000000 planned ZeRO-1 for minutes in 11 GB.
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", "--size", "tiny", *argv] if "--layers" not in argv else ["plan", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_help_gives_each_default(capsys, monkeypatch):
    # --micro-batch, --strategy and --grad-accum gave none, and --micro-batch's differs from measure's (2).
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    shown = " ".join(capsys.readouterr().out.split())  # each option's help as one line, wherever it wrapped
    for text in ("--micro-batch MICRO_BATCH sequences per GPU per forward (default 1; `measure`'s is 2) --seq",
                 "--strategy {ddp,zero1,zero2,zero3,fsdp,all} one strategy, or all side by side (default zero3) --",
                 "--grad-accum GRAD_ACCUM micro-batches per optimizer step (default 1) --",
                 "--layers LAYERS transformer blocks --", "--vocab VOCAB vocabulary size --"):
        assert text in shown


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


def test_one_gpu_lists_no_all_gather(capsys):
    # FSDP2 gathers nothing on a shard group of one GPU: 7b once showed 25.6 GiB of forward all-gathers
    # and 24.0 GiB of backward ones here, and the side-by-side table 49.6 GiB moved.
    code, out, _ = run(["--size", "7b", "--gpus", "1", "--strategy", "zero3"], capsys)
    assert code == 0
    out = " ".join(out.split())
    assert "all_gather" not in out
    assert "zero3: communication per optimizer step: none (on a shard group of one GPU FSDP2 gathers" in out
    code, out, _ = run(["--size", "7b", "--gpus", "1", "--strategy", "zero3", "--json"], capsys)
    assert json.loads(out)["strategies"]["zero3"]["analytic"]["communication"] == []


def test_padding_that_makes_up_much_of_a_peak_is_said(capsys):
    # 70b on 131,072 GPUs, zero3: a block's all-gather is 131,072 padded rows of 57,352 elements in all,
    # 30,068,965,376 B, where its 805,412,864 parameters would take 3,221,651,456 B.
    code, out, _ = run(["--size", "70b", "--gpus", "131072", "--strategy", "zero3"], capsys)
    assert code == 0
    out = " ".join(out.split())  # as read, whatever the terminal's width
    assert "FSDP2's padding (" in out and "all gather buffers 25.0 GiB of 28.0 GiB" in out
    assert "with more GPUs than a tensor's rows, each GPU holds one padded row of it." in out
    code, out, _ = run(["--size", "70b", "--gpus", "131072", "--strategy", "zero3", "--json"], capsys)
    peak = json.loads(out)["strategies"]["zero3"]["analytic"]["peak"]
    gathered = peak["categories"]["all_gather_buffers"]["bytes"]
    assert gathered == 30_068_965_376 and peak["padding_bytes"] > gathered - 3_221_651_456
    assert "PyTorch's implementation, not the ZeRO paper's" in peak["padding"]
    code, out, _ = run(["--size", "70b", "--gpus", "1024", "--strategy", "zero3"], capsys)
    assert "padding (" not in out  # 0.06% of the peak there


def test_the_deepspeed_row_says_it_assumes_mixed_precision_beside_an_fp32_plan(capsys, monkeypatch):
    # 7b (Ψ = 6,864,642,048; its largest layer 206,045,184) on 64 GPUs, fp32. DeepSpeed's formulas assume
    # mixed-precision Adam whatever the plan's precision: ZeRO-2 2Ψ + 18Ψ/64 = 13,729,284,096 + 1,930,680,576
    # = 15.66 GB, ZeRO-3 18Ψ/64 + 4 x 206,045,184 = 2.75 GB, model states only. Labelled so, beside fp32
    # peaks, the gap does not read as activations.
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = run(["--size", "7b", "--gpus", "64", "--strategy", "all"], capsys)
    assert code == 0
    lines = side_by_side_lines(out)
    at = next(i for i, (label, *_) in enumerate(lines) if label.startswith("DeepSpeed formula GB"))
    assert lines[at] == ["DeepSpeed formula GB (mixed", "-", "-", "15.7", "2.75"]
    assert lines[at + 1] == ["precision, model states only)", "", "", "", ""]
    summary = out[out.index("Side by side"):out.index("GB = 1e9 bytes")].splitlines()
    assert max(len(line) for line in summary) <= 80 and not any("…" in line for line in summary)
    # Each strategy's own table and footnote say it too, and what the formula leaves out (at 200 columns,
    # where no cell wraps).
    monkeypatch.setenv("COLUMNS", "200")
    code, out, _ = run(["--size", "7b", "--gpus", "64", "--strategy", "all"], capsys)
    text = " ".join(out.split())
    assert text.count("│ DeepSpeed ZeRO-2 formula (mixed precision, model states only) │ 14.58 GiB (15.66 GB) │") == 1
    assert text.count("│ DeepSpeed ZeRO-3 formula (mixed precision, model states only) │ 2.57 GiB (2.75 GB) │") == 1
    assert text.count(") assumes mixed-precision Adam (fp16 or bf16 parameters and gradients, fp32 master "
                      "parameters and Adam state), not this plan's fp32") == 2
    assert text.count("it leaves out activations, temporaries, communication buckets and the CUDA context") == 2
    code, out, _ = run(["--size", "7b", "--gpus", "64", "--strategy", "zero3", "--mixed-precision"], capsys)
    assert ("assumes mixed-precision Adam (fp16 or bf16 parameters and gradients, fp32 master parameters and Adam "
            "state), as this plan's is, but FSDP2's keeps fp32 parameters and gradients (4/4/8 B per parameter)"
            ) in " ".join(out.split())


def test_the_deepspeed_json_says_what_the_formula_assumes(capsys):
    code, out, _ = run(["--size", "7b", "--gpus", "64", "--strategy", "zero3", "--json"], capsys)
    assert code == 0
    deepspeed = json.loads(out)["strategies"]["zero3"]["deepspeed"]
    assert deepspeed["gpu_bytes"] == 2_754_861_312  # 18 x 6,864,642,048 // 64 + 4 x 206,045,184
    assert deepspeed["assumes"].startswith("mixed-precision Adam (fp16 or bf16 parameters and gradients")
