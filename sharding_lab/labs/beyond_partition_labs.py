"""Labs on how PyTorch and DeepSpeed split model states differently: ZeRO-3's persistence threshold
(small parameters left whole) and ZeRO-1's whole-tensor partition against DeepSpeed's flat one.

PyTorch's side is measured on the `mini` model (untied embedding and head, 25.5% of Ψ each, and block
matrices of at most 16,384 elements); DeepSpeed's side is derived from the same parameter shapes by
the rules in its source (deepspeed/runtime/zero/config.py, parameter_offload.py, stage_1_and_2.py), not
measured: DeepSpeed is not installed here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sharding_lab.analytic import fsdp_shard_numel, zero1_partition
from sharding_lab.labs import charts
from sharding_lab.labs.base import (
    Conditions,
    Lab,
    Measurements,
    Report,
    RunSpec,
    Table,
    Verdict,
    catalog_lab,
    percent,
)
from sharding_lab.labs.model_state_labs import STAGE1_MEASURED_KEY, stage1_runs
from sharding_lab.measurement import Measurement
from sharding_lab.model_config import GPTConfig, parameter_shapes, size_label
from sharding_lab.run_config import RunConfig
from sharding_lab.strategies import Strategy
from sharding_lab.svg import Bar, stacked_bar_chart
from sharding_lab.units import human_bytes

MINI = "mini"  # the model these labs need: its shapes are where the two libraries differ

# DeepSpeed's default `stage3_param_persistence_threshold` (zero/config.py: `param_persistence_threshold:
# int = Field(pp_int(1e5), ..., alias="stage3_param_persistence_threshold")`): a parameter of at most this
# many elements gets `ds_persist = True` and stays whole on every rank (parameter_offload.py,
# mark_persistent_parameters: `if param.ds_numel <= param_threshold`).
DEEPSPEED_PERSISTENCE_THRESHOLD = 100_000


def deepspeed_zero3_params_per_rank(numels: list[int], world_size: int) -> int:
    """Parameter elements one DeepSpeed ZeRO-3 rank holds (derived): its 1/N slice (ds_tensor) of every
    parameter, plus the persistent ones whole. A persistent parameter is partitioned too: the optimizer
    updates the slices, and the whole copy is gathered again after the step (partition_parameters.py)."""
    whole = sum(n for n in numels if n <= DEEPSPEED_PERSISTENCE_THRESHOLD)
    return whole + sum(-(-n // world_size) for n in numels)


def named_numels(m: Measurement) -> list[tuple[str, int]]:
    """(name, elements) of every parameter of the measured model, from its shapes."""
    return [(name, math.prod(shape)) for name, shape in parameter_shapes(GPTConfig(**m.config.model))]


# --- zero3-persistence-threshold ------------------------------------------------------------------------


@dataclass(frozen=True)
class Persistence:
    m: Measurement  # FSDP2 (zero3) on mini
    psi: int
    small: list[tuple[str, int]]  # parameters at or under the threshold
    large: list[str]  # the others' names
    small_elements: int
    large_elements: int
    fsdp_params_per_rank: list[int]  # measured elements of parameter shard per rank (bytes / 4)
    fsdp_expected: int  # the padded 1/N shard, per rank
    gathered_forward: int  # bytes all-gathered in forward (measured)
    deepspeed_per_rank: int  # derived: small params whole + every param's 1/N slice, in elements
    deepspeed_gathered: int  # derived: elements DeepSpeed would all-gather in forward (the large ones)


def persistence_runs(world_size: int) -> tuple[RunSpec, ...]:
    return (
        RunSpec("zero3, mini", RunConfig(Strategy.ZERO3, world_size=world_size, size=MINI), size_fixed=True),
    )


def analyse_persistence(ms: Measurements) -> Persistence:
    m = ms["zero3, mini"]
    numels = named_numels(m)
    small = [(name, n) for name, n in numels if n <= DEEPSPEED_PERSISTENCE_THRESHOLD]
    small_elements = sum(n for _, n in small)
    large_elements = m.num_params - small_elements
    return Persistence(
        m=m,
        psi=m.num_params,
        small=small,
        large=[name for name, n in numels if n > DEEPSPEED_PERSISTENCE_THRESHOLD],
        small_elements=small_elements,
        large_elements=large_elements,
        fsdp_params_per_rank=[b // 4 for b in m.padded_part_bytes("params")],
        fsdp_expected=m.padded_num_params // m.world_size,
        gathered_forward=sum(c.bytes for c in m.collectives(op="all_gather", phase="forward")),
        deepspeed_per_rank=deepspeed_zero3_params_per_rank([n for _, n in numels], m.world_size),
        deepspeed_gathered=large_elements,
    )


def check_persistence(a: Persistence) -> Verdict:
    n = a.m.world_size
    c = Conditions()
    c.require(
        a.m.sharded("params") and all(e == a.fsdp_expected for e in a.fsdp_params_per_rank),
        f"FSDP2: every rank holds 1/{n} of every parameter, the {len(a.small)} small ones too "
        f"({' / '.join(f'{e:,}' for e in a.fsdp_params_per_rank)} elements per rank with padding; "
        f"1/{n} of the padded {a.m.padded_num_params:,} is {a.fsdp_expected:,})",
    )
    full = a.m.padded_full_bytes("params")
    c.require(
        a.gathered_forward == full,
        f"FSDP2: forward all-gathers move every parameter, small ones included ({a.gathered_forward:,} of "
        f"{full:,} B)",
    )
    c.require(
        0 < a.small_elements < a.psi,
        f"on this model {len(a.small)} parameters have at most {DEEPSPEED_PERSISTENCE_THRESHOLD:,} elements "
        f"({a.small_elements:,}, {percent(a.small_elements / a.psi)} of Ψ): DeepSpeed's default would keep them "
        f"whole (derived from the shapes)",
    )
    return c.verdict()


def report_persistence(a: Persistence) -> Report:
    n = a.m.world_size
    largest_small = max(n for _, n in a.small)
    finding = (
        f"FSDP2 has no persistence threshold: on the {a.m.config.size} model at N={n} each rank held "
        f"{a.fsdp_params_per_rank[0]:,} parameter elements, 1/{n} of every tensor, and forward all-gathered all "
        f"{human_bytes(a.gathered_forward)} of them. DeepSpeed's ZeRO-3 keeps any parameter of at most "
        f"stage3_param_persistence_threshold = 1e5 elements whole on every rank, so it is gathered before no "
        f"use (only once per step, after the optimizer updates each rank's slice of it; its gradient and Adam "
        f"state stay partitioned): here that "
        f"is {len(a.small)} of {len(a.small) + len(a.large)} parameters (every one but {', '.join(a.large)}: the "
        f"largest has {largest_small:,} elements), {percent(a.small_elements / a.psi)} of Ψ, "
        f"so a DeepSpeed rank would hold {a.deepspeed_per_rank:,} parameter elements (the small ones whole, "
        f"beside its 1/{n} slice of every parameter, theirs included) "
        f"({percent(a.deepspeed_per_rank / a.psi)} of Ψ, against FSDP2's {percent(a.fsdp_expected / a.psi)}) and "
        f"gather only {', '.join(a.large)} before each use ({percent(a.deepspeed_gathered / a.psi)} of Ψ; derived from the "
        f"shapes, not measured). At real widths only biases and norms fall under 1e5: {size_label('gpt2-small')}'s are "
        f"{percent(small_share('gpt2-small'))} of Ψ."
    )
    rows = tuple(
        (
            name,
            numel,
            f"whole + its 1/{n} slice" if numel <= DEEPSPEED_PERSISTENCE_THRESHOLD else f"1/{n} per rank",
            deepspeed_zero3_params_per_rank([numel], n),
            fsdp_shard_numel(shape, n),
        )
        for name, shape in parameter_shapes(GPTConfig(**a.m.config.model))
        if (numel := math.prod(shape)) and (not name.startswith("blocks.") or name.startswith("blocks.0."))
    )
    chart = stacked_bar_chart(
        f"Parameter elements per rank (N={n}, {a.m.config.size})",
        [
            Bar("FSDP2 (measured)", {"sharded": a.fsdp_params_per_rank[0]}),
            Bar(
                "DeepSpeed ZeRO-3, threshold 1e5 (derived)",
                {
                    "sharded": a.deepspeed_per_rank - a.small_elements,
                    "persistent (whole)": a.small_elements,
                },
            ),
        ],
        ["sharded", "persistent (whole)"],
        colours={
            "sharded": charts.MEMORY_COLOURS["params"],
            "persistent (whole)": charts.MEMORY_COLOURS["grads"],
        },
        format_value=lambda v: f"{v:,.0f} elements",
    )
    return Report(
        finding,
        Table(
            (
                "parameter (blocks.0 shown for every block)",
                "elements",
                "DeepSpeed ZeRO-3 (threshold 1e5, derived)",
                "DeepSpeed elements per rank (derived)",
                "FSDP2 elements per rank (padded shard)",
            ),
            rows,
        ),
        {"params_per_rank": chart},
    )


def persistent_share(config: GPTConfig) -> float:
    """The share of Ψ in parameters of at most the threshold's elements: what DeepSpeed's ZeRO-3 keeps
    gathered on every rank (derived from the shapes)."""
    numels = [math.prod(shape) for _, shape in parameter_shapes(config)]
    return sum(n for n in numels if n <= DEEPSPEED_PERSISTENCE_THRESHOLD) / sum(numels)


def small_share(size: str) -> float:
    """`persistent_share` for a named size."""
    from sharding_lab.model_config import config_for

    return persistent_share(config_for(size))


# --- zero1-whole-tensors ---------------------------------------------------------------------------------


def greedy_owners(numels: list[tuple[str, int]], world_size: int) -> list[list[str]]:
    """The tensors each rank owns under ZeroRedundancyOptimizer's rule (as analytic.zero1_partition):
    largest first, each to the rank with the fewest elements so far (the lowest on a tie)."""
    owned, names = [0] * world_size, [[] for _ in range(world_size)]
    for name, numel in sorted(numels, key=lambda item: item[1], reverse=True):
        rank = owned.index(min(owned))
        owned[rank] += numel
        names[rank].append(name)
    return names


def deepspeed_flat_partition(psi: int, world_size: int) -> list[int]:
    """Elements per rank of DeepSpeed's ZeRO-1/2 partition: one flat buffer padded to a multiple of
    2·N elements (nccl_start_alignment_factor = 2 times the data-parallel size), cut into N equal parts."""
    alignment = 2 * world_size
    return [-(-psi // alignment) * alignment // world_size] * world_size


@dataclass(frozen=True)
class WholeTensors:
    real: Measurement  # zero1 on mini, real ranks at the lab's N
    view: Measurement  # zero1 on mini at 8 ranks, rank 0's view
    measured: list[int]  # optimizer elements per rank (bytes / 8), real ranks
    expected: list[int]  # by the greedy rule
    flat: list[int]  # DeepSpeed's flat partition (derived)
    owners: list[list[str]]  # tensors per rank by the rule, real ranks
    view_measured: int  # rank 0's optimizer elements at 8 ranks
    view_expected: int
    view_flat: int
    view_owner: list[str]  # what rank 0 owns at 8 ranks


def whole_tensor_runs(world_size: int) -> tuple[RunSpec, ...]:
    at_scale = next(spec for spec in stage1_runs(world_size) if spec.key == STAGE1_MEASURED_KEY)
    real = RunConfig(Strategy.ZERO1, world_size=world_size, size=MINI)
    return (RunSpec("zero1, mini", real, size_fixed=True), at_scale)


def analyse_whole_tensors(ms: Measurements) -> WholeTensors:
    real, view = ms["zero1, mini"], ms[STAGE1_MEASURED_KEY]
    numels, view_numels = named_numels(real), named_numels(view)
    return WholeTensors(
        real=real,
        view=view,
        measured=[b // 8 for b in real.part_bytes("optimizer")],
        expected=zero1_partition([n for _, n in numels], real.world_size),
        flat=deepspeed_flat_partition(real.num_params, real.world_size),
        owners=greedy_owners(numels, real.world_size),
        view_measured=view.part_bytes("optimizer")[0] // 8,
        view_expected=zero1_partition([n for _, n in view_numels], view.world_size)[0],
        view_flat=deepspeed_flat_partition(view.num_params, view.world_size)[0],
        view_owner=greedy_owners(view_numels, view.world_size)[0],
    )


def check_whole_tensors(a: WholeTensors) -> Verdict:
    n = a.real.world_size
    c = Conditions()
    c.require(
        a.measured == a.expected,
        f"zero1 at N={n}: each rank's Adam state covers the whole tensors the greedy rule gives it "
        f"({' / '.join(f'{e:,}' for e in a.measured)} elements; the rule: {' / '.join(f'{e:,}' for e in a.expected)})",
    )
    c.require(
        sum(a.measured) == a.real.num_params,
        f"zero1 at N={n}: the ranks' shares add up to Ψ = {a.real.num_params:,} (nothing replicated)",
    )
    c.require(
        a.view_measured == a.view_expected and a.view_measured > a.view_flat,
        f"zero1 at N={a.view.world_size} (rank 0's view): {a.view_measured:,} elements ({', '.join(a.view_owner)}), "
        f"as the rule gives ({a.view_expected:,}), {a.view_measured / a.view_flat:.2f}x DeepSpeed's flat "
        f"{a.view_flat:,}",
    )
    return c.verdict()


def report_whole_tensors(a: WholeTensors) -> Report:
    n, v = a.real.world_size, a.view.world_size
    fullest = max(a.measured)
    finding = (
        f"PyTorch's ZeroRedundancyOptimizer partitions whole tensors: on the {a.real.config.size} model at N={n} "
        f"the ranks held Adam state for {' / '.join(f'{e:,}' for e in a.measured)} elements (the greedy rule, "
        f"largest tensor first to the emptiest rank, gives exactly that; the fullest rank "
        f"{fullest / a.flat[0]:.3f}x an even share), and at N={v} rank 0 held {a.view_measured:,}: "
        f"{', '.join(a.view_owner)} alone, {a.view_measured / a.view_flat:.2f}x the {a.view_flat:,} an even split "
        f"gives (a rank view: rank 0's real tensors in one process). DeepSpeed's ZeRO-1 and ZeRO-2 flatten every "
        f"parameter into one buffer, pad it to a multiple of 2N elements and cut it into N equal parts, splitting "
        f"tensors across ranks: {a.flat[0]:,} elements per rank at N={n}, {a.view_flat:,} at N={v} "
        f"(derived from its partition rule)."
    )
    rows = tuple(
        (
            f"N={n}, rank {rank}",
            a.measured[rank],
            a.expected[rank],
            a.flat[rank],
            len(a.owners[rank]),
            ", ".join(a.owners[rank][:3]) + (" ..." if len(a.owners[rank]) > 3 else ""),
        )
        for rank in range(n)
    ) + (
        (
            f"N={v}, rank 0 (view)",
            a.view_measured,
            a.view_expected,
            a.view_flat,
            len(a.view_owner),
            ", ".join(a.view_owner),
        ),
    )
    bars = [
        Bar(f"N={n} rank {rank} PyTorch (measured)", {"Adam state": a.measured[rank]}) for rank in range(n)
    ]
    bars += [Bar(f"N={n} each rank DeepSpeed (derived)", {"Adam state": a.flat[0]})]
    bars += [
        Bar(f"N={v} rank 0 PyTorch (measured)", {"Adam state": a.view_measured}),
        Bar(f"N={v} each rank DeepSpeed (derived)", {"Adam state": a.view_flat}),
    ]
    chart = stacked_bar_chart(
        "Adam state per rank in elements: whole tensors against a flat split",
        bars,
        ["Adam state"],
        colours={"Adam state": charts.MEMORY_COLOURS["optimizer"]},
        format_value=lambda value: f"{value:,.0f}",
    )
    return Report(
        finding,
        Table(
            (
                "rank",
                "Adam state elements (measured)",
                "greedy whole-tensor rule",
                "DeepSpeed flat partition (derived)",
                "tensors owned",
                "largest owned",
            ),
            rows,
        ),
        {"optimizer_per_rank": chart},
    )


PARTITION_LABS: tuple[Lab, ...] = (
    catalog_lab(
        "zero3-persistence-threshold",
        persistence_runs,
        analyse_persistence,
        check_persistence,
        report_persistence,
    ),
    catalog_lab(
        "zero1-whole-tensors",
        whole_tensor_runs,
        analyse_whole_tensors,
        check_whole_tensors,
        report_whole_tensors,
    ),
)
