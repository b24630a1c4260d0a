"""`sharding-lab`: measure strategies on real ranks, compare them, estimate beyond one machine.

    sharding-lab measure --strategy zero3 --world-size 2 [--size tiny] [--micro-batch 2 --seq 64] [--no-prefetch] [--json]
        [--activation-checkpointing] [--cpu-offload] [--replicas 2] [--grad-accum 4] [--mixed-precision]
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
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from sharding_lab import estimate, plan_command
from sharding_lab.cli_args import positive_int, timeout_seconds
from sharding_lab.labs.commands import register as register_labs  # list, run (no torch on import)
from sharding_lab.model_config import SIZES
from sharding_lab.run_config import DEVICES, Placement, RunConfig
from sharding_lab.strategies import NAMES, STRATEGIES, Strategy

if TYPE_CHECKING:
    from sharding_lab.measurement import Measurement



def _add_run_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--world-size", type=positive_int, default=2, help="ranks to start (default 2)")
    parser.add_argument("--size", default="tiny", choices=list(SIZES), help="model size (default tiny)")
    parser.add_argument("--tied", action="store_true", help="the head uses the embedding's weight (GPT-2's tie)")
    parser.add_argument("--micro-batch", type=positive_int, default=RunConfig.batch_size,
                        help=f"sequences per rank per forward (default {RunConfig.batch_size})")
    parser.add_argument("--seq", type=positive_int, help="tokens per sequence (default the model's block_size)")
    parser.add_argument("--prefetch", action=argparse.BooleanOptionalAction, default=None,  # None: not given
                        help="FSDP: explicit prefetching of the next block's all-gather (default on); "
                        "`measure` refuses either flag for a DDP strategy, `compare` runs those without it")
    parser.add_argument("--mixed-precision", action="store_true", help="bf16 parameters, fp32 reduction")
    parser.add_argument("--check-gradients", action="store_true",
                        help="compare the full gradient with a single-process reference")
    parser.add_argument("--activation-checkpointing", action="store_true",
                        help="recompute each block's forward in backward instead of keeping its activations")
    parser.add_argument("--cpu-offload", action="store_true",
                        help="FSDP: keep sharded parameters, gradients and Adam state in host memory "
                        "(CPUOffloadPolicy); `measure` refuses it for a DDP strategy, `compare` runs those without it")
    parser.add_argument("--replicas", type=positive_int, default=1,
                        help="FSDP: HSDP over a replicas x (world size / replicas) mesh (default 1: full "
                        "sharding); `measure` refuses it for a DDP strategy, `compare` runs those without it")
    parser.add_argument("--grad-accum", type=positive_int, default=1, metavar="STEPS",
                        help="micro-batches per optimizer step; gradients sync on the last only (default 1)")
    parser.add_argument("--device", choices=DEVICES, default="cpu",
                        help="cpu (gloo; the default) or cuda (where ranks go: --placement); ignored under torchrun")
    parser.add_argument(
        "--placement", choices=[p.value for p in Placement], default="auto",
        help="auto (default): one GPU per rank when there are enough, else a rank view; ranks; rank-view "
        "(rank 0 of N in one process, fake process group: real memory, no data moved); shared-gpu "
        "(N ranks on cuda:0 over gloo)",
    )
    parser.add_argument("--timeout", type=timeout_seconds, default=600.0,
                        help="seconds, start-up included, before a hung run is ended (default %(default)g)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")


def _run_config(args: argparse.Namespace, strategy: str, *, fsdp_options_only_where_they_apply: bool = False,
                **options) -> RunConfig:
    """The run the flags describe. `compare` passes FSDP's own options (prefetch, offload, HSDP) to the
    FSDP strategies only; `measure` refuses them for a DDP strategy, naming the flag."""
    fsdp_options = _fsdp_options(args, strategy, only_where_they_apply=fsdp_options_only_where_they_apply)
    return RunConfig.of(
        strategy, world_size=args.world_size, device=args.device, placement=args.placement, size=args.size,
        batch_size=args.micro_batch, seq_len=args.seq, mixed_precision=args.mixed_precision,
        check_gradients=args.check_gradients,
        activation_checkpointing=args.activation_checkpointing, grad_accum_steps=args.grad_accum,
        model_overrides={"tied": True} if args.tied else {}, **fsdp_options, **options,
    )


def _fsdp_flags(args: argparse.Namespace) -> list[str]:
    """The FSDP2-only flags given, as typed. --[no-]prefetch and --[no-]reshard-after-forward default to
    None, so that either way of writing one is seen; only `measure` has the latter."""
    reshard = getattr(args, "reshard_after_forward", None)
    return [flag for flag, given in (
        ("--prefetch", args.prefetch is True), ("--no-prefetch", args.prefetch is False),
        ("--reshard-after-forward", reshard is True), ("--no-reshard-after-forward", reshard is False),
        ("--cpu-offload", args.cpu_offload), ("--replicas", args.replicas > 1)) if given]


def _fsdp_options(args: argparse.Namespace, strategy: Strategy | str, *, only_where_they_apply: bool) -> dict:
    """The FSDP2-only options for `strategy`, refused here by their flags: RunConfig's own ValueErrors
    name its fields (cpu_offload, replicas=3), which are not what the user typed, and it takes prefetch
    and reshard-after-forward for DDP without a word, as options DDP never reads."""
    if not Strategy.parse(strategy).fully_sharded:
        given = _fsdp_flags(args)
        if given and not only_where_they_apply:
            raise ValueError(f"{' and '.join(given)} {'is' if len(given) == 1 else 'are'} FSDP2's (zero2, zero3): "
                             f"{strategy} does not shard parameters")
        return {}
    if args.world_size % args.replicas:
        raise ValueError(f"--replicas {args.replicas} must divide --world-size {args.world_size} "
                         "(HSDP's mesh is replicas x shards)")
    return {"prefetch": args.prefetch is not False, "cpu_offload": args.cpu_offload, "replicas": args.replicas}


def register_measure(subparsers) -> None:
    parser = subparsers.add_parser("measure", help="measure one strategy's memory, communication and step time")
    parser.add_argument("--strategy", required=True, choices=NAMES,
                        help="ddp, zero1 (DDP with a sharded optimizer), zero2 or zero3 (FSDP2; fsdp is zero3)")
    parser.add_argument("--reshard-after-forward", action=argparse.BooleanOptionalAction, default=None,
                        help="FSDP: override the strategy's choice (zero2 off, zero3 on); refused for a DDP strategy")
    _add_run_options(parser)
    parser.set_defaults(func=run_measure)


def register_compare(subparsers) -> None:
    parser = subparsers.add_parser("compare", help="every strategy side by side, from one launch")
    _add_run_options(parser)
    parser.set_defaults(func=run_compare)


def run_measure(args: argparse.Namespace) -> int:
    runs = [_run_config(args, args.strategy, reshard_after_forward=args.reshard_after_forward)]
    measurement = _measure(runs, args, f"measuring {args.strategy} on {args.world_size} ranks")[0]
    if measurement is None:
        return 0
    if args.json:
        _print_json(measurement.to_json())
    else:
        from sharding_lab.report import render_measurement

        render_measurement(measurement)
    return 0


def run_compare(args: argparse.Namespace) -> int:
    from sharding_lab.engine.launch import under_torchrun

    strategies = list(STRATEGIES)
    if args.mixed_precision and args.device != "cuda" and not under_torchrun():
        # DDP's mixed precision needs CUDA (measure refuses it): compare what can run, and say so.
        left_out = [s for s in strategies if s.uses_ddp]
        strategies = [s for s in strategies if not s.uses_ddp]
        print(f"sharding-lab: {', '.join(map(str, left_out))} left out: DDP's mixed precision needs CUDA "
              f"(its CUDA events); comparing {', '.join(map(str, strategies))}", file=sys.stderr)
    runs = [_run_config(args, strategy, fsdp_options_only_where_they_apply=True) for strategy in strategies]
    fsdp_only = _fsdp_flags(args)
    without = [str(run.strategy) for run in runs if not run.strategy.fully_sharded]
    if fsdp_only and without:
        print(f"sharding-lab: {', '.join(without)} run without {' and '.join(fsdp_only)}: FSDP2's options, which DDP "
              "cannot take", file=sys.stderr)
    names = ", ".join(map(str, strategies))
    measurements = _measure(runs, args, f"measuring {names} on {args.world_size} ranks")
    if measurements[0] is None:
        return 0
    by_strategy = {str(m.strategy): m for m in measurements}
    if args.json:
        strategies = {name: m.to_json() for name, m in by_strategy.items()}
        _print_json({"world_size": args.world_size, "size": args.size, "strategies": strategies})
    else:
        from sharding_lab.report import render_comparison

        render_comparison(by_strategy)
    return 0


def _measure(runs: list[RunConfig], args: argparse.Namespace, description: str) -> list[Measurement | None]:
    """Measure in one launch, with a progress display on an interactive stderr; None off rank 0."""
    from sharding_lab.engine.launch import is_reporting_rank
    from sharding_lab.engine.measure import measure_many

    def measure(on_progress=None) -> list[Measurement]:
        return measure_many(runs, timeout_s=args.timeout, on_progress=on_progress)

    if not is_reporting_rank():
        measure()
        return [None] * len(runs)
    if args.json or not sys.stderr.isatty():
        measurements = measure()
    else:
        from rich.console import Console

        with Console(stderr=True).status(description + " ...") as status:
            measurements = measure(lambda label: status.update(f"{description}: {label}"))
    for note in dict.fromkeys(m.config.placement_note for m in measurements if m.config.placement_note):
        print(f"sharding-lab: {note}", file=sys.stderr)  # what was asked and what was done instead
    return measurements


def _print_json(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")


def _simulate_plan(request):
    """`plan --simulate`: the engine's FSDP2 simulation of a plan request (the engine imported only now)."""
    from sharding_lab.engine.simulate import simulate

    return simulate(plan_command.run_config_for(request))


