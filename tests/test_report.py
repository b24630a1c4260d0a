"""The measurement report's per-rank columns: ranks with equal figures share one, and past the distinct
ranks that fit the console's width each row shows rank 0 beside its least and most."""

from __future__ import annotations

from dataclasses import replace

import pytest
from rich.console import Console
from sharding_measurements import typed

from sharding_lab.report import (
    RankColumn,
    rank_columns,
    rank_columns_that_fit,
    rank_label,
    render_comparison,
    render_measurement,
)
from sharding_lab.units import human_bytes


def test_rank_labels_name_runs_of_ranks():
    assert rank_label([3]) == "rank 3"
    assert rank_label([0, 1]) == "ranks 0-1"
    assert rank_label([7, 0, 2, 1, 5, 8]) == "ranks 0-2, 5, 7-8"


def test_a_wider_console_fits_more_rank_columns_and_the_narrowest_still_three():
    assert rank_columns_that_fit(80) == 3  # rank 0, least, most
    assert rank_columns_that_fit(20) == 3
    assert rank_columns_that_fit(200) == (200 - 43) // 13 == 12


def test_ranks_with_equal_figures_share_a_column_and_others_keep_their_own():
    # FSDP's last rank is short of the padded shard: its parameters differ, the others' are alike.
    figures = {rank: [1024, 2048 if rank < 3 else 1536, None] for rank in range(4)}
    shown = rank_columns(figures, max_columns=3)
    assert shown.columns == (
        RankColumn("ranks 0-2", ("1.0 KiB", "2.0 KiB", "-")),
        RankColumn("rank 3", ("1.0 KiB", "1.5 KiB", "-")),
    )
    assert not shown.summarized
    assert shown.notes(["a", "b", "c"]) == ["4 ranks in 2 column(s): ranks whose figures are all equal share one."]


def test_every_rank_distinct_within_a_screenful_keeps_a_column_each():
    figures = {rank: [1000 + rank] for rank in range(5)}
    shown = rank_columns(figures, max_columns=5)
    assert [c.header for c in shown.columns] == [f"rank {r}" for r in range(5)]
    assert shown.notes(["a"]) == []


def test_past_a_screenful_of_distinct_ranks_each_row_gives_its_least_and_most_and_who_has_it():
    ranks = 9
    # Row 0 differs on every rank; row 1 is the same everywhere; row 2 is least on ranks 4 and 5;
    # row 3 alternates, so its ranks fall in more runs than a note names (a count instead).
    figures = {rank: [100 * (rank + 1), 7, 0 if rank in (4, 5) else 9, rank % 2] for rank in range(ranks)}
    shown = rank_columns(figures, max_columns=ranks - 1)
    assert shown.summarized
    assert shown.columns == (
        RankColumn("rank 0", ("100 B", "7 B", "9 B", "0 B")),
        RankColumn("least", ("100 B", "7 B", "0 B", "0 B")),
        RankColumn("most", ("900 B", "7 B", "9 B", "1 B")),
    )
    notes = shown.notes(["row a", "row b", "row c", "row d"])
    assert "9 ranks, too many distinct to show each" in notes[0] and "--json" in notes[0]
    assert notes[1:] == [  # row b is the same on every rank: nothing to say of it
        "row a: least on rank 0, most on rank 8",
        "row c: least on ranks 4-5, most on ranks 0-3, 6-8",
        "row d: least on 5 ranks, most on 4 ranks",
    ]


@pytest.mark.slow
def test_a_64_rank_report_stays_readable_on_an_80_column_terminal():
    # A real 2-rank zero3 measurement, its ranks repeated as 64: all equal but the last rank's padding.
    measured = typed()["zero3 padded"]
    zero, last = measured.ranks
    ranks = tuple(replace(zero if r < 63 else last, rank=r) for r in range(64))
    console = Console(record=True, width=80)
    render_measurement(replace(measured, ranks=ranks, config=replace(measured.config, world_size=64)), console)
    text = console.export_text()
    assert "ranks 0-62" in text and "rank 63" in text and "rank 1 " not in text
    assert "64 ranks in 2 column(s): ranks whose figures are all equal share one." in text
    # Every figure is still printed whole: the columns are wide enough for "234.8 KiB"-sized cells.
    params = [line for line in text.splitlines() if line.startswith("│ parameters")][0]
    cells = [cell.strip() for cell in params.split("│")[2:-1]]
    assert cells[:2] == [human_bytes(zero.params_bytes), human_bytes(last.params_bytes)]


