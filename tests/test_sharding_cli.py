"""`sharding-lab measure` and `compare`: one JSON object on stdout with --json, rich tables without,
the same command under torchrun, and a failed rank turned into a clear error and exit status 1."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console
from sharding_measurements import typed

from sharding_lab import cli
from sharding_lab.engine.launch import RankFailed
from sharding_lab.model_config import SIZES, num_params

VENV_BIN = Path(sys.executable).parent


def test_subcommands_are_registered():
    parser = cli.build_parser()
    commands = parser._subparsers._group_actions[0].choices
    assert {"measure", "compare", "estimate", "plan", "list", "run", "serve-labs", "at-scale"} == set(commands)


def test_cli_choices_match_the_engine():
    from sharding_lab.engine.model import SIZES

    assert tuple(cli.SIZES) == tuple(SIZES)


def test_importing_the_package_and_its_cli_does_not_import_torch():
    code = (
        "import sys, sharding_lab, sharding_lab.catalog, sharding_lab.cli, sharding_lab.strategies;"
        "sharding_lab.cli.build_parser(); print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_unknown_strategy_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["measure", "--strategy", "zero4"])
    assert exit_info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_a_failed_rank_is_reported_on_stderr_with_status_1_and_its_traceback_saved_aside(monkeypatch, capsys):
    trace = 'Traceback (most recent call last):\n  File "rank.py", line 1, in step\nRuntimeError: boom'

    def failing_measure_many(*args, **kwargs):
        raise RankFailed(1, "raised RuntimeError: boom", trace)

    monkeypatch.setattr("sharding_lab.engine.measure.measure_many", failing_measure_many)
    assert cli.main(["measure", "--strategy", "ddp", "--json"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    line = captured.err.strip()
    assert line.startswith("sharding-lab: rank 1 failed: raised RuntimeError: boom (rank 1's traceback: ")
    assert "Traceback" not in line and "\n" not in line
    saved = Path(line.rsplit(": ", 1)[1].rstrip(")"))
    try:
        assert saved.read_text() == trace + "\n"
    finally:
        saved.unlink()


def test_a_traceback_that_cannot_be_saved_still_leaves_a_one_line_error(monkeypatch, tmp_path):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "gone"))  # the temporary folder is missing
    failure = RankFailed(0, "raised RuntimeError: boom", "Traceback (most recent call last):\nRuntimeError: boom")
    assert failure.for_user() == (
        "rank 0 failed: raised RuntimeError: boom (rank 0's traceback could not be saved: No such file or directory)"
    )


@pytest.mark.parametrize(
    "argv",
    [["measure", "--strategy", "zero3", "--timeout", "0"], ["compare", "--timeout", "-5"],
     ["serve-labs", "--timeout", "nan"], ["serve-labs", "--idle-timeout", "0"],
     ["measure", "--strategy", "zero3", "--timeout", "inf"]],  # inf once reached a rank as an OverflowError
)
def test_a_timeout_that_is_not_a_positive_number_is_a_usage_error(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    assert "timeout: must be a positive, finite number" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [["measure", "--strategy", "zero3", "--timeout", "1e300"], ["compare", "--timeout", "604801"],
     ["run", "what-fsdp-shards", "--timeout", "1e300"], ["serve-labs", "--timeout", "1e300"]],
)
def test_a_timeout_past_a_week_is_a_usage_error(argv, capsys):
    # 1e300 once started the ranks, each of which then crashed on an OverflowError (torch's timedelta).
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    assert f"--timeout: must be at most 604,800, got '{argv[-1]}'" in capsys.readouterr().err


@pytest.mark.parametrize("replicas", ["0", "-1"])
def test_replicas_below_one_is_a_usage_error_naming_the_option(replicas, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["measure", "--strategy", "zero3", "--world-size", "2", "--replicas", replicas])
    assert exit_info.value.code == 2
    assert f"--replicas: must be a whole number >= 1, got '{replicas}'" in capsys.readouterr().err


def test_a_refused_combination_is_a_usage_error_before_any_rank_starts(capsys):
    assert cli.main(["measure", "--strategy", "ddp", "--mixed-precision", "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "needs CUDA" in captured.err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        # RunConfig's own messages named its fields (cpu_offload, replicas=3), not the flags typed.
        (["measure", "--strategy", "ddp", "--cpu-offload"],
         "--cpu-offload is FSDP2's (zero2, zero3): ddp does not shard parameters"),
        (["measure", "--strategy", "zero1", "--cpu-offload", "--replicas", "2"],
         "--cpu-offload and --replicas are FSDP2's (zero2, zero3): zero1 does not shard parameters"),
        (["measure", "--strategy", "zero3", "--world-size", "4", "--replicas", "3"],
         "--replicas 3 must divide --world-size 4 (HSDP's mesh is replicas x shards)"),
        (["compare", "--world-size", "4", "--replicas", "3"],
         "--replicas 3 must divide --world-size 4 (HSDP's mesh is replicas x shards)"),
        (["measure", "--strategy", "zero3", "--size", "mini", "--seq", "65"],
         "seq 65 must be from 1 to mini's block_size 64"),
    ],
)
def test_engine_options_the_run_cannot_take_are_named_before_any_rank_starts(argv, message, capsys):
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == f"sharding-lab: {message}\n"  # one line, the flag's name


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["measure", "--strategy", "ddp", "--reshard-after-forward"],
         "--reshard-after-forward is FSDP2's (zero2, zero3): ddp does not shard parameters"),
        (["measure", "--strategy", "zero1", "--no-reshard-after-forward"],
         "--no-reshard-after-forward is FSDP2's (zero2, zero3): zero1 does not shard parameters"),
        (["measure", "--strategy", "ddp", "--no-prefetch"],
         "--no-prefetch is FSDP2's (zero2, zero3): ddp does not shard parameters"),
        (["measure", "--strategy", "zero1", "--prefetch", "--cpu-offload"],
         "--prefetch and --cpu-offload are FSDP2's (zero2, zero3): zero1 does not shard parameters"),
    ],
)
def test_fsdp_only_flags_are_refused_for_a_ddp_strategy_not_dropped(argv, message, monkeypatch, capsys):
    # These ran with rc 0, the flag never read: ParallelOptions.reshard_after_forward and prefetch are FSDP's.
    monkeypatch.setattr("sharding_lab.engine.measure.measure_many",
                        lambda *a, **k: pytest.fail("ran, dropping the flag"))
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == f"sharding-lab: {message}\n"


def test_compare_gives_no_prefetch_to_fsdp_alone_and_says_so(monkeypatch, capsys):
    measured = []
    monkeypatch.setattr(cli, "_measure", lambda runs, args, description: measured.extend(runs) or [None] * len(runs))
    assert cli.main(["compare", "--no-prefetch", "--json"]) == 0
    assert {str(run.strategy): run.options.prefetch for run in measured} == {
        "ddp": True, "zero1": True, "zero2": False, "zero3": False}
    assert capsys.readouterr().err == ("sharding-lab: ddp, zero1 run without --no-prefetch: FSDP2's options, which "
                                       "DDP cannot take\n")


def _options_of_every_subcommand():
    subcommands = cli.build_parser()._subparsers._group_actions[0].choices
    return [pytest.param(parser, action, id=f"{name} {'/'.join(action.option_strings) or action.dest}")
            for name, parser in subcommands.items() for action in parser._actions
            if not isinstance(action, argparse._HelpAction)]


@pytest.mark.parametrize(("parser", "action"), _options_of_every_subcommand())
def test_every_option_of_every_subcommand_says_what_it_does_and_its_default(parser, action):
    # measure --strategy and plan --layers/--width/--heads/--vocab said nothing; plan's --micro-batch, --strategy and
    # --grad-accum and serve-labs' --timeout gave no default.
    assert action.help and action.help != argparse.SUPPRESS
    shown = parser._get_formatter()._expand_help(action)  # as --help prints it, %(default)s filled in
    if action.default not in (None, False, argparse.SUPPRESS):
        assert "default" in shown


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["measure", "--strategy", "zero3", "--world-size", "0"], "--world-size"),
        (["compare", "--world-size", "-1"], "--world-size"),
        (["measure", "--strategy", "zero3", "--grad-accum", "0"], "--grad-accum"),
        (["compare", "--grad-accum", "-2"], "--grad-accum"),
    ],
)
def test_a_count_below_one_is_a_usage_error_naming_the_flag(argv, flag, capsys):
    # These once reached RunConfig, whose "world_size must be at least 1" named a field, not the flag.
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines()[-1].endswith(f"error: argument {flag}: must be a whole number >= 1, got '{argv[-1]}'")
    assert "world_size" not in captured.err and "grad_accum_steps" not in captured.err


@pytest.mark.slow
def test_measure_json_is_exactly_one_object_with_the_documented_fields():
    completed = subprocess.run(
        [str(VENV_BIN / "sharding-lab"), "measure", "--strategy", "zero3", "--world-size", "2", "--json"],
        capture_output=True, text=True, timeout=120,
    )
    assert completed.returncode == 0, completed.stderr
    assert "NumPy" not in completed.stderr  # torch's warning when numpy is absent is filtered in the ranks
    m = json.loads(completed.stdout)  # one object, nothing else: json.loads rejects trailing text
    assert m["config"]["strategy"] == "zero3" and m["config"]["world_size"] == 2
    for rank in m["memory"]["per_rank"]:
        for field in ("params_bytes", "grads_bytes", "optimizer_bytes", "peak_bytes", "categories"):
            assert field in rank
    for c in m["comm"]["collectives"]:
        assert {"op", "phase", "module", "bytes", "wire_bytes_derived"} <= set(c)
    assert set(m["comm"]["totals"]) >= {"all_gather", "reduce_scatter", "all_reduce", "broadcast"}
    assert m["predicted"]["model_states_bytes_per_rank"]["total"] == m["memory"]["per_rank"][0]["model_states_bytes"]
    assert m["step_time_s"] > 0


@pytest.mark.slow
def test_measure_tied_runs_the_model_with_its_head_tied_to_the_embedding(capsys):
    assert cli.main(["measure", "--strategy", "zero3", "--tied", "--check-gradients", "--json"]) == 0
    m = json.loads(capsys.readouterr().out)
    tiny = SIZES["tiny"]
    assert m["config"]["model"]["tied"] is True
    assert m["config"]["num_params"] == num_params(tiny) - tiny.vocab_size * tiny.n_embd
    assert m["gradient_parity"]["holds"]
    from sharding_lab.measurement import Measurement
    from sharding_lab.report import render_measurement

    console = Console(record=True, width=400)
    render_measurement(Measurement.from_json(m), console)
    assert f"tiny with a tied head: {m['config']['num_params']:,} params" in console.export_text()


@pytest.mark.slow
def test_measure_takes_the_micro_batch_and_sequence_and_its_title_says_them(capsys):
    assert cli.main(["measure", "--strategy", "zero3", "--micro-batch", "3", "--seq", "16", "--json"]) == 0
    m = json.loads(capsys.readouterr().out)
    assert (m["config"]["batch_size_per_rank"], m["config"]["seq_len"]) == (3, 16)
    assert cli.main(["measure", "--strategy", "zero3", "--micro-batch", "1", "--seq", "16", "--json"]) == 0
    one = json.loads(capsys.readouterr().out)
    # Saved activations grow with the sequences in the batch: 3x, but for the tracker rounding each
    # storage up to 512 B (a few small ones per block do not triple).
    three_b, one_b = (x["memory"]["per_rank"][0]["activations_after_forward_bytes"] for x in (m, one))
    assert abs(three_b - 3 * one_b) <= 512 * 4 * 8 and three_b > 2.5 * one_b
    from sharding_lab.measurement import Measurement
    from sharding_lab.report import render_measurement

    console = Console(record=True, width=400)
    render_measurement(Measurement.from_json(m), console)
    text = console.export_text()
    assert "tiny: 60,096 params, 4 blocks, micro-batch 3 x seq 16;" in text
    assert ("Unsharded gradients: counted by FSDPMemTracker as temporaries until their unit's post-backward hands "
            "them to its reduce-scatter.") in text  # how the tracker files them, under its categories


@pytest.mark.slow
def test_compare_json_holds_every_strategy_from_one_launch(capsys):
    assert cli.main(["compare", "--world-size", "2", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert list(result["strategies"]) == ["ddp", "zero1", "zero2", "zero3"]
    optimizer = {s: m["memory"]["per_rank"][0]["optimizer_bytes"] for s, m in result["strategies"].items()}
    assert optimizer["ddp"] == 2 * optimizer["zero3"]  # Adam's state halves on two ranks
    from sharding_lab.measurement import Measurement
    from sharding_lab.report import render_measurement

    console = Console(record=True, width=400)
    render_measurement(Measurement.from_json(result["strategies"]["ddp"]), console)
    assert "Peak memory by category" in console.export_text()
    assert "Unsharded gradients" not in console.export_text()  # DDP's tracker has no such filing


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("torchrun", path=str(VENV_BIN)) is None, reason="torchrun not installed")
# Three launches: when the results crossed in gloo collectives, a rank aborted at exit in 3 of 8 launches
# ("terminate called without an active exception", gloo's thread dropping a tensor during shutdown).
@pytest.mark.parametrize("launch", range(3))
def test_the_same_command_runs_under_torchrun_and_only_rank_0_prints(launch, tmp_path):
    completed = subprocess.run(
        [str(VENV_BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", "-m", "sharding_lab.cli",
         "measure", "--strategy", "zero2", "--world-size", "2", "--json"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "TMPDIR": str(tmp_path)},  # torchrun leaves its torchelastic_* log folder behind
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "terminate called" not in completed.stderr
    m = json.loads(completed.stdout)
    assert m["config"]["strategy"] == "zero2" and len(m["memory"]["per_rank"]) == 2


@pytest.mark.slow
def test_on_cuda_the_report_puts_the_allocators_peak_beside_the_trackers():
    from dataclasses import replace

    from sharding_lab.report import allocator_lines, render_measurement

    cpu = typed()["ddp"]
    assert allocator_lines(cpu) == []  # CPU has no allocator figure: nothing to set beside the tracker's
    peak = cpu.ranks[0].peak_bytes
    # A CUDA measurement as the engine reports one: the allocator's peak 10% above the tracker's.
    on_cuda = replace(cpu, ranks=[replace(r, cuda_max_memory_allocated=int(r.peak_bytes * 1.1)) for r in cpu.ranks])
    console = Console(record=True, width=250)
    render_measurement(on_cuda, console)
    text = console.export_text()
    assert "peak, CUDA allocator (max_memory_allocated)" in text
    gap = int(peak * 1.1) - peak
    assert f"({gap / int(peak * 1.1):.1%} of the allocator's) not in the tracker's categories" in text
    assert "DDP's mixed precision" not in text
    # DDP with bf16 mixed precision: the bf16 copies' bytes (2 per parameter) and where the tracker fails.
    mixed = replace(on_cuda, config=replace(on_cuda.config, mixed_precision=True))
    lines = allocator_lines(mixed)
    assert len(lines) == 2 and "Read the allocator's peak" in lines[1]
    from sharding_lab.units import human_bytes

    assert f"2 B per parameter, {human_bytes(2 * cpu.config.num_params)} here" in lines[1]


@pytest.mark.slow
def test_a_cuda_report_without_nccl_says_why_it_has_no_overlap():
    from dataclasses import replace

    from sharding_lab.report import render_measurement

    cpu = typed()["zero3"]
    assert cpu.overlap is None
    for backend, why in (("gloo", "the ranks share one GPU over gloo"), ("fake", "a rank view moves no data")):
        console = Console(record=True, width=400)
        render_measurement(replace(cpu, config=replace(cpu.config, device="cuda:0", backend=backend)), console)
        text = console.export_text()
        assert f"overlap not measured: {why}" in text and "overlap needs one GPU per rank (NCCL)" in text
    console = Console(record=True, width=400)
    render_measurement(cpu, console)
    assert "overlap" not in console.export_text()  # on CPU ranks overlap is never a question


@pytest.mark.slow
def test_tables_show_measured_beside_predicted():
    from sharding_lab.report import render_comparison, render_measurement

    console = Console(record=True, width=200)
    render_measurement(typed()["zero3"], console)
    render_comparison({k: typed()[k] for k in ("ddp", "zero1", "zero2", "zero3")}, console)
    text = console.export_text()
    assert "predicted" in text and "all_gather" in text and "reduce_scatter" in text
    assert "zero1" in text and "step time" in text


@pytest.mark.slow  # typed(): a 2-rank launch
def test_compare_shows_each_strategys_gradient_parity_when_it_was_checked():
    from sharding_lab.report import render_comparison

    runs = typed()
    console = Console(record=True, width=400)
    render_comparison({"ddp": runs["ddp"], "zero3": runs["zero3"], "summing": runs["zero3 summing"],
                       "bf16": runs["zero3 bf16"]}, console)
    row = next(line for line in console.export_text().splitlines() if "gradient parity" in line)
    cells = [cell.strip() for cell in row.split("│")[2:-1]]  # after the label
    assert [cell.split(" (")[0] for cell in cells] == ["holds", "holds", "FAILS", "-"]  # bf16 was not checked
    assert cells[2] == f"FAILS ({runs['zero3 summing'].gradient_parity.max_relative_error:.1e})"
    console = Console(record=True, width=400)
    render_comparison({"bf16": runs["zero3 bf16"]}, console)
    assert "gradient parity" not in console.export_text()  # no row when nothing was checked


def test_a_reader_that_leaves_early_gets_no_traceback():
    # `sharding-lab list --json | head`: the pipe closes before the output is written.
    script = f"(sleep 0.5; {sys.executable} -m sharding_lab.cli list --json; echo rc=$? >&2) | true"
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120)
    assert "Traceback" not in result.stderr and "BrokenPipeError" not in result.stderr
    assert "rc=1" in result.stderr


@pytest.mark.slow  # typed(): a 2-rank launch
def test_a_rank_views_step_time_says_its_collectives_moved_nothing():
    from dataclasses import replace

    from sharding_lab.report import step_time_text

    measured = typed()["zero3"]
    view = replace(measured, config=replace(measured.config, placement="rank-view"))
    assert step_time_text(measured) == f"{measured.step_time_s * 1000:.1f} ms"
    assert step_time_text(view) == f"{measured.step_time_s * 1000:.1f} ms (rank view: collectives answered without moving data)"


@pytest.mark.slow
def test_compare_with_mixed_precision_on_cpu_compares_what_can_run_and_says_what_it_left_out(capsys):
    assert cli.main(["compare", "--world-size", "2", "--mixed-precision", "--json"]) == 0
    captured = capsys.readouterr()
    strategies = json.loads(captured.out)["strategies"]
    assert list(strategies) == ["zero2", "zero3"]  # DDP's mixed precision needs CUDA
    assert all(m["config"]["mixed_precision"] for m in strategies.values())
    assert "ddp, zero1 left out: DDP's mixed precision needs CUDA" in captured.err


@pytest.mark.slow
def test_compare_with_cpu_offload_gives_it_to_fsdp_and_says_ddp_ran_without(capsys):
    assert cli.main(["compare", "--world-size", "2", "--cpu-offload", "--json"]) == 0
    captured = capsys.readouterr()
    strategies = json.loads(captured.out)["strategies"]
    assert {name: m["config"]["cpu_offload"] for name, m in strategies.items()} == {
        "ddp": False, "zero1": False, "zero2": True, "zero3": True}
    assert "ddp, zero1 run without --cpu-offload: FSDP2's options, which DDP cannot take" in captured.err


def test_a_reshard_override_is_what_the_prediction_says_differs_from_the_paper():
    from sharding_lab.engine.measure import _predicted
    from sharding_lab.run_config import RunConfig

    psi = 60_096  # tiny: nothing padded at 2 ranks

    def predicted(strategy: str, **options) -> dict:
        return _predicted(RunConfig.of(strategy, world_size=2, **options), psi, psi)

    # Measured on tiny at 2 ranks: zero3 --no-reshard-after-forward all-gathers 5 units in forward and none in
    # backward (240,384 B, 2Ψ x 4 B with its reduce-scatters), so the text may not say it re-gathers the blocks.
    off = predicted("zero3", reshard_after_forward=False)
    assert "backward all-gathers nothing" in off["differences"] and "blocks only" not in off["differences"]
    assert off["communication_bytes_per_step"]["bytes"] == 3 * psi * 4  # the paper's stage 3 stays its figure
    # zero2 --reshard-after-forward all-gathers the 4 blocks again in backward (9 all-gathers, 443,648 B).
    on = predicted("zero2", reshard_after_forward=True)
    assert "all-gathers them again in backward" in on["differences"]
    assert "reshard_after_forward=False" not in on["differences"]
    assert predicted("zero3")["differences"].startswith("FSDP2 does not reshard the root after forward")
    assert predicted("zero3", reshard_after_forward=True)["differences"] == predicted("zero3")["differences"]


def test_under_gradient_accumulation_fsdps_prediction_says_it_counts_one_micro_batchs_all_gathers():
    from sharding_lab.engine.measure import _predicted
    from sharding_lab.run_config import RunConfig

    # Measured on tiny at 2 ranks with 2 micro-batches: zero3 18 all-gathers (2 x 9), zero2 10 (2 x 5), 5
    # reduce-scatters each; DDP one all-reduce. The paper's figure counts one forward and backward.
    for strategy in ("zero2", "zero3"):
        accounting = _predicted(RunConfig.of(strategy, world_size=2, grad_accum_steps=2), 60_096, 60_096)["accounting"]
        assert accounting.endswith("; per optimizer step of 2 micro-batches (gradients sync once), but with one "
                                   "forward and backward's all-gathers: FSDP2 all-gathers for each of the 2 micro-batches")
    ddp = _predicted(RunConfig.of("ddp", world_size=2, grad_accum_steps=2), 60_096, 60_096)["accounting"]
    assert ddp.endswith("; per optimizer step of 2 micro-batches (gradients sync once)")
