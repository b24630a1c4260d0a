"""`sharding-lab estimate`: the ZeRO paper's analytic figures, Table 1, and the FSDP2 simulation.

    sharding-lab estimate --params 7.5B --world-size 64 --mixed-precision [--json]
    sharding-lab estimate --table1 [--json]
    sharding-lab estimate --simulate --size 70b --world-size 1024 [--batch 1 --seq 128] [--json]

Everything here but `--simulate` is pure arithmetic (sharding_lab.analytic); the
simulation imports torch lazily, so the arithmetic answers instantly.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from decimal import ROUND_DOWN, ROUND_HALF_UP, Decimal, InvalidOperation, Overflow

from sharding_lab.analytic import (
    PAPER_MIXED_PRECISION_WIRE,
    PYTORCH_MIXED_PRECISION_WIRE,
    bytes_per_param,
    communication_bytes_per_step,
    model_states_bytes_per_rank,
)
from sharding_lab.cli_args import positive_int
from sharding_lab.model_config import config_for
from sharding_lab.model_config import num_params as num_params_of
from sharding_lab.planner import BOUNDS
from sharding_lab.strategies import MODEL_STATE_PARTS, STRATEGIES, Strategy

GB = 10**9  # the ZeRO paper's GB: 7.5B params x 16 B = 120 GB
# --simulate's sequence unless --seq says otherwise (or the model's block_size, when shorter): short
# enough that a 70B model at 1024 ranks simulates in seconds; activations grow with it.
DEFAULT_SIMULATED_SEQ = 128

# Table 1 of the paper: model sizes and data-parallel degrees, K = 12 mixed precision.
TABLE1_PARAMS: tuple[int, ...] = (7_500_000_000, 128_000_000_000, 1_000_000_000_000)
TABLE1_WORLD_SIZES: tuple[int, ...] = (1, 4, 16, 64, 256, 1024)
# The paper's column names for each strategy.
PAPER_STAGE_NAMES: dict[str, str] = {str(s): s.paper_name for s in STRATEGIES}

# The pytorch table counts the paper's collectives in PyTorch's dtypes; where the engine (PyTorch's
# implementation) issues others, Strategy.collective_differences says how. Only a measurement gives their
# figures: they depend on the model's tensors (zero1's broadcast per parameter, zero3's root unit), which a
# parameter count lacks.
PYTORCH_COMM_ACCOUNTING = ("the ZeRO paper's collectives, derived in the dtypes PyTorch moves under mixed "
                           "precision as the engine configures it")
MEASURED_COMM_HINT = "`sharding-lab measure` and `compare` give the engine's collectives, measured"
# Why each strategy's collectives move the dtypes they do, read from torch 2.13's sources: DDP's mixed
# precision (nn/parallel/distributed.py, ddp_comm_hooks/mixed_precision_hooks.py) makes its bf16 copies on
# each rank and casts the gradient buckets to reduce_dtype before the all-reduce; ZeroRedundancyOptimizer
# (distributed/optim/zero_redundancy_optimizer.py) broadcasts `param.data`, fp32 again after DDP's backward.
_FSDP2_DTYPES_WHY = ("FSDP2's MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32), as the engine sets it, "
                     "all-gathers bf16 copies of the fp32 parameter shards and reduce-scatters fp32 gradients")
PYTORCH_DTYPES_WHY: dict[Strategy, str] = {
    Strategy.DDP: ("DDP's mixed precision (the engine's _MixedPrecision(param_dtype=bf16, reduce_dtype=fp32), "
                   "private in torch) casts each rank's whole fp32 parameters to bf16 locally, so no collective of the "
                   "step moves parameters, and all-reduces the gradients in fp32"),
    Strategy.ZERO1: ("its gradients go through DDP's fp32 all-reduce, as ddp's do, and ZeroRedundancyOptimizer has "
                     "no mixed precision of its own: it broadcasts each updated parameter in its dtype, fp32; so "
                     "the paper's reduce-scatter and all-gather are both counted in fp32"),
    Strategy.ZERO2: _FSDP2_DTYPES_WHY,
    Strategy.ZERO3: _FSDP2_DTYPES_WHY,
}
_DTYPE_OF_ELEMENT_BYTES = {2: "bf16", 4: "fp32"}

_SUFFIXES = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12}


MAX_PARAMS = 10**15  # a thousand times today's largest models; beyond, a float of the bytes overflows


def parse_param_count(text: str) -> int:
    """'7.5e9', '7.5B', '128B', '1T', '350M' or '1000' as a whole number of parameters."""
    match = re.fullmatch(r"\s*([0-9.eE+-]+?)\s*([kKmMbBgGtT]?)\s*", text)
    try:
        if match is None:
            raise InvalidOperation
        number = Decimal(match.group(1))
        value = number * _SUFFIXES[match.group(2).upper()]
    except Overflow:  # past the decimal context's exponent range ('1e999999999'): far beyond MAX_PARAMS
        value = Decimal("Infinity").copy_sign(number)
    except InvalidOperation:
        raise ValueError(f"not a parameter count: {text!r} (try 7.5e9, 7.5B, 128B or 1T)") from None
    if value != value.to_integral_value() or value <= 0:
        raise ValueError(f"a parameter count must be a positive whole number, got {text!r}")
    if value > MAX_PARAMS:
        raise ValueError(f"a parameter count must be at most {MAX_PARAMS:.0e} (a quadrillion), got {text!r}")
    return int(value)


def analytic_report(num_params: int, world_size: int, *, mixed_precision: bool = False) -> dict:
    """The analytic figures for every strategy, as the --json object carries them.

    With mixed precision, `communication_per_step` is the paper's (fp16 on the wire throughout) and
    `communication_per_step_pytorch` the paper's collectives in the dtypes PyTorch's mixed precision
    moves as the engine sets it (FSDP2, zero2 and zero3: bf16 all-gathers, fp32 reduce-scatters; DDP and
    ZeroRedundancyOptimizer, ddp and zero1: fp32 throughout), each collective's `dtype` and the
    `accounting` saying which and why, with `engine_differs` where the engine's collectives are not the
    paper's (zero1, zero2, zero3).
    """
    per_param = bytes_per_param(mixed_precision=mixed_precision)
    wire = PAPER_MIXED_PRECISION_WIRE if mixed_precision else {"gather": 4, "reduce": 4}
    strategies = {}
    for strategy in STRATEGIES:
        figures = {
            "model_states_bytes_per_rank": model_states_bytes_per_rank(
                num_params, world_size, strategy, mixed_precision=mixed_precision
            ),
            "communication_per_step": communication_bytes_per_step(
                num_params, world_size, strategy,
                gather_bytes_per_element=wire["gather"], reduce_bytes_per_element=wire["reduce"],
            ),
        }
        if mixed_precision:
            pytorch = PYTORCH_MIXED_PRECISION_WIRE if strategy.fully_sharded else {"gather": 4, "reduce": 4}
            comm = communication_bytes_per_step(
                num_params, world_size, strategy,
                gather_bytes_per_element=pytorch["gather"], reduce_bytes_per_element=pytorch["reduce"],
            )
            for collective in comm["collectives"]:
                collective["dtype"] = _DTYPE_OF_ELEMENT_BYTES[collective["bytes"] // collective["elements"]]
            comm["dtypes"] = _dtypes_label(comm["collectives"])
            comm["accounting"] = f"{PYTORCH_COMM_ACCOUNTING} ({comm['dtypes']}): {PYTORCH_DTYPES_WHY[strategy]}"
            if strategy.collective_differences:
                comm["engine_differs"] = f"{strategy.collective_differences} {MEASURED_COMM_HINT}."
            figures["communication_per_step_pytorch"] = comm
        strategies[str(strategy)] = figures
    return {
        "params": num_params,
        "world_size": world_size,
        "mixed_precision": mixed_precision,
        "bytes_per_param": per_param,
        "strategies": strategies,
    }


def _dtypes_label(collectives: list[dict]) -> str:
    """The collectives' ops and dtypes in order, a repeat counted: "all_gather bf16 x2, reduce_scatter fp32"."""
    runs: list[list] = []
    for collective in collectives:
        label = f"{collective['op']} {collective['dtype']}"
        if runs and runs[-1][0] == label:
            runs[-1][1] += 1
        else:
            runs.append([label, 1])
    return ", ".join(label + (f" x{count}" if count > 1 else "") for label, count in runs)