@pytest.mark.slow
def test_four_distinct_ranks_show_each_on_a_wide_console_and_least_and_most_on_an_80_column_one():
    measured = typed()["zero3"]
    zero = measured.ranks[0]
    ranks = tuple(replace(zero, rank=r, params_bytes=zero.params_bytes + 512 * r) for r in range(4))
    four = replace(measured, ranks=ranks, config=replace(measured.config, world_size=4))
    wide = Console(record=True, width=200)
    render_measurement(four, wide)
    header = [line for line in wide.export_text().splitlines() if "┃ per rank" in line][0]
    assert [cell.strip() for cell in header.split("┃")[2:-2]] == ["rank 0", "rank 1", "rank 2", "rank 3"]

    narrow = Console(record=True, width=80)
    render_measurement(four, narrow)
    text = narrow.export_text()
    params = [line for line in text.splitlines() if line.startswith("│ parameters")][0]
    assert [cell.strip() for cell in params.split("│")[2:-2]] == [
        human_bytes(zero.params_bytes), human_bytes(zero.params_bytes), human_bytes(zero.params_bytes + 3 * 512),
    ]
    assert "4 ranks, too many distinct to show each" in text
    assert "  parameters: least on rank 0, most on rank 3\n" in text


@pytest.mark.slow
def test_the_predicted_column_is_the_zero_papers_and_the_text_says_where_pytorch_differs():
    # zero2 on tiny at 2 ranks: FSDP2 keeps a parameter shard, 60,096 x 4 B / 2 = 117.4 KiB, where the
    # paper's stage 2 keeps them all, 60,096 x 4 B = 234.8 KiB; the text must say why they differ.
    runs = typed()
    console = Console(record=True, width=400)
    render_measurement(runs["zero2"], console)
    text = console.export_text()
    assert "measured, and predicted by the ZeRO paper's model (derived)" in text
    header = [line for line in text.splitlines() if "┃ per rank" in line][0]
    assert header.split("┃")[-2].strip() == "ZeRO paper"
    params = [line for line in text.splitlines() if line.startswith("│ parameters")][0]
    assert [cell.strip() for cell in params.split("│")[2:-1]] == ["117.4 KiB", "234.8 KiB"]
    zero2_differs = ("zero2, where PyTorch differs from the paper: FSDP2 with reshard_after_forward=False keeps "
                     "only a parameter shard between steps")
    assert zero2_differs in text
    assert "The ZeRO paper's model, derived for this run: model states: fp32 Adam (4+4+8 bytes per parameter)" in text

    console = Console(record=True, width=400)
    render_comparison({name: runs[name] for name in ("ddp", "zero2")}, console)
    text = console.export_text()
    assert "rank 0, measured (predicted by the ZeRO paper's model)" in text
    assert zero2_differs in text
    assert "ddp, where" not in text  # DDP is the paper's baseline: nothing to explain


@pytest.mark.slow
def test_the_footer_counts_bytes_as_the_paper_does_before_setting_them_beside_its_figure():
    # DDP on tiny: one all-reduce of 60,096 fp32 gradients (234.8 KiB); the paper counts an all-reduce
    # as a reduce-scatter and an all-gather, 2Ψ = 2 x 60,096 x 4 B = 469.5 KiB.
    ddp = typed()["ddp"]
    assert [(c.op, c.bytes) for c in ddp.comm.collectives] == [("all_reduce", 60_096 * 4)]
    console = Console(record=True, width=400)
    render_measurement(ddp, console)
    footer = [line for line in console.export_text().splitlines() if line.startswith("step time")][0]
    assert footer.endswith("bytes per step 234.8 KiB; counted as the ZeRO paper counts (an all-reduce twice) "
                           "469.5 KiB, against its 2Ψ = 469.5 KiB")


