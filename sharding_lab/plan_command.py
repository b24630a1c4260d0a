"""`sharding-lab plan`: will it fit? The analytic planner beside the FSDP2 simulation and DeepSpeed's formula.

    sharding-lab plan --size 7b --gpus 64 --micro-batch 1 --seq 2048 --strategy all --mixed-precision
    sharding-lab plan --layers 32 --width 4096 --heads 32 --vocab 50304 --seq-len 4096 --seq 2048 --mesh 8x8 --gpu-memory-gb 141
    sharding-lab plan --size 1b --gpus 8 --micro-batch 4 --seq 512 --simulate --json

Torch-free: the simulation arrives as a callable (`register(subparsers, simulate=...)`), which `cli.py`
supplies with a lazy import of the engine, so importing this module never imports torch.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from sharding_lab.cli_args import at_most, fraction, positive_float
from sharding_lab.deepspeed_formula import DeepSpeedEstimate, deepspeed_estimate, largest_layer_params
from sharding_lab.model_config import SIZES, config_for
from sharding_lab.planner import (
    BOUNDS,
    GB,
    Category,
    Figure,
    Mesh,
    Method,
    ModelShape,
    PeakMemory,
    Plan,
    PlanRequest,
    filing_difference,
    padding_note,
    plan_analytic,
    plan_json,
)
from sharding_lab.planner_comm import NO_COLLECTIVES, WIRE_DERIVATION
from sharding_lab.run_config import RunConfig
from sharding_lab.strategies import NAMES, STRATEGIES, Strategy
from sharding_lab.units import human_bytes

# What answers --simulate: the request in, engine.simulate's `Simulation` out (read by attribute:
# peak_breakdown, num_params, wall_s, method).
Simulator = Callable[[PlanRequest], Any]

SIMULATION_HOLDS = "PyTorch FSDP2 itself (fully_shard per block, then root) on FakeTensors on CPU, FSDPMemTracker"
SIMULATION_LEAVES_OUT = (
    "the CUDA context, NCCL's buffers and the caching allocator's reserve (allocated bytes, as on CPU)",
    "CUDA's kernels' own workspaces: cuBLAS keeps one per thread that runs matmuls, 2 x 32 MiB on Hopper and "
    "later (64 MiB measured on an H200; 2 x 8.125 MiB before Hopper), and fp32 LayerNorm statistics",
    "communication time: collectives are answered by a fake process group",
)
# The simulator's tracker categories, folded into the planner's.
_SIMULATED_CATEGORIES: dict[Category, tuple[str, ...]] = {
    Category.PARAMETERS: ("params", "unsharded_params", "module_buffers"),
    Category.GRADIENTS: ("grads", "unsharded_grads"),
    Category.OPTIMIZER_STATE: ("optimizer",),
    Category.ACTIVATIONS: ("activations", "inputs"),
    Category.TEMPORARIES: ("temporaries",),
    Category.ALL_GATHER_BUFFERS: ("all_gather_buffers",),
    Category.REDUCE_SCATTER_BUFFERS: ("reduce_scatter_buffers",),
}


def simulation_unavailable(request: PlanRequest) -> str | None:
    """Why the engine's simulation cannot answer this request, or None when it can."""
    if not request.strategy.fully_sharded:
        return f"simulation not available for {request.strategy} (it simulates FSDP2: zero2, zero3)"
    if request.cpu_offload:
        return ("simulation not available with CPU offload: it runs on the CPU, where the host memory the "
                "offloaded states move to is the device itself, so it would count them as GPU memory")
    return None


def run_config_for(request: PlanRequest) -> RunConfig:
    """The engine configuration the simulation runs for a request: the named size, or any shape as
    overrides of every GPTConfig field."""
    config = request.model.to_config()
    named = request.model.name is not None and SIZES.get(request.model.name) == config
    return RunConfig.of(
        request.strategy, world_size=request.mesh.world_size, replicas=request.mesh.replicas,
        size=request.model.name if named else "tiny",
        model_overrides={} if named else config.to_dict(),
        batch_size=request.micro_batch, seq_len=request.seq, grad_accum_steps=request.grad_accum_steps,
        prefetch=request.prefetch, mixed_precision=request.mixed_precision,
        activation_checkpointing=request.activation_checkpointing, cpu_offload=request.cpu_offload,
    )


