"""Rich tables for measurements: one strategy in detail, or every strategy side by side."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from sharding_lab.measurement import NO_NCCL_OVERLAP, Measurement, RankMemory
from sharding_lab.planner import TRACKER_GRADIENT_FILING
from sharding_lab.strategies import OPS, PHASES
from sharding_lab.units import human_bytes

if TYPE_CHECKING:
    from sharding_lab.run_config import RunConfig

# (label, RankMemory field, the part of the ZeRO paper's model (sharding_lab.analytic) to show beside it)
_MEMORY_ROWS: tuple[tuple[str, str, str | None], ...] = (
    ("parameters", "params_bytes", "params"),
    ("gradients", "grads_bytes", "grads"),
    ("optimizer state", "optimizer_bytes", "optimizer"),
    ("model states", "model_states_bytes", "total"),
    ("FSDP padding (model states)", "padding_bytes", None),
    ("persistent (between steps)", "persistent_bytes", None),
    ("peak", "peak_bytes", None),
    ("gathered params after forward", "unsharded_params_after_forward_bytes", None),
    ("gathered params, most at once", "unsharded_params_peak_bytes", None),
    ("gathered params + all-gather buffers, most at once", "gathered_with_buffers_peak_bytes", None),
)


# Shown after "peak" on CUDA, where the caching allocator reports its own peak beside the tracker's.
_CUDA_ROW = ("peak, CUDA allocator (max_memory_allocated)", "cuda_max_memory_allocated", None)
# What the issue measured on one H200 (gpt2-medium, 1 rank, DDP with bf16 mixed precision): the tracker's
# peak against torch.cuda.max_memory_allocated.
DDP_MIXED_PRECISION_SEEN = "on one H200, gpt2-medium at 1 rank: 8.90 GiB by the tracker against 11.23 GiB by the allocator"


def _field(rank: RankMemory, name: str) -> int:
    return getattr(rank, name)


# A per-rank table's room: its label column and the predicted one take about this much of the width,
# and a cell such as "1023.9 KiB" with its padding and border this much. Past the columns that fit, a
# table no longer reads (a 64-rank run drew 64 columns one character wide).
_FIXED_WIDTH, _CELL_WIDTH = 43, 13


def rank_columns_that_fit(width: int) -> int:
    """How many rank columns a per-rank table shows on a console `width` characters wide (at least 3:
    rank 0, least and most)."""
    return max(3, (width - _FIXED_WIDTH) // _CELL_WIDTH)


@dataclass(frozen=True)
class RankColumn:
    """One column of a per-rank table: its header and a cell per row."""

    header: str
    cells: tuple[str, ...]


@dataclass(frozen=True)
class RankColumns:
    """The columns a per-rank table shows for its ranks."""

    columns: tuple[RankColumn, ...]
    ranks: int
    # Summarized (too many distinct ranks: rank 0 beside each row's least and most): for each row whose
    # ranks differ, (row index, which ranks hold its least and its most). Empty when each column is ranks.
    where: tuple[tuple[int, str], ...] = ()

    @property
    def summarized(self) -> bool:
        return bool(self.where)  # more distinct ranks than columns means some row differs

    def notes(self, row_labels: Sequence[str]) -> list[str]:
        """What the reader needs to know when the columns are fewer than the ranks (nothing when they are not)."""
        if self.summarized:
            return [f"{self.ranks} ranks, too many distinct to show each: rank 0 beside each row's least and most "
                    "over the ranks; --json gives every rank's figures."] + [
                    f"{row_labels[row]}: {where}" for row, where in self.where]
        if len(self.columns) < self.ranks:
            return [f"{self.ranks} ranks in {len(self.columns)} column(s): ranks whose figures are all equal share one."]
        return []


def rank_label(ranks: Sequence[int]) -> str:
    """Rank numbers in runs: [0] -> 'rank 0', [0, 1, 2, 5] -> 'ranks 0-2, 5'."""
    runs: list[list[int]] = []
    for rank in sorted(ranks):
        if runs and rank == runs[-1][-1] + 1:
            runs[-1].append(rank)
        else:
            runs.append([rank])
    text = ", ".join(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs)
    return f"rank{'s' if len(ranks) > 1 else ''} {text}"


def rank_columns(figures: dict[int, Sequence[int | None]], max_columns: int) -> RankColumns:
    """The columns of a table with a row per figure, for `figures` (each rank's value of every row,
    in bytes; None shows as '-').

    Ranks whose figures are all equal share one column ("ranks 0-6"), so nothing is hidden. When more
    than `max_columns` distinct columns remain, rank 0 stands beside each row's least and most value,
    and `where` names, for each row whose ranks differ, the ranks that hold them."""
    groups: dict[tuple, list[int]] = {}
    for rank, values in figures.items():
        groups.setdefault(tuple(values), []).append(rank)
    if len(groups) <= max_columns:
        columns = [RankColumn(rank_label(ranks), tuple(human_bytes(v) for v in values)) for values, ranks in groups.items()]
        return RankColumns(tuple(columns), len(figures))
    first = min(figures)
    rows = range(len(figures[first]))
    least = [_extreme(figures, row, min) for row in rows]
    most = [_extreme(figures, row, max) for row in rows]
    columns = (
        RankColumn(rank_label([first]), tuple(human_bytes(v) for v in figures[first])),
        RankColumn("least", tuple(human_bytes(value) for value, _ in least)),
        RankColumn("most", tuple(human_bytes(value) for value, _ in most)),
    )
    # The cells hold values only, to fit; which ranks hold them goes under the table, for the rows that differ.
    where = tuple((row, f"least on {_ranks_text(least[row][1])}, most on {_ranks_text(most[row][1])}")
                  for row in rows if least[row][0] != most[row][0])
    return RankColumns(columns, len(figures), where=where)


def _extreme(figures: dict[int, Sequence[int | None]], row: int,
             pick: Callable[[Iterable[int]], int]) -> tuple[int | None, list[int]]:
    """A row's least or most value over the ranks that report it, and the ranks that hold it."""
    present = {rank: values[row] for rank, values in figures.items() if values[row] is not None}
    if not present:
        return None, []
    value = pick(present.values())
    return value, [rank for rank, v in present.items() if v == value]