# tiny (n_embd 32, vocab 128, block_size 32, 4 blocks): Ψ = 2 x 4,096 + 1,024 + 64 + 4 x 12,704 = 60,096;
# the root unit (wte, wpe, ln_f, lm_head) 9,280 elements and each block 12,704.
TINY_PSI, TINY_ROOT, TINY_BLOCK = 60_096, 9_280, 12_704


def _measured(config, collectives: list[tuple[str, str, str, int, str]]):
    """A 2-rank measurement of `config` as the engine's parent assembles one (its prediction included), from
    hand-written collectives (op, phase, module, bytes, dtype) and zero3's hand-derived fp32 model states."""
    from sharding_lab.engine.measure import _combine
    from sharding_lab.run_config import Placement, PlacementChoice

    shard = TINY_PSI // 2
    rank = {
        "params_bytes": 4 * shard, "grads_bytes": 4 * shard, "optimizer_bytes": 8 * shard,
        "model_states_bytes": 16 * shard, "optimizer_scalar_bytes": 212, "padding_elements": 0, "padding_bytes": 0,
        "peak_bytes": 0, "persistent_bytes": 0, "categories": {}, "category_peaks": {},
        "unsharded_params_peak_bytes": 0, "unsharded_params_after_forward_bytes": 0, "cuda_max_memory_allocated": None,
    }
    comm = [{"seq": i, "op": op, "phase": phase, "module": module, "prefetch": False, "bytes": size,
             "wire_bytes_derived": size // 2, "dtype": dtype, "group_size": 2, "mesh_dim": "dp"}
            for i, (op, phase, module, size, dtype) in enumerate(collectives)]
    result = {
        "config": {"backend": "gloo", "device": "cpu", "torch_version": "2.13.0", "num_params": TINY_PSI,
                   "padded_num_params": TINY_PSI, "n_blocks": 4, "model": {}, "seq_len": 32},
        "comm": {"collectives": comm, "timeline": []}, "step_time_s": 0.01, "loss": 4.0,
        "gradient_parity": None, "overlap": None,
    }
    ranks = [{**result, "memory": {"rank": r, **rank}} for r in range(2)]
    return _combine(config, PlacementChoice(Placement.RANKS, ""), ranks)


def _zero3_step(gathered_bytes: int) -> list[tuple[str, str, str, int, str]]:
    """zero3's step on tiny: the root and 4 blocks gathered in forward, the blocks again in backward, every
    unit reduce-scattered in fp32; parameters gathered at `gathered_bytes` per element."""
    dtype = "bfloat16" if gathered_bytes == 2 else "float32"
    blocks = [f"blocks.{i}" for i in range(4)]
    return (
        [("all_gather", "forward", "root", gathered_bytes * TINY_ROOT, dtype)]
        + [("all_gather", "forward", b, gathered_bytes * TINY_BLOCK, dtype) for b in blocks]
        + [("all_gather", "backward", b, gathered_bytes * TINY_BLOCK, dtype) for b in reversed(blocks)]
        + [("reduce_scatter", "backward", b, 4 * TINY_BLOCK, "float32") for b in reversed(blocks)]
        + [("reduce_scatter", "backward", "root", 4 * TINY_ROOT, "float32")]
    )


def _footer(m) -> str:
    console = Console(record=True, width=400)
    render_measurement(m, console)
    return next(line for line in console.export_text().splitlines() if line.startswith("step time"))


def test_under_mixed_precision_the_footer_gives_the_element_sizes_behind_the_papers_3_psi():
    from sharding_lab.run_config import RunConfig

    # bf16 all-gathers: (9,280 + 8 x 12,704) x 2 B = 221,824 B; fp32 reduce-scatters 60,096 x 4 B = 240,384 B;
    # 462,208 B = 451.4 KiB. The paper's 3Ψ in this run's sizes: 2 x 60,096 x 2 B + 60,096 x 4 B = 480,768 B
    # = 469.5 KiB, which is neither 3Ψ at 4 B (704.2 KiB) nor at 2 B (352.1 KiB): the line must say so.
    bf16 = _measured(RunConfig.of("zero3", world_size=2, mixed_precision=True), _zero3_step(2))
    assert _footer(bf16).endswith(
        "bytes per step 451.4 KiB; counted as the ZeRO paper counts (an all-reduce twice) 451.4 KiB, against "
        "its 3Ψ (all_gather 2 B, reduce_scatter 4 B per element) = 469.5 KiB")
    # fp32: 3Ψ = 3 x 60,096 x 4 B = 721,152 B = 704.2 KiB, one element size, as Ψ's own.
    fp32 = _measured(RunConfig.of("zero3", world_size=2), _zero3_step(4))
    assert _footer(fp32).endswith("against its 3Ψ = 704.2 KiB")


def test_paper_lines_name_the_strategies_each_accounting_holds_for_when_they_differ():
    from sharding_lab.report import paper_lines
    from sharding_lab.run_config import RunConfig

    # compare --world-size 4 --replicas 2: DDP's strategies run without HSDP, so their accounting has no HSDP.
    ddp = _measured(RunConfig.of("ddp", world_size=2), [("all_reduce", "backward", "root", 4 * TINY_PSI, "float32")])
    hsdp = _measured(RunConfig.of("zero3", world_size=4, replicas=2), _zero3_step(4))
    fp32 = ("model states: fp32 Adam (4+4+8 bytes per parameter), FSDP padding included for zero2/zero3; "
            "communication: the paper's collectives, fp32 on the wire")
    lines = paper_lines({"ddp": ddp, "zero3": hsdp})
    assert lines[:2] == [
        f"The ZeRO paper's model, derived for ddp: {fp32}.",
        f"The ZeRO paper's model, derived for zero3: {fp32}; HSDP: those collectives within a shard group of 2, "
        "plus an all-reduce of each rank's gradient shard across 2 replicas (not in these figures).",
    ]
    assert paper_lines({"ddp": ddp})[0] == f"The ZeRO paper's model, derived for this run: {fp32}."


def test_the_comparison_title_says_which_options_each_strategy_took():
    from sharding_lab.run_config import RunConfig

    # compare --cpu-offload --grad-accum 2: every strategy accumulates, only the FSDP ones offload.
    ddp = _measured(RunConfig.of("ddp", world_size=2, grad_accum_steps=2),
                    [("all_reduce", "backward", "root", 4 * TINY_PSI, "float32")])
    zero3 = _measured(RunConfig.of("zero3", world_size=2, grad_accum_steps=2, cpu_offload=True), _zero3_step(4))
    console = Console(record=True, width=400)
    render_comparison({"ddp": ddp, "zero3": zero3}, console)
    text = console.export_text()
    title = " ".join(text[:text.index("┏")].split())  # rich wraps a title to its table's width
    assert title == ("Strategies side by side: tiny (60,096 params), micro-batch 2 x seq 32, 2 ranks, gloo, CPU "
                     "offload (the device is the host: nothing moves) for zero3, 2 micro-batches per step; rank 0, "
                     "measured (predicted by the ZeRO paper's model)")
    # compare --world-size 4 --replicas 2: the mesh named is zero3's (2 x 2), never ddp's (it has none).
    ddp4 = _measured(RunConfig.of("ddp", world_size=4), [("all_reduce", "backward", "root", 4 * TINY_PSI, "float32")])
    hsdp = _measured(RunConfig.of("zero3", world_size=4, replicas=2), _zero3_step(4))
    console = Console(record=True, width=400)
    render_comparison({"ddp": ddp4, "zero3": hsdp}, console)
    text = console.export_text()
    assert ", HSDP 2 replicas x 2 shards for zero3; rank 0" in " ".join(text[:text.index("┏")].split())