def request_for_config(config: RunConfig, gpu_memory_gb: float = 141.0) -> PlanRequest:
    """The plan request an engine configuration answers (the inverse of `run_config_for`), so a measured
    run can be held against the planner."""
    return PlanRequest(
        model=ModelShape.from_config(config_for(config.size, **dict(config.model_overrides)),
                                     name=None if config.model_overrides else config.size),
        mesh=Mesh(shards=config.shards, replicas=config.options.replicas),
        gpu_memory_gb=gpu_memory_gb,
        micro_batch=config.batch_size,
        seq=config.seq_len,
        strategy=config.strategy,
        mixed_precision=config.options.mixed_precision,
        activation_checkpointing=config.options.activation_checkpointing,
        cpu_offload=config.options.cpu_offload,
        grad_accum_steps=config.grad_accum_steps,
        prefetch=config.options.prefetch,
    )


def plan_from_simulation(request: PlanRequest, result: Any) -> Plan:
    """The simulation's peak breakdown as a Plan (communication is the analytic count: the fake process
    group moves nothing, so there is nothing else to report)."""
    breakdown = result.peak_breakdown
    categories = tuple(
        (c, Figure(sum(breakdown.get(key, 0) for key in keys), SIMULATION_HOLDS))
        for c, keys in _SIMULATED_CATEGORIES.items()
    )
    peak = PeakMemory(moment="the tracker's global peak", categories=categories)
    assert peak.total == breakdown["total"], "every tracker category is folded into one of ours"
    return Plan(
        request=request,
        method=Method.SIMULATION,
        num_params=result.num_params,
        peak=peak,
        largest_micro_batch=None,
        communication=plan_analytic(request).communication,
        holds=SIMULATION_HOLDS,
        leaves_out=SIMULATION_LEAVES_OUT,
        notes=(f"simulated in {result.wall_s:.1f} s: {result.method}",),
    )


def deepspeed_for(request: PlanRequest) -> DeepSpeedEstimate | None:
    """DeepSpeed's formula for the same configuration (ZeRO-2 and -3 only; GPUs on one node)."""
    if request.strategy not in (Strategy.ZERO2, Strategy.ZERO3):
        return None
    shapes = request.model.parameter_shapes()
    stage = 3 if request.strategy is Strategy.ZERO3 else 2
    # DeepSpeed's N is the ranks the states are split over: under HSDP, the shard group, not the world.
    mesh = request.mesh
    gpus_are = f"the shard group of the {mesh} mesh" if mesh.replicas > 1 else "all the GPUs"
    return deepspeed_estimate(stage, request.model.num_params, largest_layer_params(shapes),
                              mesh.shards, cpu_offload=request.cpu_offload, gpus_are=gpus_are)


def _request(args: argparse.Namespace, strategy: Strategy) -> PlanRequest:
    if args.size is not None:
        model = ModelShape.named(args.size)
    else:
        missing = [f"--{n}" for n in ("layers", "width", "heads", "vocab") if getattr(args, n) is None]
        if args.seq is None and args.seq_len is None:
            missing.append("--seq-len (or --seq)")
        if missing:
            raise ValueError(f"give --size NAME, or the shape: {' '.join(missing)} missing")
        model = ModelShape(args.layers, args.width, args.heads, args.vocab, args.seq_len or args.seq, tied=args.tied)
    if args.size is not None and args.seq_len is not None:
        raise ValueError("--seq-len is a hand-given shape's length; a named size has its own (use --seq)")
    if args.size is not None and (given := [f"--{n}" for n in ("layers", "width", "heads", "vocab") if getattr(args, n)]):
        raise ValueError(f"{' '.join(given)} {'gives' if len(given) == 1 else 'give'} a shape of your own; --size {args.size} has its own "
                         "(drop --size to plan the shape, or these to plan the named size)")
    if args.tied and args.size is not None:
        model = replace(model, tied=True)
    mesh = args.mesh if args.mesh is not None else Mesh.of(args.gpus)
    return PlanRequest(
        model, mesh, args.gpu_memory_gb, micro_batch=args.micro_batch, seq=args.seq, strategy=strategy,
        mixed_precision=args.mixed_precision, activation_checkpointing=args.activation_checkpointing,
        cpu_offload=args.cpu_offload, grad_accum_steps=args.grad_accum, headroom=args.headroom,
    )


