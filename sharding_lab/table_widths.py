"""Column widths for rich tables under which no word is broken: cells wrap at spaces only.

A table wider than the console is narrowed by rich without regard to words: its widest columns first,
then every column evenly, folding a word or cutting it with "…". At 80 columns `plan`'s side by side
read "strate…" and "1.13e+…", and `run`'s tables "all_redu / ce x1". `fit_words` gives each column its
longest word first and shares what is left.
"""

from __future__ import annotations

from rich.cells import cell_len
from rich.console import Console, RenderableType
from rich.table import Table
from rich.text import Text


def _plain(console: Console, cell: RenderableType) -> str:
    """A cell's text as the table shows it (markup rendered away)."""
    if isinstance(cell, Text):
        return cell.plain
    return console.render_str(cell).plain if isinstance(cell, str) else ""


def _longest_word(text: str) -> int:
    return max((cell_len(word) for word in text.split()), default=0)


def _widest_line(text: str) -> int:
    return max((cell_len(line) for line in text.splitlines()), default=0)


def _frame(table: Table) -> int:
    """The characters a row spends on borders and padding. (Not for collapse_padding, whose first column
    rich 15 gives one character less than its padding takes.)"""
    _, right, _, left = table.padding
    count = len(table.columns)
    padding = count * (left + right) - (0 if table.pad_edge else left + right)
    borders = (count - 1 + 2 * table.show_edge) if table.box else 0
    return padding + borders


def fit_words(table: Table, console: Console, *, whole_cells: bool = False) -> Table | None:
    """`table` with column widths for `console`'s width under which rich breaks no word, or None where
    its words alone are wider than the console. Each column gets at least its longest word (headers
    always wrap at spaces; with `whole_cells`, each cell keeps to one line, for figures such as
    "243.2 GiB"), then a share of the width left by what it lacks to show every cell whole. A table
    that fits as it is keeps rich's widths."""
    least, whole = [], []
    for column in table.columns:
        header, cells = _plain(console, column.header), [_plain(console, cell) for cell in column.cells]
        cell_least = _widest_line if whole_cells else _longest_word
        least.append(max([1, _longest_word(header), *map(cell_least, cells)]))
        whole.append(max([1, *map(_widest_line, (header, *cells))]))
    room = console.width - _frame(table)
    if sum(least) > room:
        return None
    if sum(whole) > room:
        spare, lacking = room - sum(least), [w - m for w, m in zip(whole, least, strict=True)]
        for column, minimum, lacks in zip(table.columns, least, lacking, strict=True):
            column.width = minimum + spare * lacks // sum(lacking)
    return table
