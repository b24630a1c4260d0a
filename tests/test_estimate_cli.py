"""`sharding-lab estimate`: argument forms, the --json object, and the rich tables."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from sharding_lab import estimate
from sharding_lab.estimate import parse_param_count


def run_estimate_cli(argv: list[str]) -> int:
    """Parse `argv` as the sharding-lab CLI would (a subparser registered by estimate) and dispatch."""
    parser = argparse.ArgumentParser(prog="sharding-lab")
    estimate.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["estimate", *argv])
    return args.func(args)


def estimate_json(argv: list[str], capsys) -> dict:
    assert run_estimate_cli([*argv, "--json"]) == 0
    out = capsys.readouterr().out
    return json.loads(out)  # exactly one JSON object: json.loads rejects anything after it


@pytest.mark.parametrize(
    ("text", "count"),
    [
        ("7.5e9", 7_500_000_000),
        ("7.5B", 7_500_000_000),
        ("7.5b", 7_500_000_000),
        ("128B", 128_000_000_000),
        ("1T", 1_000_000_000_000),
        ("350M", 350_000_000),
        ("1000", 1000),
        ("1.2e12", 1_200_000_000_000),
    ],
)
def test_param_counts_in_every_form(text, count):
    assert parse_param_count(text) == count


@pytest.mark.parametrize("text", ["seven", "1.5", "0", "-3B", "12X", "", "1e400", "1001T"])
def test_bad_param_counts_are_refused(text):
    with pytest.raises(ValueError):
        parse_param_count(text)


@pytest.mark.parametrize(("text", "message"), [
    ("1e999999999", "a parameter count must be at most 1e+15 (a quadrillion), got '1e999999999'"),
    ("1e999999T", "a parameter count must be at most 1e+15 (a quadrillion), got '1e999999T'"),
    ("-1e999999999", "a parameter count must be a positive whole number, got '-1e999999999'"),
])
def test_a_count_past_the_decimal_exponent_range_is_refused_as_too_large(text, message, capsys):
    # Each once ended in a decimal.Overflow traceback.
    with pytest.raises(SystemExit) as exit_info:
        run_estimate_cli([f"--params={text}", "--world-size", "4"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.endswith(f"sharding-lab estimate: error: argument --params: {message}\n")


def test_bad_params_argument_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_estimate_cli(["--params", "lots", "--world-size", "4"])
    assert exit_info.value.code == 2
    assert "not a parameter count" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--world-size", "0"], ["--world-size", "four"], ["--batch", "-1"]])
def test_counts_must_be_positive(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_estimate_cli(["--params", "7.5B", *argv])
    assert exit_info.value.code == 2
    assert "must be a whole number >= 1" in capsys.readouterr().err


def test_json_has_model_states_per_strategy(capsys):
    report = estimate_json(["--params", "7.5B", "--world-size", "64", "--mixed-precision"], capsys)
    assert report["params"] == 7_500_000_000
    assert report["world_size"] == 64
    assert set(report["strategies"]) == {"ddp", "zero1", "zero2", "zero3"}
    psi = 7_500_000_000
    assert report["strategies"]["zero1"]["model_states_bytes_per_rank"] == {
        "params": 2 * psi,
        "grads": 2 * psi,
        "optimizer": 12 * psi // 64,
        "total": 4 * psi + 12 * psi // 64,
    }
    assert report["strategies"]["zero3"]["model_states_bytes_per_rank"]["total"] == 16 * psi // 64
    # Mixed precision communicates fp16: 3Ψ elements of 2 bytes for stage 3.
    comm = report["strategies"]["zero3"]["communication_per_step"]
    assert comm["elements"] == 3 * psi
    assert comm["bytes"] == 6 * psi
    assert report["strategies"]["ddp"]["communication_per_step"]["elements"] == 2 * psi
    # PyTorch's mixed precision beside it: bf16 gathers (2Ψ + 2Ψ bytes), an fp32 reduce-scatter (4Ψ).
    assert report["strategies"]["zero3"]["communication_per_step_pytorch"]["bytes"] == 8 * psi
    # DDP reduces fp32 gradients: the paper's 2Ψ elements at 4 bytes.
    assert report["strategies"]["ddp"]["communication_per_step_pytorch"]["bytes"] == 8 * psi
    # Those are the paper's collectives; where the engine issues others the JSON says so, for the strategy.
    differs = {s: f["communication_per_step_pytorch"].get("engine_differs", "") for s, f in report["strategies"].items()}
    assert differs["ddp"] == ""  # DDP's one all-reduce is the paper's
    assert "all-reduces the gradients through DDP (2Ψ) and then broadcasts" in differs["zero1"]
    assert "before its forward, not after the optimizer step" in differs["zero2"]
    assert "backward all-gathers the blocks only" in differs["zero3"]
    assert all("`sharding-lab measure` and `compare`" in differs[s] for s in ("zero1", "zero2", "zero3"))


def test_pytorch_communication_table_is_the_papers_with_the_engines_differences_beside_it(capsys):
    # tiny's 60,096 parameters at 2 ranks: the table's zero1 row is the paper's reduce-scatter and
    # all-gather, fp32, each (N-1)/N x 4 B x 60,096 = 120,192 B on the wire, 240.4 kB in all; the engine's
    # (an all-reduce and 53 broadcasts) sends 360,576 B, as `compare` measured it: only a measurement gives that.
    assert run_estimate_cli(["--params", "60096", "--world-size", "2", "--mixed-precision"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # rich wraps at 80 columns
    assert "as the engine runs it" not in out
    assert ("The ZeRO paper's communication per step in the dtypes PyTorch moves under mixed precision, "
            "per strategy (derived)") in out
    assert "│ zero1 │ 480.8 kB │ 240.4 kB │ reduce_scatter fp32, all_gather fp32 │" in out
    assert "These are the paper's collectives, not all the engine's." in out
    assert ("zero1: It all-reduces the gradients through DDP (2Ψ) and then broadcasts each updated parameter "
            "from its owner (Ψ)") in out
    assert "zero3: FSDP2 does not reshard the root after forward, so backward all-gathers the blocks only" in out
    assert "`sharding-lab measure` and `compare` give the engine's collectives, measured." in out


def test_fp32_json(capsys):
    report = estimate_json(["--params", "1000", "--world-size", "4"], capsys)
    assert report["strategies"]["zero2"]["model_states_bytes_per_rank"] == {
        "params": 4000,
        "grads": 1000,
        "optimizer": 2000,
        "total": 7000,
    }


def test_table_on_a_terminal(capsys):
    assert run_estimate_cli(["--params", "7.5B", "--world-size", "64", "--mixed-precision"]) == 0
    out = capsys.readouterr().out
    for strategy in ("ddp", "zero1", "zero2", "zero3"):
        assert strategy in out
    assert "120 GB" in out  # ddp total
    assert "1.875 GB" in out  # zero3 total
    assert "234.4 MB" in out  # zero3 params: 2 x 7.5e9 / 64


def test_the_largest_counts_print_without_an_exponent(capsys):
    # A quadrillion parameters on one rank, fp32: 16 B x 1e15 = 16,000 TB of model states, and zero3's 3Ψ
    # of 4 B 12,000 TB per step (once "1.6e+04 TB" and "1.2e+04 TB").
    assert run_estimate_cli(["--params", "1000T", "--world-size", "1"]) == 0
    out = capsys.readouterr().out
    assert "│ 4000 TB │ 4000 TB │   8000 TB │ 16,000 TB │ 12,000 TB │  0 B │" in out
    assert "e+" not in out


def test_the_tables_say_whose_model_they_are(capsys):
    # Under mixed precision the analytic table is the paper's (2/2/12 B per parameter: zero3's params
    # 2 x 60,096 / 3 = 40.06 kB), and the simulation's prediction what FSDP2 keeps (fp32 shards).
    assert run_estimate_cli(["--params", "60096", "--world-size", "3", "--mixed-precision"]) == 0
    out = capsys.readouterr().out
    assert "Per rank, the ZeRO paper's model: 60096 params, N = 3, mixed precision, K = 12" in out
    assert "│ zero3    │ 40.06 kB │" in out
    from io import StringIO
    from types import SimpleNamespace

    from rich.console import Console

    states = {"params": 81_320, "grads": 81_320, "optimizer": 162_852, "total": 325_492}
    result = SimpleNamespace(
        config=SimpleNamespace(strategy="zero3", world_size=3, size="tiny", batch_size=1), num_params=60_096,
        seq_len=32, model_states=states, predicted_model_states=states, activations_after_forward=0, peak_bytes=0,
        model_states_match_prediction=True, wall_s=0.0, peak_rss_bytes=0, method="fake")
    console = Console(file=StringIO(), width=200)
    estimate._render_simulation(result, console)
    assert "predicted (analytic: FSDP2's fp32 4/4/8 B, padded)" in console.file.getvalue()


def test_table1_json_and_table(capsys):
    rows = estimate_json(["--table1"], capsys)["table1"]
    assert len(rows) == 18
    assert run_estimate_cli(["--table1"]) == 0
    out = capsys.readouterr().out
    for cell in ("52.5", "41.3", "31.4", "16.6", "1.88", "0.12", "2048", "896", "16000", "62.5", "15.6"):
        assert cell in out


@pytest.mark.parametrize(("argv", "message"), [
    (["--simulate", "--params", "7.5B", "--world-size", "8"], "--params is for the analytic estimate without it"),
    (["--table1", "--simulate"], "--table1 reproduces the paper's table as it stands; it takes no --simulate"),
    (["--table1", "--params", "7.5B", "--world-size", "8"], "it takes no --params --world-size"),
    (["--params", "7.5B", "--world-size", "8", "--size", "tiny", "--batch", "4"],
     "--size --batch shape the --simulate run; without --simulate the estimate takes --params"),
    (["--params", "7.5B", "--world-size", "8", "--batch", "4"],
     "--batch shapes the --simulate run; without --simulate the estimate takes --params"),
])
def test_a_flag_the_report_would_not_read_is_refused(argv, message, capsys):
    # Each of these once printed a report that silently dropped a flag (the simulation of tiny, for
    # a --params of 7.5B).
    assert_usage_error(argv, message, capsys)


def assert_usage_error(argv, message, capsys):
    """Refused as argparse refuses: exit status 2, the message on stderr, nothing on stdout."""
    with pytest.raises(SystemExit) as exit_info:
        run_estimate_cli(argv)
    assert exit_info.value.code == 2
    out, err = capsys.readouterr()
    assert err.startswith("sharding-lab estimate: ") and message in err and out == ""


def test_simulate_refuses_more_ranks_than_plan_takes_before_simulating(monkeypatch, capsys):
    # 10**8 ranks once ran on (FSDP2 lays out every rank's chunk: about a millisecond a rank, for tiny).
    monkeypatch.setattr(estimate, "_simulate_with_progress", lambda args: pytest.fail("simulated before refusing"))
    assert_usage_error(["--simulate", "--world-size", "100000000"],
                       "--simulate takes at most 131,072 ranks, as `plan` does; got --world-size 100,000,000 "
                       "(the analytic estimate, without --simulate, takes up to its parameter count)", capsys)


def test_more_ranks_than_parameters_is_a_usage_error_naming_the_count_and_the_bound(capsys):
    # `--params 10 --world-size 11` once printed a table: one padding element per rank, whatever N.
    assert_usage_error(["--params", "10", "--world-size", "11"],
                       "--world-size 11 is more ranks than --params has parameters (10): the ZeRO paper's model "
                       "shares Ψ parameters among N ranks, Ψ/N each, so N is at most Ψ = 10\n", capsys)


def test_as_many_ranks_as_parameters_is_one_parameter_each(capsys):
    report = estimate_json(["--params", "10", "--world-size", "10"], capsys)
    # zero3 shards all three parts: 1 element each, fp32 Adam's 4 + 4 + 8 bytes.
    assert report["strategies"]["zero3"]["model_states_bytes_per_rank"] == {
        "params": 4, "grads": 4, "optimizer": 8, "total": 16}


def test_simulate_refuses_more_ranks_than_the_model_has_parameters_before_simulating(monkeypatch, capsys):
    # tiny: wte 128x32 + wpe 32x32 + 4 blocks of 12,704 + ln_f 64 + lm_head 128x32 = 60,096 parameters.
    # 100,000 ranks once simulated for two minutes, then printed the paper's table of padding beside it.
    monkeypatch.setattr(estimate, "_simulate_with_progress", lambda args: pytest.fail("simulated before refusing"))
    assert_usage_error(["--simulate", "--world-size", "100000"],
                       "--world-size 100,000 is more ranks than --size tiny has parameters (60,096)", capsys)


def test_world_size_is_required_without_table1(capsys):
    assert_usage_error(["--params", "7.5B"], "--world-size is required", capsys)
    assert_usage_error(["--world-size", "8"], "--params is required", capsys)


@pytest.mark.slow
def test_json_from_the_sharding_lab_cli_is_one_object():
    # What a script sees from `sharding-lab estimate ... --json`: one JSON object on stdout, nothing else.
    completed = subprocess.run(
        [sys.executable, "-m", "sharding_lab.cli", "estimate", "--params", "128B", "--world-size", "1024", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    report = json.loads(completed.stdout)
    assert report["strategies"]["zero3"]["model_states_bytes_per_rank"]["total"] == 16 * 128_000_000_000 // 1024


def _pytorch_rows(out: str) -> dict[str, list[str]]:
    """The PyTorch-dtype table's rows (the second table): strategy -> its other cells."""
    second = out[out.index("┃ strategy", out.index("┃ strategy") + 1):]
    rows = {}
    for line in second.splitlines():
        if line.startswith("└"):
            break
        if line.startswith("│"):
            strategy, *cells = [cell.strip() for cell in line.split("│")][1:-1]
            rows[strategy] = cells
    return rows