def _ranks_text(ranks: list[int]) -> str:
    label = rank_label(ranks)
    return label if label.count(",") < 3 else f"{len(ranks)} ranks"  # at most three runs of ranks, or a count


def _memory_rows(m: Measurement) -> tuple[tuple[str, str, str | None], ...]:
    if all(rank.cuda_max_memory_allocated is None for rank in m.ranks):
        return _MEMORY_ROWS
    at = [name for _, name, _ in _MEMORY_ROWS].index("peak_bytes") + 1
    return (*_MEMORY_ROWS[:at], _CUDA_ROW, *_MEMORY_ROWS[at:])


def allocator_lines(m: Measurement) -> list[str]:
    """On CUDA: rank 0's peak by the allocator beside the tracker's, what lies between them, and what the
    tracker cannot see under DDP's mixed precision. Nothing on CPU, which has no allocator figure."""
    rank = m.ranks[0]
    cuda = rank.cuda_max_memory_allocated
    if cuda is None:
        return []
    gap = cuda - rank.peak_bytes
    side = "not in the tracker's categories" if gap >= 0 else "counted by the tracker beyond the allocator's peak"
    lines = [
        f"rank 0's peak: {human_bytes(cuda)} by the CUDA caching allocator "
        f"(torch.cuda.max_memory_allocated), {human_bytes(rank.peak_bytes)} by the tracker; "
        f"{human_bytes(abs(gap))} ({abs(gap) / cuda:.1%} of the allocator's) {side}. The allocator rounds "
        f"each block up (to 512 B), and counts what no dispatch mode sees."
    ]
    if m.config.mixed_precision and m.config.strategy.uses_ddp:
        copies = 2 * m.config.num_params
        lines.append(
            f"DDP's mixed precision makes and frees its bf16 parameter copies (2 B per parameter, "
            f"{human_bytes(copies)} here) by resizing their storage, which is no op a dispatch mode sees, so "
            f"the tracker's figures do not hold for it ({DDP_MIXED_PRECISION_SEEN}). Read the "
            f"allocator's peak."
        )
    return lines


def _title(m: Measurement) -> str:
    c = m.config
    extras = []
    if c.strategy.fully_sharded:
        extras.append(f"reshard after forward {'on' if c.reshard_after_forward else 'off'}")
        extras.append(f"prefetch {'on' if c.prefetch else 'off'}")
    extras += _option_phrases([c])
    tied = " with a tied head" if c.model.get("tied") else ""
    return (
        f"{c.strategy} on {c.world_size} rank{'s' if c.world_size != 1 else ''} ({c.backend}, {c.device}), {c.size}{tied}: "
        f"{c.num_params:,} params, {c.n_blocks} blocks, micro-batch {c.batch_size_per_rank} x seq {c.seq_len}"
        + (f"; {', '.join(extras)}" if extras else "")
    )


def _titled(title: str, console: Console) -> Table:
    """A table at least as wide as its title where the console has room: grouped rank columns can make a
    table narrower than its title, which rich would then wrap into a tall, thin block."""
    return Table(title=title, min_width=min(len(title), console.width))