def table1() -> list[dict]:
    """The paper's Table 1: per-device model-state GB (1e9 B) for each model size and DP degree."""
    rows = []
    for num_params in TABLE1_PARAMS:
        for world_size in TABLE1_WORLD_SIZES:
            row: dict = {"params": num_params, "world_size": world_size}
            for strategy, column in PAPER_STAGE_NAMES.items():
                total = model_states_bytes_per_rank(num_params, world_size, strategy, mixed_precision=True)["total"]
                row[column] = total / GB
            rows.append(row)
    return rows


def paper_style(gigabytes: float) -> str:
    """A GB figure printed the way Table 1 prints it: from 100 GB whole GB, truncated (1T at DP 1024:
    4011.7 is printed 4011); below, rounded half up to one decimal from 10 GB and two under it: 3
    significant figures from 1 GB (7.5B at DP 64: 1.875 is 1.88), fewer under it (at 256: 0.46875 is 0.47)."""
    decimals = 0 if gigabytes >= 100 else 1 if gigabytes >= 10 else 2
    rounding = ROUND_DOWN if decimals == 0 else ROUND_HALF_UP
    rounded = Decimal(repr(gigabytes)).quantize(Decimal(1).scaleb(-decimals), rounding=rounding)
    text = f"{rounded:f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def format_bytes(num_bytes: float) -> str:
    """Bytes to 4 significant figures in the largest decimal unit that keeps them >= 1 (GB is 1e9 B), and
    past 10,000 TB (a quadrillion parameters' 16 PB) whole TB, never an exponent ("1.6e+04 TB")."""
    for unit, size in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if abs(num_bytes) >= size:
            text = f"{num_bytes / size:.4g}"
            return f"{num_bytes / size:,.0f} {unit}" if "e" in text else f"{text} {unit}"
    return f"{num_bytes:.0f} B"