def _strategies(args: argparse.Namespace) -> list[Strategy]:
    if args.strategy == "all":
        # Offload and HSDP are FSDP2's: with them, `all` means the strategies that have them.
        fsdp_only = args.cpu_offload or (args.mesh is not None and args.mesh.replicas > 1)
        return [s for s in STRATEGIES if s.fully_sharded or not fsdp_only]
    return [Strategy.parse(args.strategy)]


def _refuse_what_simulate_cannot_take(args: argparse.Namespace) -> None:
    """--simulate where it would answer nothing is refused, not dropped into a table cell."""
    if not args.simulate:
        return
    if args.cpu_offload:
        raise ValueError("--simulate cannot take --cpu-offload: the simulation runs on the CPU, where the host "
                         "memory offloaded states move to is the device itself, so it would count them as GPU "
                         "memory (plan without --simulate for the analytic figures)")
    if args.strategy != "all" and not Strategy.parse(args.strategy).fully_sharded:
        raise ValueError(f"--simulate simulates FSDP2 (zero2, zero3): {args.strategy} has no simulation "
                         "(plan it without --simulate, or with --strategy all)")


def run_plan(args: argparse.Namespace, simulate: Simulator | None) -> int:
    """Arguments in, one report out: a table per strategy, or one JSON object."""
    _refuse_what_simulate_cannot_take(args)
    results = []
    strategies = _strategies(args)
    if left_out := [str(s) for s in STRATEGIES if s not in strategies and args.strategy == "all"]:
        print(f"sharding-lab plan: {', '.join(left_out)} left out: CPU offload and HSDP are FSDP2's "
              f"(planning {', '.join(map(str, strategies))})", file=sys.stderr)
    for strategy in strategies:
        request = _request(args, strategy)
        analytic = plan_analytic(request)
        simulated, unavailable = None, None
        if args.simulate:
            unavailable = simulation_unavailable(request) or (None if simulate else "simulation not available here")
            if unavailable is None:
                simulated = plan_from_simulation(request, simulate(request))
        results.append((analytic, simulated, unavailable, deepspeed_for(request)))
    if args.json:
        print(json.dumps(_report_json(results), indent=2))
    else:
        _render(results)
    return 0


def _deepspeed_json(estimate: DeepSpeedEstimate | None) -> dict | None:
    if estimate is None:
        return None
    return {"stage": estimate.stage, "gpu_bytes": estimate.gpu_bytes, "cpu_bytes": estimate.cpu_bytes,
            "cpu_bytes_means": estimate.cpu_bytes_means, "options": estimate.options,
            "assumes": estimate.assumes, "counts": estimate.counts, "leaves_out": estimate.leaves_out,
            "source": estimate.source}


def _report_json(results) -> dict:
    strategies = {}
    for analytic, simulated, unavailable, deepspeed in results:
        entry: dict = {"analytic": plan_json(analytic), "deepspeed": _deepspeed_json(deepspeed)}
        if simulated is not None:
            entry["simulation"] = plan_json(simulated)
            entry["analytic_error_vs_simulation"] = analytic.peak.total / simulated.peak.total - 1
            entry["categories_vs_simulation"] = _filing(analytic, simulated)
        elif unavailable is not None:
            entry["simulation"] = {"unavailable": unavailable}
        strategies[str(analytic.request.strategy)] = entry
    return {"gb": "1e9 bytes", "wire_bytes_derived_from": WIRE_DERIVATION, "strategies": strategies}