def test_the_pytorch_table_says_each_strategys_dtypes_and_why(capsys, monkeypatch):
    # 7.5B at N = 64, worked out by hand in the dtypes each PyTorch strategy moves under the engine's mixed
    # precision. ddp: an fp32 all-reduce of 2Ψ elements (the paper's count), 8 B x 7.5e9 = 60 GB, on the wire
    # 2 x 63/64 x 30 GB = 59.06 GB. zero1: DDP's fp32 all-reduce and ZeroRedundancyOptimizer's fp32 broadcasts
    # stand for the paper's reduce-scatter and all-gather, so both fp32: 30 + 30 = 60 GB, 63/64 x 60 = 59.06 GB.
    # zero2 (FSDP2): fp32 reduce-scatter 30 GB + bf16 all-gather 15 GB = 45 GB, 63/64 x 45 = 44.3 GB.
    # zero3: two bf16 all-gathers (15 + 15) and an fp32 reduce-scatter (30) = 60 GB, 59.06 GB on the wire.
    monkeypatch.setenv("COLUMNS", "200")
    assert run_estimate_cli(["--params", "7.5B", "--world-size", "64", "--mixed-precision"]) == 0
    out = capsys.readouterr().out
    assert _pytorch_rows(out) == {
        "ddp": ["60 GB", "59.06 GB", "all_reduce fp32"],
        "zero1": ["60 GB", "59.06 GB", "reduce_scatter fp32, all_gather fp32"],
        "zero2": ["45 GB", "44.3 GB", "reduce_scatter fp32, all_gather bf16"],
        "zero3": ["60 GB", "59.06 GB", "all_gather bf16 x2, reduce_scatter fp32"],
    }
    text = " ".join(out.split())
    assert "bf16 gathers, fp32 reductions" not in text  # the title no longer claims bf16 gathers for all four
    # Why, per strategy, as torch's sources have it: DDP makes its bf16 copies locally and all-reduces fp32;
    # ZeroRedundancyOptimizer has no mixed precision and broadcasts fp32 parameters; FSDP2 gathers bf16.
    assert "casts each rank's whole fp32 parameters to bf16 locally" in text
    assert "ZeroRedundancyOptimizer has no mixed precision of its own" in text
    assert "broadcasts each updated parameter in its dtype, fp32" in text
    assert "all-gathers bf16 copies of the fp32 parameter shards and reduce-scatters fp32 gradients" in text
    # DDP neither all-gathers nor shards: the memory note says what it keeps.
    assert "DDP's likewise" not in text
    assert "DDP (ddp, zero1) keeps whole fp32 parameters and gradients on every rank" in text