def render_measurement(m: Measurement, console: Console | None = None) -> None:
    console = console or Console()
    predicted = m.predicted.model_states_bytes_per_rank

    rows = _memory_rows(m)
    category_names = [name for name in m.ranks[0].categories if any(rank.categories[name] for rank in m.ranks)]
    # One grouping for both tables, so their columns are the same ranks.
    shown = rank_columns({
        rank.rank: [_field(rank, name) for _, name, _ in rows] + [rank.categories[name] for name in category_names]
        for rank in m.ranks
    }, rank_columns_that_fit(console.width))
    columns = shown.columns

    memory = _titled(_title(m) + "; measured, and predicted by the ZeRO paper's model (derived)", console)
    memory.add_column("per rank")
    for column in columns:
        memory.add_column(column.header, justify="right", no_wrap=True)
    memory.add_column("ZeRO paper", justify="right", style="cyan", no_wrap=True)
    for row, (label, _, part) in enumerate(rows):
        memory.add_row(label, *(column.cells[row] for column in columns), human_bytes(predicted.get(part)) if part else "")
    console.print(memory)
    for line in paper_lines({str(m.config.strategy): m}):
        console.print(f"  [dim]{escape(line)}[/dim]")

    categories = _titled("Peak memory by category (breakdown of the peak moment, measured by the tracker)", console)
    categories.add_column("category")
    for column in columns:
        categories.add_column(column.header, justify="right", no_wrap=True)
    for row, name in enumerate(category_names, start=len(rows)):
        categories.add_row(name, *(column.cells[row] for column in columns))
    console.print(categories)
    for note in shown.notes([label for label, _, _ in rows] + category_names):
        console.print(f"  [dim]{note}[/dim]")
    if m.config.strategy.fully_sharded:
        console.print(f"  [dim]Unsharded gradients: counted by {TRACKER_GRADIENT_FILING}.[/dim]")

    comm = Table(title="Collectives in one step (rank 0); wire bytes derived from ring formulas over each "
                 "collective's group")
    comm.add_column("op", no_wrap=True)
    for column in ("mesh dim", f"count ({' / '.join(PHASES)})", "bytes", "wire bytes (derived)"):
        comm.add_column(column, justify="right")
    totals = m.comm.totals()
    for op in OPS:
        ops = m.collectives(op=op)
        if not ops:
            continue
        by_phase = " / ".join(str(sum(1 for c in ops if c.phase == phase)) for phase in PHASES)
        total = totals[op]
        dims = ", ".join(dict.fromkeys(f"{c.mesh_dim} ({c.group_size})" for c in ops if c.mesh_dim)) or "-"
        comm.add_row(op, dims, f"{total.count} ({by_phase})", human_bytes(total.bytes), human_bytes(total.wire_bytes_derived))
    console.print(comm)
    _print_footer(m, console)


def paper_lines(by_strategy: dict[str, Measurement]) -> list[str]:
    """What the ZeRO paper's figures count, and where PyTorch's implementation (the engine's) departs from
    them for each strategy: the text beside a table that shows those figures."""
    sharing: dict[str, list[str]] = {}
    for name, m in by_strategy.items():
        sharing.setdefault(m.predicted.accounting, []).append(name)
    # One accounting holds for every column; where they differ (compare --replicas runs DDP's strategies
    # without HSDP), each line names the columns it holds for.
    lines = [f"The ZeRO paper's model, derived for "
             f"{'this run' if len(sharing) == 1 else ', '.join(names)}: {accounting}."
             for accounting, names in sharing.items()]
    return lines + [f"{name}, where PyTorch differs from the paper: {m.predicted.differences}"
                    for name, m in by_strategy.items() if m.predicted.differences]


def _print_footer(m: Measurement, console: Console) -> None:
    predicted_comm = m.predicted.communication_bytes_per_step
    line = f"step time {step_time_text(m)}; bytes per step {human_bytes(m.comm.bytes_per_step)}"
    if predicted_comm:  # like with like: the paper counts an all-reduce twice (a reduce-scatter and an all-gather)
        # Ψ counts elements, so "3Ψ = S" names one element size: fp32's 4 B, or each collective's where they
        # differ (bf16 all-gathers beside fp32 reductions: 3Ψ is then neither 3Ψ x 2 B nor 3Ψ x 4 B).
        sizes = "" if predicted_comm["bytes"] == 4 * predicted_comm["elements"] else " ({} per element)".format(
            ", ".join(dict.fromkeys(f"{c['op']} {c['bytes'] // c['elements']} B"
                                    for c in predicted_comm.get("collectives", ()) if c["elements"])))
        line += (f"; counted as the ZeRO paper counts (an all-reduce twice) {human_bytes(m.comm.bytes_per_step_paper)}, "
                 f"against its {predicted_comm['multiple_of_params']}Ψ{sizes} = {human_bytes(predicted_comm['bytes'])}")
    console.print(line)
    for allocator_line in allocator_lines(m):
        console.print(allocator_line)
    parity = m.gradient_parity
    if parity:
        verdict = "[green]holds[/green]" if parity.holds else "[red]FAILS[/red]"
        console.print(
            f"gradient parity {verdict}: max relative error {parity.max_relative_error:.2e} "
            f"({parity.worst_parameter}), tolerance {parity.tolerance:.0e}"
        )
    if m.overlap:
        console.print(
            f"communication overlapped compute (profiler, measured): {m.overlap.overlapped_fraction_of_comm:.0%} of "
            f"{m.overlap.comm_kernel_us / 1000:.2f} ms of NCCL kernels"
        )
    elif m.config.device.startswith("cuda"):
        console.print(f"overlap not measured: {NO_NCCL_OVERLAP[m.config.backend]}")