def _gb(num_bytes: int) -> str:
    return f"{num_bytes / GB:.2f} GB ({human_bytes(num_bytes)})"


def _gb_figure(num_bytes: float) -> str:
    """Decimal GB to three significant figures, never an exponent, whole GB kept whole: 1,132.59 GB reads
    "1,133" (`.3g` printed "1.13e+03"), 200.48 GB "200", tiny's 1.6 MB "0.00164" (two decimals: "0.00")."""
    value = num_bytes / GB
    if value == 0:
        return "0"
    magnitude = math.floor(math.log10(float(f"{value:.2e}")))  # of the value as rounded: 999.6 is "1,000"
    return f"{value:,.{max(0, 2 - magnitude)}f}"


def _render(results) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    first = results[0][0].request
    mesh = first.mesh
    gpus = (f"{mesh.replicas:,} replicas x {mesh.shards:,} shards (HSDP)" if mesh.replicas > 1
            else f"{mesh.world_size:,} GPU{'s' if mesh.world_size != 1 else ''}")
    options = [o for on, o in ((first.mixed_precision, "bf16 mixed precision"),
                               (first.activation_checkpointing, "activation checkpointing"),
                               (first.cpu_offload, "CPU offload"),
                               (first.grad_accum_steps > 1, f"{first.grad_accum_steps} micro-batches per step")) if on]
    console.print(
        f"[bold]{first.model.label}[/bold], {results[0][0].num_params_label} params, on {gpus} of "
        f"{first.gpu_memory_gb:g} GB, micro-batch {first.micro_batch} x seq {first.seq}"
        + (f"; {', '.join(options)}" if options else "; fp32")
    )
    for analytic, simulated, unavailable, deepspeed in results:
        _render_strategy(console, Table, analytic, simulated, unavailable, deepspeed)
    if len(results) > 1:
        console.print(_side_by_side(console, Table, results))
    console.print(f"GB = 1e9 bytes. {results[0][0].headroom_statement}. Wire bytes are {WIRE_DERIVATION}.")


def _side_by_side(console, Table, results):
    """The strategies as columns, as `compare`'s table has them: a figure per row reads in 80 columns
    where a column per figure did not ("strate…", a peak of "1.13e+…", "243.2 / GiB")."""
    from sharding_lab.table_widths import fit_words

    analytic, simulated, deepspeed = ([result[i] for result in results] for i in (0, 1, 3))
    summary = Table(title="Side by side (per GPU)")
    summary.add_column("")
    for plan in analytic:
        summary.add_column(str(plan.request.strategy), justify="right")
    summary.add_row("peak GB", *(_gb_figure(plan.peak.total) for plan in analytic))
    if any(simulated or unavailable for _, simulated, unavailable, _ in results):  # --simulate
        summary.add_row("peak GB, simulated", *(_gb_figure(plan.peak.total) if plan else "-" for plan in simulated))
    summary.add_row("fits", *("yes" if plan.fits else "NO" for plan in analytic))
    summary.add_row("largest micro-batch that fits", *(plan.largest_micro_batch_label for plan in analytic))
    # DeepSpeed's figure in decimal GB, as the peak (DeepSpeed prints GiB as "GB"). Its label says what the
    # formula is, so that beside an fp32 peak the gap does not read as activations; broken where it is so
    # that no line of it is wider than "largest micro-batch that fits" (fit_words keeps each line whole).
    summary.add_row("DeepSpeed formula GB (mixed\nprecision, model states only)",
                    *(_gb_figure(d.gpu_bytes) if d else "-" for d in deepspeed))
    # The logical bytes at the API, summed: not `estimate`'s comm/step, the paper's volume, which counts an
    # all-reduce twice.
    summary.add_row("logical bytes per step",
                    *(human_bytes(sum(c.logical_bytes for c in plan.communication)) for plan in analytic))
    summary.add_row("wire bytes per step (derived)",
                    *(human_bytes(sum(c.wire_bytes_derived for c in plan.communication)) for plan in analytic))
    return fit_words(summary, console, whole_cells=True) or summary