def register_plan(subparsers) -> None:
    plan_command.register(subparsers, simulate=_simulate_plan)


# Every subcommand, in the order `--help` lists them. The labs' `list` and `run` go here too.
SUBCOMMANDS: tuple[Callable[..., None], ...] = (
    register_measure, register_compare, estimate.register, register_plan, register_labs,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sharding-lab", description=__doc__.split("\n\n")[0])
    subparsers = parser.add_subparsers(dest="command", required=True)
    for register in SUBCOMMANDS:
        register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return _run(build_parser().parse_args(argv))


def entry() -> None:
    """The `sharding-lab` command: `main`, then out. A command that starts no process (`plan`,
    `estimate`) skips the interpreter's teardown once its answer is flushed: unloading torch's modules
    took 0.7-1.0 s on a 2-core machine, after the answer, and frees nothing the kernel does not."""
    args = build_parser().parse_args()
    code = _run(args)
    # Done: a Ctrl-C now (a second one after an interrupt, say) would only print a traceback from the
    # interpreter's teardown (about a second with torch loaded), and ends nothing that is not ending.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if getattr(args, "exit_without_teardown", False):
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except (BrokenPipeError, ValueError):  # the reader left: as main's BrokenPipeError
            code = code or 1
        os._exit(code)
    sys.exit(code)


def _run(args: argparse.Namespace) -> int:
    from sharding_lab.engine.launch import RankFailed, ranks_started, sigint_unwinds, sigterm_unwinds

    try:
        with sigterm_unwinds(), sigint_unwinds():
            return args.func(args)
    except KeyboardInterrupt:  # Ctrl-C, unwound as SIGTERM is: every rank started has been stopped
        stopped = "; every rank stopped" if ranks_started() else ""
        print(f"sharding-lab {args.command}: interrupted{stopped}", file=sys.stderr)
        return 128 + signal.SIGINT  # 130, as SIGTERM's exit is 143
    except BrokenPipeError:  # `... --json | head`: the reader left; say nothing more, as Unix tools do
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's final flush does not raise again
        return 1
    except RankFailed as failure:
        print(f"sharding-lab: {failure.for_user()}", file=sys.stderr)
        return 1
    except ValueError as error:  # a combination the engine refuses, e.g. DDP mixed precision on CPU
        print(f"sharding-lab: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    entry()