def test_the_pytorch_table_reads_whole_in_80_columns(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    assert run_estimate_cli(["--params", "7.5B", "--world-size", "64", "--mixed-precision"]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80 and "…" not in out
    assert _pytorch_rows(out)["zero1"][:2] == ["60 GB", "59.06 GB"]


def test_the_json_gives_each_pytorch_collectives_dtype(capsys):
    # Ψ = 1000 at N = 4: zero1's two collectives move 4 B x 1000 each (fp32), zero3's all-gathers 2 B x 1000.
    report = estimate_json(["--params", "1000", "--world-size", "4", "--mixed-precision"], capsys)
    pytorch = {s: f["communication_per_step_pytorch"] for s, f in report["strategies"].items()}
    assert [(c["op"], c["dtype"], c["bytes"]) for c in pytorch["zero1"]["collectives"]] == [
        ("reduce_scatter", "fp32", 4000), ("all_gather", "fp32", 4000)]
    assert [(c["op"], c["dtype"], c["bytes"]) for c in pytorch["zero3"]["collectives"]] == [
        ("all_gather", "bf16", 2000), ("all_gather", "bf16", 2000), ("reduce_scatter", "fp32", 4000)]
    assert pytorch["ddp"]["dtypes"] == "all_reduce fp32"
    assert "ZeroRedundancyOptimizer" in pytorch["zero1"]["accounting"]
    assert "MixedPrecisionPolicy" in pytorch["zero2"]["accounting"]
