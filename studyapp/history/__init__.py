"""The whole review log as a portable file (CSV or JSON), and back: a backup, and the way to
move the history to another scheduler (FSRS wants card id, time in UTC, rating, duration).

    format.py   the file: its columns, writing it, reading it back checked (no database)
    store.py    the database side: every review as rows, and importing checked rows

Each row names its card by the bank's stable question id, never by a database id, so a file
restores into any database that has synced the same bank. Import checks the whole file first
and writes nothing if anything is wrong. The CLI is `studyapp export-history` / `import-history`
(studyapp.cli.history).
"""

from studyapp.history.format import FIELD_NAMES, FIELDS, HistoryError, parse_history, render_history
from studyapp.history.store import ImportReport, history_rows, import_history

__all__ = [
    "FIELDS",
    "FIELD_NAMES",
    "HistoryError",
    "ImportReport",
    "history_rows",
    "import_history",
    "parse_history",
    "render_history",
]
