"""The history file: its columns, writing rows as CSV or JSON, and reading them back checked.

Pure: no database. Each row names its card by the bank's stable question id; reading checks
every field and every row on its own (types, ranges, grades that fit the answer, schedules that
follow SM-2) and raises HistoryError naming each problem.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from dataclasses import dataclass
from datetime import date, datetime, timezone
from typing import Any

from studyapp import sm2
from studyapp.study import Schedule, schedule_after

FORMAT_NAME = "studyapp-review-history"
FORMAT_VERSION = 1
MAX_PROBLEMS = 20  # enough to see the pattern of a broken file without flooding the terminal
# Card ids and versions up to MAX_IMPORTED_ID: a card keeps room for its next versions (an import moves a
# card's past the highest imported; each grade adds one) in every database's INTEGER column (2**31 - 1),
# which the forms hold it to.
SUBMISSION_ID = re.compile(r"card([0-9]{1,10})-v([0-9]{1,10})")
MAX_IMPORTED_ID = 2_000_000_000


@dataclass(frozen=True)
class Field:
    name: str
    kind: str  # text | int | float | bool | date | datetime
    nullable: bool = False
    minimum: float | None = None
    maximum: float | None = None


# The file's columns, in order. Schedules are SM-2's (repetitions, easiness, interval in days).
FIELDS = (
    Field("submission_id", "text"),
    Field("question_id", "text"),
    Field("deck_id", "text"),
    Field("reviewed_at", "datetime"),  # UTC
    Field("study_day", "date"),  # the learner's day (it rolls over at DAY_START_HOUR local time)
    Field("quality", "int", minimum=0, maximum=5),
    Field("choice", "int", minimum=0, maximum=99),  # index in the bank's order of choices
    # What the learner chose, as the bank worded it at export time; empty (null) once the bank has
    # dropped that choice, so the review stays in the file (and restorable) with its index alone.
    Field("choice_text", "text", nullable=True),
    Field("correct", "bool"),
    Field("is_repeat", "bool"),  # a step-7 same-day repeat: changes no schedule
    Field("was_new", "bool"),
    Field("undone", "bool"),
    Field("undone_at", "datetime", nullable=True),
    Field("duration_ms", "int", nullable=True, minimum=0, maximum=2**31 - 1),
    Field("before_repetitions", "int", minimum=0, maximum=2**31 - 1),
    Field("before_easiness", "float", minimum=sm2.MIN_EASINESS, maximum=100),
    Field("before_interval", "int", minimum=0, maximum=2**31 - 1),
    Field("before_due_day", "date", nullable=True),
    Field("before_repeat_day", "date", nullable=True),
    Field("before_last_reviewed_at", "datetime", nullable=True),
    Field("after_repetitions", "int", minimum=0, maximum=2**31 - 1),
    Field("after_easiness", "float", minimum=sm2.MIN_EASINESS, maximum=100),
    Field("after_interval", "int", minimum=0, maximum=2**31 - 1),
    Field("after_due_day", "date", nullable=True),
    Field("after_repeat_day", "date", nullable=True),
)
FIELD_NAMES = tuple(f.name for f in FIELDS)
LOG_COLUMNS = [f.name for f in FIELDS if f.name not in {"question_id", "deck_id", "choice_text", "undone"}]
# What a review moves, each as a before_* and an after_* column (study.Schedule's fields, in its order);
# the card also keeps its last review time, which each row's before_last_reviewed_at records.
SCHEDULE_FIELDS = ("repetitions", "easiness", "interval", "due_day", "repeat_day")


class HistoryError(ValueError):
    """A history file refused; `problems` each name the file, the row and the field."""

    def __init__(self, problems: list[str]):
        shown = problems[:MAX_PROBLEMS]
        more = f"\n  ... and {len(problems) - MAX_PROBLEMS} more" if len(problems) > MAX_PROBLEMS else ""
        super().__init__("the history file was refused; nothing was imported:\n  " + "\n  ".join(shown) + more)
        self.problems = problems


# --- Writing -----------------------------------------------------------------------------


def _to_text(value: Any) -> Any:
    """A value as the file stores it: ISO dates and times, UTC with an offset; JSON keeps numbers and booleans."""
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc).isoformat()
    if isinstance(value, date):
        return value.isoformat()
    return value


def render_history(rows: list[dict[str, Any]], fmt: str) -> str:
    """The file's text: `fmt` is "csv" (a header, then one line per review) or "json"."""
    if fmt == "json":
        reviews = [{k: _to_text(v) for k, v in row.items()} for row in rows]
        document = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "fields": list(FIELD_NAMES), "reviews": reviews}
        return json.dumps(document, indent=1, ensure_ascii=False) + "\n"
    if fmt != "csv":
        raise ValueError(f"unknown format {fmt!r}: csv or json")
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(FIELD_NAMES)
    for row in rows:
        values = [_to_text(row[name]) for name in FIELD_NAMES]
        writer.writerow(["" if v is None else ("true" if v is True else "false" if v is False else v) for v in values])
    return out.getvalue()