def _params_label(num_params: int) -> str:
    for suffix, size in (("T", 10**12), ("B", 10**9), ("M", 10**6)):
        if num_params >= size:
            return f"{num_params / size:g}{suffix}"
    return str(num_params)


def _print_json(obj: dict) -> None:
    print(json.dumps(obj, indent=2))


def _render_analytic(report: dict, console) -> None:
    from rich.table import Table

    precision = "mixed precision, K = 12" if report["mixed_precision"] else "fp32 Adam"
    # The paper's model, not PyTorch's: under mixed precision its 2/2/12 bytes are not what FSDP2 keeps.
    table = Table(
        title=f"Per rank, the ZeRO paper's model: {_params_label(report['params'])} params, "
        f"N = {report['world_size']}, {precision}"
    )
    table.add_column("strategy")
    for part in (*MODEL_STATE_PARTS, "total"):
        table.add_column(part, justify="right")
    table.add_column("comm/step", justify="right")
    table.add_column("wire", justify="right")
    for strategy, figures in report["strategies"].items():
        states = figures["model_states_bytes_per_rank"]
        comm = figures["communication_per_step"]
        table.add_row(
            strategy,
            *(format_bytes(states[part]) for part in (*MODEL_STATE_PARTS, "total")),
            format_bytes(comm["bytes"]),
            format_bytes(comm["wire_bytes"]),
        )
    console.print(table)
    if report["mixed_precision"]:
        pytorch = Table(title="The ZeRO paper's communication per step in the dtypes PyTorch moves under "
                        "mixed precision, per strategy (derived)")
        for column in ("strategy", "comm/step", "wire", "dtypes (PyTorch's)"):
            pytorch.add_column(column, justify="right" if column in ("comm/step", "wire") else "left")
        for strategy, figures in report["strategies"].items():
            comm = figures["communication_per_step_pytorch"]
            pytorch.add_row(strategy, format_bytes(comm["bytes"]), format_bytes(comm["wire_bytes"]), comm["dtypes"])
        console.print(pytorch)
        # One reason per family, naming the strategies it holds for ("zero2, zero3: FSDP2's ...").
        reasons: dict[str, list[str]] = {}
        for strategy in STRATEGIES:
            reasons.setdefault(PYTORCH_DTYPES_WHY[strategy], []).append(str(strategy))
        why = "; ".join(f"{', '.join(names)}: {reason}" for reason, names in reasons.items())
        console.print(f"Why these dtypes (PyTorch's implementation as the engine configures it; with reduce_dtype "
                      f"unset, DDP and FSDP2 would reduce in bf16): {why}.")
        differ = " ".join(f"{s}: {s.collective_differences}" for s in STRATEGIES if s.collective_differences)
        console.print(f"These are the paper's collectives, not all the engine's. {differ} {MEASURED_COMM_HINT}.")
        console.print(
            "With mixed precision the paper moves fp16 throughout and keeps 2/2/12 bytes per parameter (the "
            "first table). PyTorch keeps fp32 parameters, gradients and Adam state, 4/4/8 bytes, and computes "
            "with bf16 copies: FSDP2 (zero2, zero3) shards all three between steps and all-gathers the copies; "
            "DDP (ddp, zero1) keeps whole fp32 parameters and gradients on every rank and makes its copies "
            "locally, gathering nothing; ZeroRedundancyOptimizer (zero1) shards Adam's state only."
        )
    console.print(
        "GB = 1e9 B, as the paper's. comm/step: the paper's volume per rank, 2Ψ elements for ddp, zero1, zero2 "
        "and 3Ψ for zero3; "
        "wire: per-rank bytes sent, "
        "derived from ring all-gather/reduce-scatter (N-1)/N·S and all-reduce 2(N-1)/N·S."
    )


