"""`sharding-lab`: measure strategies on real ranks, compare them, estimate beyond one machine.

    sharding-lab measure --strategy zero3 --world-size 2 [--size tiny] [--no-prefetch] [--json]
    sharding-lab compare [--world-size 2] [--json]
    sharding-lab estimate --params 7.5B --world-size 64 [--json]        (sharding_lab.estimate)
    torchrun --nproc-per-node 2 -m sharding_lab.cli measure --strategy zero3 --world-size 2

Each subcommand registers itself on the parser and sets `func`; `main` only dispatches. With `--json`
stdout carries exactly one JSON object (ranks print to stderr); otherwise rich tables, with a
progress display on stderr while the ranks run. Under torchrun only rank 0 prints.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence

from sharding_lab.labs.commands import register as register_labs  # list, run (no torch on import)
from sharding_lab.strategies import STRATEGIES, STRATEGY_ALIASES

# Spelled out so that `--help` and `estimate` never import torch (sharding_lab.engine.model holds the real
# definitions; a test keeps them equal).
SIZES = ("tiny", "gpt2-small", "gpt2-medium", "gpt2-large", "1b", "7b", "70b")


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--world-size", type=int, default=2, help="ranks to start (default 2)")
    parser.add_argument("--size", default="tiny", choices=SIZES, help="model size (default tiny)")
    parser.add_argument("--prefetch", action=argparse.BooleanOptionalAction, default=True,
                        help="FSDP explicit prefetching of the next block's all-gather (default on)")
    parser.add_argument("--mixed-precision", action="store_true", help="bf16 parameters, fp32 reduction")
    parser.add_argument("--check-gradients", action="store_true",
                        help="compare the full gradient with a single-process reference")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cpu (gloo) or cuda (NCCL, one GPU per rank); ignored under torchrun")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds before a hung run is ended")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")


def _run_options(args: argparse.Namespace) -> dict:
    return {"size": args.size, "prefetch": args.prefetch, "mixed_precision": args.mixed_precision,
            "check_gradients": args.check_gradients}


def register_measure(subparsers) -> None:
    parser = subparsers.add_parser("measure", help="measure one strategy's memory, communication and step time")
    parser.add_argument("--strategy", required=True, choices=[*STRATEGIES, *STRATEGY_ALIASES])
    parser.add_argument("--reshard-after-forward", action=argparse.BooleanOptionalAction, default=None,
                        help="FSDP: override the strategy's choice (zero2 off, zero3 on)")
    _add_run_options(parser)
    parser.set_defaults(func=run_measure)


def register_compare(subparsers) -> None:
    parser = subparsers.add_parser("compare", help="every strategy side by side, from one launch")
    _add_run_options(parser)
    parser.set_defaults(func=run_compare)


def run_measure(args: argparse.Namespace) -> int:
    options = {**_run_options(args), "reshard_after_forward": args.reshard_after_forward}
    runs = [{"strategy": args.strategy, **options}]
    measurement = _measure(runs, args, f"measuring {args.strategy} on {args.world_size} ranks")[0]
    if measurement is None:
        return 0
    if args.json:
        _print_json(measurement)
    else:
        from sharding_lab.report import render_measurement

        render_measurement(measurement)
    return 0


def run_compare(args: argparse.Namespace) -> int:
    runs = [{"strategy": strategy, **_run_options(args)} for strategy in STRATEGIES]
    measurements = _measure(runs, args, f"measuring {', '.join(STRATEGIES)} on {args.world_size} ranks")
    if measurements[0] is None:
        return 0
    by_strategy = {m["config"]["strategy"]: m for m in measurements}
    if args.json:
        _print_json({"world_size": args.world_size, "size": args.size, "strategies": by_strategy})
    else:
        from sharding_lab.report import render_comparison

        render_comparison(by_strategy)
    return 0


def _measure(runs: list[dict], args: argparse.Namespace, description: str) -> list[dict | None]:
    """Measure in one launch, with a progress display on an interactive stderr; None off rank 0."""
    from sharding_lab.engine.launch import is_reporting_rank
    from sharding_lab.engine.measure import measure_many

    def measure(on_progress=None) -> list[dict]:
        return measure_many(runs, args.world_size, device=args.device, timeout_s=args.timeout,
                            on_progress=on_progress)

    if not is_reporting_rank():
        measure()
        return [None] * len(runs)
    if args.json or not sys.stderr.isatty():
        return measure()
    from rich.console import Console

    with Console(stderr=True).status(description + " ...") as status:
        return measure(lambda label: status.update(f"{description}: {label}"))


def _print_json(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")


def _register_estimate(subparsers) -> None:
    try:
        from sharding_lab import estimate
    except ImportError:  # estimate is optional: measure and compare work without it
        return
    estimate.register(subparsers)


# Every subcommand, in the order `--help` lists them. The labs' `list` and `run` go here too.
SUBCOMMANDS: tuple[Callable[..., None], ...] = (register_measure, register_compare, _register_estimate, register_labs)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sharding-lab", description=__doc__.split("\n\n")[0])
    subparsers = parser.add_subparsers(dest="command", required=True)
    for register in SUBCOMMANDS:
        register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from sharding_lab.engine.launch import RankFailed

    try:
        return args.func(args)
    except RankFailed as failure:
        print(f"sharding-lab: {failure}", file=sys.stderr)
        return 1
    except ValueError as error:  # a combination the engine refuses, e.g. DDP mixed precision on CPU
        print(f"sharding-lab: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