# --- Reading ----------------------------------------------------------------------------


def _parse_value(field: Field, raw: Any, from_csv: bool) -> Any:
    """The typed value of one field; raises ValueError with a reason a person can act on."""
    # JSON's "" for a nullable text is its null: what exports wrote for a dropped choice before null.
    if raw is None or (raw == "" and (from_csv or (field.nullable and field.kind == "text"))):
        if field.nullable:
            return None
        raise ValueError("is empty; a value is required")
    kind = field.kind
    if kind == "text":
        if not isinstance(raw, str) or not raw.strip():
            raise ValueError(f"must be non-empty text, got {raw!r:.60}")
        return raw
    if kind == "bool":
        if isinstance(raw, bool):
            return raw
        if from_csv and raw in ("true", "false"):
            return raw == "true"
        raise ValueError(f"must be true or false, got {raw!r:.60}")
    if kind in ("int", "float"):
        value = _number(raw, kind, from_csv)
        if (field.minimum is not None and value < field.minimum) or (field.maximum is not None and value > field.maximum):
            raise ValueError(f"must be from {field.minimum} to {field.maximum}, got {value}")
        return value
    if not isinstance(raw, str):
        raise ValueError(f"must be an ISO 8601 {kind} string, got {raw!r:.60}")
    example = "2026-03-02" if kind == "date" else "2026-03-02T12:00:00+00:00"
    try:
        if kind == "date":
            if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", raw):
                raise ValueError
            return date.fromisoformat(raw)
        value = datetime.fromisoformat(raw)
    except ValueError:
        raise ValueError(f"must be an ISO 8601 {kind} such as {example}, got {raw!r:.60}") from None
    if value.tzinfo is None:
        raise ValueError(f"must carry its UTC offset (+00:00), got {raw!r:.60}")
    try:
        return value.astimezone(timezone.utc)
    except OverflowError:  # e.g. 0001-01-01T00:00:00+14:00 is before year 1 in UTC
        raise ValueError(f"is outside the years 1 to 9999 in UTC, got {raw!r:.60}") from None


def _number(raw: Any, kind: str, from_csv: bool) -> int | float:
    if from_csv and isinstance(raw, str):
        try:
            raw = int(raw) if kind == "int" and re.fullmatch(r"-?\d{1,12}", raw) else float(raw) if kind == "float" else None
        except ValueError:
            raw = None
    if isinstance(raw, bool) or raw is None:
        raise ValueError(f"must be {'a whole number' if kind == 'int' else 'a number'}")
    if kind == "int" and isinstance(raw, int):
        return raw
    if kind == "float" and isinstance(raw, (int, float)) and math.isfinite(raw):
        return float(raw)
    raise ValueError(f"must be {'a whole number' if kind == 'int' else 'a finite number'}, got {raw!r:.60}")


@dataclass
class Record:
    where: str  # "FILE:LINE" (CSV) or "FILE: review #N" (JSON), for messages
    values: dict[str, Any]


def _csv_rows(text: str, name: str, problems: list[str]) -> list[tuple[int, list[str]]] | None:
    """Each row with the line it ends on; None, with the problem, when the csv module cannot read the file."""
    reader = csv.reader(io.StringIO(text, newline=""))
    rows = []
    try:
        for cells in reader:
            rows.append((reader.line_num, cells))
    except csv.Error as error:  # a field past the csv module's limit, a NUL byte, ...
        problems.append(f"{name}:{reader.line_num}: not valid CSV: {error}")
        return None
    return rows


def _records_from_csv(text: str, name: str, problems: list[str]) -> list[tuple[str, dict[str, Any]]]:
    rows = _csv_rows(text, name, problems)
    if rows is None:
        return []
    if not rows:
        problems.append(f"{name}:1: the file is empty; expected a header line: {','.join(FIELD_NAMES)}")
        return []
    header = rows[0][1]
    missing = [f for f in FIELD_NAMES if f not in header]
    unknown = [f for f in header if f not in FIELD_NAMES]
    if len(missing) == len(FIELD_NAMES):
        problems.append(f"{name}:1: not a review history from `studyapp export-history`: its first line must be "
                        f"the header {','.join(FIELD_NAMES[:3])},...")
        return []
    if missing or unknown or len(set(header)) != len(header):
        problems.append(f"{name}:1: the header must name each of these once: {','.join(FIELD_NAMES)}"
                        + (f"; missing {', '.join(missing)}" if missing else "") + (f"; unknown {', '.join(unknown)}" if unknown else ""))
        return []
    records = []
    for line, cells in rows[1:]:
        where = f"{name}:{line}"
        if len(cells) != len(header):
            problems.append(f"{where}: expected {len(header)} fields, got {len(cells)}")
            continue
        records.append((where, dict(zip(header, cells, strict=True))))
    return records