def _render_table1(rows: list[dict], console) -> None:
    from rich.table import Table

    table = Table(
        title="ZeRO paper, Table 1: model states per device",
        caption="GB = 1e9 bytes; mixed-precision Adam, K = 12; baseline is plain data parallelism",
    )
    table.add_column("model")
    table.add_column("DP", justify="right")
    for column in PAPER_STAGE_NAMES.values():
        table.add_column(column, justify="right")
    for row in rows:
        first_of_model = row["world_size"] == TABLE1_WORLD_SIZES[0]
        table.add_row(
            _params_label(row["params"]) if first_of_model else "",
            str(row["world_size"]),
            *(paper_style(row[column]) for column in PAPER_STAGE_NAMES.values()),
            end_section=row["world_size"] == TABLE1_WORLD_SIZES[-1],
        )
    console.print(table)


def _render_simulation(result, console) -> None:
    from rich.table import Table

    config = result.config
    table = Table(
        title=f"Simulated FSDP2 ({config.strategy}) step, rank 0 of {config.world_size}: {config.size} "
        f"({_params_label(result.num_params)} params), batch {config.batch_size} x seq {result.seq_len}"
    )
    table.add_column("per rank")
    table.add_column("simulated", justify="right")
    # What FSDP2 keeps, fp32 even under mixed precision: not the paper's 2/2/12 bytes of the table above.
    table.add_column("predicted (analytic: FSDP2's fp32 4/4/8 B, padded)", justify="right")
    predicted, states = result.predicted_model_states, result.model_states
    for key in ("params", "grads", "optimizer"):
        table.add_row(key, format_bytes(states[key]), format_bytes(predicted[key]))
    table.add_row("activations", format_bytes(result.activations_after_forward), "-")
    table.add_row("peak", format_bytes(result.peak_bytes), "-")
    table.add_row("model states total", format_bytes(states["total"]), format_bytes(predicted["total"]))
    console.print(table)
    match = "yes" if result.model_states_match_prediction else "NO"
    console.print(
        f"model states match the prediction exactly: {match}. Wall time {result.wall_s:.1f} s, "
        f"peak host RSS {format_bytes(result.peak_rss_bytes)}. Method: {result.method}."
    )


def _refused(message: str) -> SystemExit:
    """A request refused before anything ran: said on stderr, exit status 2, as argparse's own."""
    print(f"sharding-lab estimate: {message}", file=sys.stderr)
    return SystemExit(2)


def _simulate_with_progress(args: argparse.Namespace):
    """Run the simulation (zero3) behind a spinner on stderr (a terminal only); bad sizes exit with a message."""
    from rich.console import Console

    from sharding_lab.engine.simulate import simulate
    from sharding_lab.run_config import RunConfig

    status_console = Console(stderr=True)
    try:
        seq = args.seq or min(DEFAULT_SIMULATED_SEQ, config_for(args.size).block_size)
        config = RunConfig.of(
            "zero3", world_size=args.world_size, size=args.size, batch_size=args.batch, seq_len=seq,
            mixed_precision=args.mixed_precision,
        )
        with status_console.status(f"Simulating {args.size} at {args.world_size} ranks on fake tensors..."):
            return simulate(config)
    except ValueError as error:  # a sequence longer than the model's block_size
        raise _refused(str(error)) from None


def _refuse_unused(args: argparse.Namespace) -> None:
    """A flag the chosen report would not read is refused, not silently dropped."""
    simulation_only = [f"--{n}" for n in ("size", "batch", "seq") if getattr(args, n) is not None]
    if args.table1:
        unused = [f for f, given in (("--params", args.params is not None), ("--world-size", args.world_size is not None),
                                      ("--simulate", args.simulate)) if given] + simulation_only
        if unused:
            raise _refused(f"--table1 reproduces the paper's table as it stands; "
                             f"it takes no {' '.join(unused)}")
    elif args.simulate and args.params is not None:
        raise _refused("--simulate counts the parameters of the model --size names "
                         "(default tiny); --params is for the analytic estimate without it")
    elif not args.simulate and simulation_only:
        raise _refused(f"{' '.join(simulation_only)} {'shapes' if len(simulation_only) == 1 else 'shape'} the --simulate run; "
                         "without --simulate the estimate takes --params")