def step_time_text(m: Measurement) -> str:
    """The median plain step, or why there is none; a rank view's says its collectives moved nothing."""
    if m.step_time_s is None:
        return "not timed (timed_steps=0)"
    text = f"{m.step_time_s * 1000:.1f} ms"
    return text + " (rank view: collectives answered without moving data)" if m.config.placement == "rank-view" else text


def _option_phrases(configs: list[RunConfig]) -> list[str]:
    """The options the runs were measured with, as title phrases; one that only some of them took (compare
    gives FSDP2's CPU offload and HSDP to the FSDP strategies only) names those."""

    def took(applies: Callable[[RunConfig], bool], phrase: Callable[[RunConfig], str]) -> list[str]:
        runs = [run for run in configs if applies(run)]
        if not runs:
            return []
        names = "" if len(runs) == len(configs) else f" for {', '.join(str(run.strategy) for run in runs)}"
        return [phrase(runs[0]) + names]  # from a run that took it: compare's DDP runs have no HSDP mesh

    return [
        *took(lambda run: run.mixed_precision, lambda run: "bf16 params, fp32 reduce"),
        *took(lambda run: run.activation_checkpointing, lambda run: "activation checkpointing"),
        *took(lambda run: run.cpu_offload,
              lambda run: "CPU offload" + (" (the device is the host: nothing moves)" if run.device == "cpu" else "")),
        *took(lambda run: run.replicas > 1,
              lambda run: f"HSDP {run.replicas} replicas x {run.world_size // run.replicas} shards"),
        *took(lambda run: run.grad_accum_steps > 1, lambda run: f"{run.grad_accum_steps} micro-batches per step"),
    ]


def render_comparison(by_strategy: dict[str, Measurement], console: Console | None = None) -> None:
    console = console or Console()
    configs = [m.config for m in by_strategy.values()]
    first = configs[0]
    options = "".join(f", {phrase}" for phrase in _option_phrases(configs))
    table = Table(
        title=f"Strategies side by side: {first.size} ({first.num_params:,} params), "
        f"micro-batch {first.batch_size_per_rank} x seq {first.seq_len}, "
        f"{first.world_size} rank{'s' if first.world_size != 1 else ''}, {first.backend}{options}; rank 0, measured "
        "(predicted by the ZeRO paper's model)"
    )
    table.add_column("")
    for strategy in by_strategy:
        table.add_column(strategy, justify="right")

    rows = _memory_rows(next(iter(by_strategy.values())))
    for label, name, part in rows:
        if name in ("padding_bytes", "persistent_bytes", "unsharded_params_peak_bytes",
                    "gathered_with_buffers_peak_bytes"):
            continue
        cells = []
        for m in by_strategy.values():
            value = human_bytes(_field(m.ranks[0], name))
            predicted = m.predicted.model_states_bytes_per_rank.get(part) if part else None
            cells.append(f"{value} ({human_bytes(predicted)})" if predicted is not None else value)
        table.add_row(label, *cells)
    for op in OPS:
        table.add_row(f"{op} count", *(str(m.comm.totals()[op].count) for m in by_strategy.values()))
    table.add_row("bytes per step", *(human_bytes(m.comm.bytes_per_step) for m in by_strategy.values()))
    table.add_row(
        "wire bytes per step (derived)",
        *(human_bytes(m.comm.wire_bytes_per_step_derived) for m in by_strategy.values()),
    )
    table.add_row("step time", *(step_time_text(m) for m in by_strategy.values()))
    if any(m.gradient_parity for m in by_strategy.values()):  # --check-gradients
        table.add_row("gradient parity (max rel. error)", *(_parity_cell(m) for m in by_strategy.values()))
    console.print(table)
    for line in paper_lines(by_strategy):
        console.print(f"  [dim]{escape(line)}[/dim]")


def _parity_cell(m: Measurement) -> str:
    parity = m.gradient_parity
    if not parity:
        return "-"
    verdict = "holds" if parity.holds else "[red]FAILS[/red]"
    return f"{verdict} ({parity.max_relative_error:.1e})"
