"""The measurement report's per-rank columns: ranks with equal figures share one, and past a screenful
of distinct ranks each row shows rank 0 beside its least and most."""

from __future__ import annotations

from dataclasses import replace

import pytest
from rich.console import Console
from sharding_measurements import typed

from sharding_lab.report import MAX_RANK_COLUMNS, RankColumn, rank_columns, rank_label, render_measurement


def test_rank_labels_name_runs_of_ranks():
    assert rank_label([3]) == "rank 3"
    assert rank_label([0, 1]) == "ranks 0-1"
    assert rank_label([7, 0, 2, 1, 5, 8]) == "ranks 0-2, 5, 7-8"


def test_ranks_with_equal_figures_share_a_column_and_others_keep_their_own():
    # FSDP's last rank is short of the padded shard: its parameters differ, the others' are alike.
    figures = {rank: [1024, 2048 if rank < 3 else 1536, None] for rank in range(4)}
    shown = rank_columns(figures)
    assert shown.columns == (
        RankColumn("ranks 0-2", ("1.0 KiB", "2.0 KiB", "-")),
        RankColumn("rank 3", ("1.0 KiB", "1.5 KiB", "-")),
    )
    assert not shown.summarized
    assert shown.note() == "4 ranks in 2 column(s): ranks whose figures are all equal share one."


def test_every_rank_distinct_within_a_screenful_keeps_a_column_each():
    figures = {rank: [1000 + rank] for rank in range(MAX_RANK_COLUMNS)}
    shown = rank_columns(figures)
    assert [c.header for c in shown.columns] == [f"rank {r}" for r in range(MAX_RANK_COLUMNS)]
    assert shown.note() == ""


def test_past_a_screenful_of_distinct_ranks_each_row_gives_its_least_and_most_and_who_has_it():
    ranks = MAX_RANK_COLUMNS + 1
    # Row 0 differs on every rank; row 1 is the same everywhere; row 2 is least on ranks 4 and 5;
    # row 3 alternates, so its ranks fall in more runs than a cell names (a count instead).
    figures = {rank: [100 * (rank + 1), 7, 0 if rank in (4, 5) else 9, rank % 2] for rank in range(ranks)}
    shown = rank_columns(figures)
    assert shown.summarized
    assert shown.columns == (
        RankColumn("rank 0", ("100 B", "7 B", "9 B", "0 B")),
        RankColumn("least", ("100 B (rank 0)", f"7 B (ranks 0-{ranks - 1})", "0 B (ranks 4-5)", "0 B (5 ranks)")),
        RankColumn("most", (f"{100 * ranks} B (rank {ranks - 1})", f"7 B (ranks 0-{ranks - 1})",
                            f"9 B (ranks 0-3, 6-{ranks - 1})", "1 B (4 ranks)")),
    )
    assert "too many distinct to show each" in shown.note() and "--json" in shown.note()


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
    from sharding_lab.units import human_bytes

    assert cells[:2] == [human_bytes(zero.params_bytes), human_bytes(last.params_bytes)]