def _records_from_json(text: str, name: str, problems: list[str]) -> list[tuple[str, dict[str, Any]]]:
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        problems.append(f"{name}:{error.lineno}: not valid JSON: {error.msg}")
        return []
    except (ValueError, RecursionError) as error:  # a number of over 4,300 digits; arrays nested too deeply
        reason = "it nests arrays or objects too deeply" if isinstance(error, RecursionError) else str(error)
        problems.append(f"{name}: not a review history this app can read: {reason}")
        return []
    if not isinstance(document, dict) or document.get("format") != FORMAT_NAME:
        problems.append(f"{name}:1: field 'format': not a studyapp review history (expected \"format\": \"{FORMAT_NAME}\")")
        return []
    if document.get("version") != FORMAT_VERSION:
        problems.append(f"{name}:1: field 'version': this app reads version {FORMAT_VERSION}, got {document.get('version')!r:.40}")
        return []
    reviews = document.get("reviews")
    if not isinstance(reviews, list):
        problems.append(f"{name}:1: field 'reviews': must be a list of reviews")
        return []
    records = []
    for number, review in enumerate(reviews, start=1):
        where = f"{name}: review #{number}"
        if not isinstance(review, dict):
            problems.append(f"{where}: must be an object with the fields {', '.join(FIELD_NAMES)}")
            continue
        if unknown := sorted(set(review) - set(FIELD_NAMES)):
            problems.append(f"{where}: field '{unknown[0]}': unknown field")
            continue
        if missing := [f for f in FIELD_NAMES if f not in review]:
            problems.append(f"{where}: field '{missing[0]}': missing")
            continue
        records.append((where, review))
    return records


def parse_history(text: str, name: str, fmt: str | None = None) -> list[Record]:
    """Every review in the file, typed and checked on its own. Raises HistoryError naming each problem."""
    fmt = fmt or ("json" if text.lstrip().startswith("{") else "csv")
    problems: list[str] = []
    raw_records = (_records_from_json if fmt == "json" else _records_from_csv)(text, name, problems)
    records: list[Record] = []
    seen: dict[str, str] = {}
    for where, raw in raw_records:
        values: dict[str, Any] = {}
        for field in FIELDS:
            try:
                values[field.name] = _parse_value(field, raw[field.name], from_csv=fmt == "csv")
            except ValueError as error:
                problems.append(f"{where}: field '{field.name}': {error}")
        if len(values) != len(FIELDS):
            continue
        problems.extend(f"{where}: {problem}" for problem in _record_problems(values))
        sid = values["submission_id"]
        if sid in seen:
            problems.append(f"{where}: field 'submission_id': '{sid}' repeats {seen[sid]}")
        seen.setdefault(sid, where)
        records.append(Record(where, values))
    if problems:
        raise HistoryError(problems)
    return records


def _record_problems(values: dict[str, Any]) -> list[str]:
    """What makes a well-typed row impossible for this app to have written."""
    problems = []
    matched = SUBMISSION_ID.fullmatch(values["submission_id"])
    if not matched or max(map(int, matched.groups())) > MAX_IMPORTED_ID:
        problems.append(f"field 'submission_id': must look like card12-v3, a card id and a version of at most "
                        f"{MAX_IMPORTED_ID:,}, got {values['submission_id']!r:.60}")
    if problem := sm2.misgraded(values["correct"], values["quality"]):
        problems.append(f"field 'quality': {problem}")
    if values["undone"] != (values["undone_at"] is not None):
        problems.append("field 'undone_at': must be set exactly when 'undone' is true")
    before, after = schedule_of(values, "before"), schedule_of(values, "after")
    if values["is_repeat"] != (before.repeat_day == values["study_day"]):
        problems.append("field 'is_repeat': must be true exactly when 'before_repeat_day' is the review's 'study_day' "
                        "(a step-7 same-day repeat)")
    if values["was_new"] != (before.due_day is None and not values["is_repeat"]):
        problems.append("field 'was_new': must be true exactly when 'before_due_day' is empty and the review is not a repeat")
    if not problems:
        # A step-7 repeat changes no SM-2 state; any other grade moves it by SM-2 and sets the due day.
        try:
            expected = schedule_after(before, values["quality"], values["is_repeat"], values["study_day"])
        except OverflowError:
            return [f"field 'study_day': its next due day falls past the year 9999, got {values['study_day']}"]
        if after != expected:
            problems.append(f"fields 'after_*': quality {values['quality']} on {values['study_day']} from "
                            f"{describe_schedule(before)} leads to {describe_schedule(expected)}, not {describe_schedule(after)}")
    return problems


def schedule_of(values: dict[str, Any], side: str) -> Schedule:
    """The schedule a row holds on one side ("before" or "after") of its review."""
    return Schedule(*(values[f"{side}_{name}"] for name in SCHEDULE_FIELDS))


def describe_schedule(schedule: Schedule) -> str:
    return ", ".join(f"{name} {shown(getattr(schedule, name))}" for name in SCHEDULE_FIELDS)


def shown(value: Any) -> str:
    return "(none)" if value is None else str(_to_text(value))