def _render_strategy(console, Table, analytic: Plan, simulated: Plan | None, unavailable, deepspeed) -> None:
    request = analytic.request
    table = Table(title=f"{request.strategy}: per-GPU peak ({analytic.peak.moment}, analytic)")
    table.add_column("per GPU")
    table.add_column("analytic", justify="right")
    table.add_column("simulated" if simulated else "simulation", justify="right")
    for category, figure in analytic.peak.categories:
        table.add_row(str(category).replace("_", " "), human_bytes(figure.bytes),
                      human_bytes(simulated.peak[category].bytes) if simulated else "-")
    sim_total = _gb(simulated.peak.total) if simulated else (unavailable or "not asked (--simulate)")
    table.add_row("[bold]total[/bold]", _gb(analytic.peak.total), sim_total, end_section=True)
    if analytic.peak.host_bytes:
        table.add_row("in host memory (CPU offload)", human_bytes(analytic.peak.host_bytes), "-")
    fits = "yes" if analytic.fits else "NO"
    table.add_row("fits", fits, ("yes" if simulated.fits else "NO") if simulated else "-")
    table.add_row("largest micro-batch that fits", analytic.largest_micro_batch_label, "-")
    if deepspeed:
        # In GiB first, as DeepSpeed prints it (its "GB" is 2**30 bytes), so the figure reads as its own.
        table.add_row(f"DeepSpeed ZeRO-{deepspeed.stage} formula (mixed precision, model states only)",
                      f"{deepspeed.gpu_bytes / 2**30:.2f} GiB ({deepspeed.gpu_bytes / GB:.2f} GB)", "",
                      style="dim")
    console.print(table)
    if padding := padding_note(analytic):
        console.print(f"  {padding}.")
    if simulated:
        error = analytic.peak.total / simulated.peak.total - 1
        console.print(f"  analytic vs simulated peak: {error:+.2%}; {simulated.notes[0]}")
        filing = _filing(analytic, simulated)
        console.print(f"  {filing}." if filing else "  analytic and simulated agree category by category.")
    # The op whole (at 80 columns it was cut to "reduce_scatt…"); the other columns wrap to make room.
    comm = Table(title=f"{request.strategy}: communication per optimizer step, per GPU", collapse_padding=True)
    for column in ("collective", "phase", "on", "dtype", "calls", "logical", "wire (derived)"):
        comm.add_column(column, justify="left" if column in ("collective", "phase", "on", "dtype") else "right",
                        no_wrap=column == "collective")
    for c in analytic.communication:
        comm.add_row(c.op, c.phase, f"{c.mesh_dim} x{c.ranks}", c.dtype, "buckets" if c.calls is None else str(c.calls),
                     human_bytes(c.logical_bytes), human_bytes(c.wire_bytes_derived))
    if analytic.communication:
        console.print(comm)
    else:  # FSDP2 on one GPU: an empty table would read as one left unfilled
        console.print(f"  {request.strategy}: communication per optimizer step: {NO_COLLECTIVES}.")
    console.print(f"  [dim]analytic holds for: {analytic.holds}.[/dim]")
    console.print(f"  [dim]analytic leaves out: {'; '.join(analytic.leaves_out)}.[/dim]")
    if simulated:
        console.print(f"  [dim]simulation leaves out: {'; '.join(simulated.leaves_out)}.[/dim]")
    if deepspeed:
        # Under --mixed-precision the plan is FSDP2's, which keeps fp32 shards: DeepSpeed's bytes are not its.
        precision = ("as this plan's is, but FSDP2's keeps fp32 parameters and gradients (4/4/8 B per parameter)"
                     if request.mixed_precision else "not this plan's fp32")
        console.print(f"  [dim]DeepSpeed's formula ({deepspeed.options}) assumes {deepspeed.assumes}, {precision}; "
                      f"it counts {deepspeed.counts}; it leaves out {deepspeed.leaves_out}; "
                      f"{deepspeed.source}.[/dim]")