def _refuse_more_ranks_than_params(world_size: int, num_params: int, model: str) -> None:
    """The paper's model gives each of N ranks Ψ/N of a sharded part (here ceil(Ψ/N), the flat buffer
    padded to a multiple of N). Past N = Ψ a rank's share is under one parameter: the table would print
    one padding element per rank, the same at every N, which answers no question (and a count typed
    without its suffix, `--params 7` for 7B, lands here)."""
    if world_size > num_params:
        raise _refused(f"--world-size {world_size:,} is more ranks than {model} has parameters ({num_params:,}): "
                       f"the ZeRO paper's model shares Ψ parameters among N ranks, Ψ/N each, so N is at most "
                       f"Ψ = {num_params:,}")


def run_estimate(args: argparse.Namespace) -> int:
    """The `estimate` subcommand: arguments in, one report out (a rich table or one JSON object)."""
    _refuse_unused(args)
    args.size, args.batch = args.size or "tiny", args.batch or 1
    if args.table1:
        rows = table1()
        if args.json:
            _print_json({"table1": rows, "unit": "GB (1e9 bytes)", "mixed_precision": True, "K": 12})
        else:
            from rich.console import Console

            _render_table1(rows, Console())
        return 0

    if args.world_size is None:
        raise _refused("--world-size is required (or use --table1)")
    if args.simulate and args.world_size > BOUNDS.gpus:
        # FSDP2 lays out every rank's chunk of every parameter: at 10**8 ranks it would run for a day.
        raise _refused(f"--simulate takes at most {BOUNDS.gpus:,} ranks, as `plan` does; got --world-size "
                       f"{args.world_size:,} (the analytic estimate, without --simulate, takes up to its "
                       "parameter count)")
    if args.simulate:
        try:
            num_params = num_params_of(config_for(args.size))  # the engine's own count (a test holds it)
        except ValueError as error:  # an unknown size, named with the sizes there are
            raise _refused(str(error)) from None
        _refuse_more_ranks_than_params(args.world_size, num_params, f"--size {args.size}")
    elif args.params is None:
        raise _refused("--params is required (or use --simulate --size NAME, or --table1)")
    else:
        num_params = args.params
        _refuse_more_ranks_than_params(args.world_size, num_params, "--params")
    simulation = _simulate_with_progress(args) if args.simulate else None

    report = analytic_report(num_params, args.world_size, mixed_precision=args.mixed_precision)
    if simulation is not None:
        report["simulate"] = simulation.to_json()
    if args.json:
        _print_json(report)
        return 0
    from rich.console import Console

    console = Console()
    _render_analytic(report, console)
    if simulation is not None:
        _render_simulation(simulation, console)
    return 0


def _param_count_arg(text: str) -> int:
    try:
        return parse_param_count(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def register(subparsers) -> None:
    """Add the `estimate` subcommand to the sharding-lab CLI (dispatched through args.func)."""
    parser = subparsers.add_parser(
        "estimate",
        help="analytic ZeRO memory/communication per rank, the paper's Table 1, or an FSDP2 simulation",
        description="Per-rank model-state memory and communication for ddp, zero1, zero2 and zero3 "
        "from the ZeRO paper's analytic model; --table1 reproduces the paper's Table 1; --simulate "
        "shards the GPT with FSDP2 under FakeTensorMode and a fake process group.",
    )
    parser.add_argument("--params", type=_param_count_arg,
                        help="the model's parameter count Ψ, e.g. 7.5e9, 7.5B, 128B, 1T (the analytic estimate's "
                        "input: required without --simulate or --table1)")
    parser.add_argument("--world-size", type=positive_int,
                        help="data-parallel ranks N the states are shared among (required unless --table1)")
    parser.add_argument(
        "--mixed-precision",
        action="store_true",
        help="fp16 params and grads, K = 12 bytes of Adam state; with --simulate, bf16 FSDP2 compute",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument("--table1", action="store_true", help="reproduce the ZeRO paper's Table 1")
    parser.add_argument("--simulate", action="store_true", help="simulate FSDP2 on fake tensors and a fake process group")
    parser.add_argument("--size", help="model size for --simulate (tiny, gpt2-small, ..., 70b; default tiny)")
    parser.add_argument("--batch", type=positive_int, help="micro-batch size per rank for --simulate (default 1)")
    parser.add_argument("--seq", type=positive_int, help="sequence length for --simulate (default: 128 or block_size)")
    parser.set_defaults(func=run_estimate, exit_without_teardown=True)  # cli.entry