def _filing(analytic: Plan, simulated: Plan) -> str | None:
    return filing_difference(analytic.peak.bytes_by_category(), simulated.peak.bytes_by_category())


def _mesh(text: str) -> Mesh:
    """--mesh's argument type: a mesh within the GPUs a plan takes, or a usage error naming the flag."""
    try:
        mesh = Mesh.parse(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    if mesh.world_size > BOUNDS.gpus:
        raise argparse.ArgumentTypeError(f"{text!r} is {mesh.world_size:,} GPUs, more than the {BOUNDS.gpus:,} a plan takes")
    return mesh


def register(subparsers, *, simulate: Simulator | None = None) -> None:
    """Add `plan` to the sharding-lab CLI; `simulate` answers --simulate (None: unavailable)."""
    parser = subparsers.add_parser(
        "plan",
        help="will it fit? per-GPU peak memory by category and communication, analytic beside the simulation",
        description="Per-GPU peak memory by category, whether it fits, the largest micro-batch, and per-step "
        "communication, from the torch-free analytic model; --simulate adds the FSDP2 simulation beside it.",
    )
    model = parser.add_argument_group("model: a named size, or its shape")
    model.add_argument("--size", help="a named size (tiny, mini, gpt2-small, ..., 1b, 7b, 70b)")
    model.add_argument("--layers", type=at_most(BOUNDS.layers), help="transformer blocks")
    model.add_argument("--width", type=at_most(BOUNDS.dim), help="embedding width (d_model)")
    model.add_argument("--heads", type=at_most(BOUNDS.dim), help="attention heads (must divide --width)")
    model.add_argument("--vocab", type=at_most(BOUNDS.dim), help="vocabulary size")
    model.add_argument("--seq-len", type=at_most(BOUNDS.dim),
                       help="the shape's longest sequence (its position embedding); default --seq")
    model.add_argument("--tied", action="store_true", help="lm_head shares the embedding's weight")
    gpus = parser.add_mutually_exclusive_group(required=True)
    gpus.add_argument("--gpus", type=at_most(BOUNDS.gpus), help="data-parallel GPUs N (a 1-D mesh)")
    gpus.add_argument("--mesh", type=_mesh, help="HSDP mesh REPLICASxSHARDS, e.g. 8x8")
    parser.add_argument("--gpu-memory-gb", type=at_most(BOUNDS.gpu_memory_gb, positive_float), default=80.0,
                        help="memory per GPU in decimal GB (1e9 B), as nvidia-smi's MiB x 1.048576 / 1000: 85.5 for an "
                             "H100, 150.8 for an H200 (planning with their labels' 80 and 141 leaves about 6.5%% unused); default 80")
    parser.add_argument("--headroom", type=fraction, default=0.1,
                        help="fraction of GPU memory kept free (default 0.1)")
    parser.add_argument("--micro-batch", type=at_most(BOUNDS.micro_batch), default=1,
                        help="sequences per GPU per forward (default %(default)s; `measure`'s is 2)")
    parser.add_argument("--seq", type=at_most(BOUNDS.dim),
                        help="tokens per sequence (default the model's length)")
    parser.add_argument("--strategy", default="zero3", choices=[*NAMES, "all"],
                        help="one strategy, or all side by side (default %(default)s)")
    parser.add_argument("--mixed-precision", action="store_true", help="bf16 compute, fp32 reduction and master")
    parser.add_argument("--activation-checkpointing", action="store_true", help="checkpoint every block")
    parser.add_argument("--cpu-offload", action="store_true",
                        help="FSDP2 CPUOffloadPolicy (zero2, zero3); not with --simulate")
    parser.add_argument("--grad-accum", type=at_most(BOUNDS.grad_accum), default=1,
                        help="micro-batches per optimizer step (default %(default)s)")
    parser.add_argument("--simulate", action="store_true",
                        help="add the FSDP2 simulation of zero2 and zero3 (slow: seconds to a minute)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    parser.set_defaults(func=lambda args: run_plan(args, simulate), exit_without_teardown=True)  # cli.entry
