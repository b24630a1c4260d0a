"""`studyapp export-history` / `import-history`: the whole review log out and back in, equal,
idempotent, and a malformed file refused with its file, line and field named, writing nothing."""

from __future__ import annotations

import csv
import io
import json
import re
from collections import Counter
from pathlib import Path

import pytest
from conftest import Clock, _empty_postgres, write_bank
from db_checks import assert_cards_replay, table_rows
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from live_server import record_figures
from review_driver import drive_reviews
from sqlmodel import Session, select
from test_fuzz_endpoints import json_value, nasty_text

from studyapp import create_app
from studyapp.db import get_engine
from studyapp.history import FIELD_NAMES
from studyapp.models import Card, ReviewLog
from studyapp.sync import sync_bank


@pytest.fixture
def studied(app, client, clock):
    """The app after four days of reviews through its pages, some undone."""
    graded = drive_reviews(client, clock, days=4, undo_every=4)
    assert graded > 15
    return app


def schedules(app) -> dict[str, tuple]:
    with Session(get_engine(app)) as session:
        return {
            c.question_id: (c.repetitions, c.easiness, c.interval, c.due_day, c.repeat_day, c.last_reviewed_at)
            for c in session.exec(select(Card)).all()
        }


def fresh_app(app_config: dict, tmp_path: Path, bank_dir: Path, name: str):
    """The same database URL emptied, migrated and synced again: a new install."""
    _empty_postgres(app_config["DATABASE_URL"])
    app = create_app(app_config, instance_path=str(tmp_path / name))
    sync_bank(get_engine(app), bank_dir)
    return app


def test_an_export_that_cannot_be_written_says_so_without_a_traceback(studied, runner, tmp_path):
    target = tmp_path / "no-such-folder" / "history.csv"
    result = runner.invoke(args=["export-history", "--out", str(target)])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert f"cannot write {target}: No such file or directory; nothing was written" in result.output
    assert list(tmp_path.glob("**/*history*")) == []


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_export_then_import_into_a_new_database_round_trips(studied, runner, app_config, tmp_path, bank_dir, fmt):
    exported = tmp_path / f"history.{fmt}"
    result = runner.invoke(args=["export-history", "--out", str(exported)])
    assert result.exit_code == 0, result.output
    before = schedules(studied)
    with Session(get_engine(studied)) as session:
        count = len(session.exec(select(ReviewLog)).all())
        assert any(log.undone_at for log in session.exec(select(ReviewLog)).all())
    assert f"wrote {count} reviews" in result.output
    get_engine(studied).dispose()

    restored = fresh_app(app_config, tmp_path, bank_dir, "restored")
    result = restored.test_cli_runner().invoke(args=["import-history", str(exported)])
    assert result.exit_code == 0, result.output
    assert f"imported {count} reviews (0 already present)" in result.output
    assert schedules(restored) == before
    assert assert_cards_replay(get_engine(restored)) == 5
    again = restored.test_cli_runner().invoke(args=["export-history", "--format", fmt])
    assert again.output == exported.read_text(encoding="utf-8")
    get_engine(restored).dispose()


def test_the_export_has_what_another_scheduler_needs(studied, runner):
    document = json.loads(runner.invoke(args=["export-history", "--format", "json"]).output)
    assert document["format"] == "studyapp-review-history" and document["fields"] == list(FIELD_NAMES)
    with Session(get_engine(studied)) as session:
        logs = session.exec(select(ReviewLog).order_by(ReviewLog.id)).all()
        cards = {c.id: c for c in session.exec(select(Card)).all()}
    assert len(document["reviews"]) == len(logs)
    for row, log in zip(document["reviews"], logs, strict=True):
        card = cards[log.card_id]
        assert row["question_id"] == card.question_id and row["deck_id"] == card.deck_id
        assert row["reviewed_at"] == log.reviewed_at.isoformat() and row["reviewed_at"].endswith("+00:00")
        assert (row["quality"], row["choice"], row["correct"]) == (log.quality, log.choice, log.correct)
        assert row["choice_text"] == card.choices[log.choice]
        assert row["undone"] == (log.undone_at is not None) and row["duration_ms"] == 3000
        assert (row["after_repetitions"], row["after_interval"]) == (log.after_repetitions, log.after_interval)
    csv_rows = list(csv.DictReader(io.StringIO(runner.invoke(args=["export-history"]).output)))
    assert [r["submission_id"] for r in csv_rows] == [r["submission_id"] for r in document["reviews"]]


def test_importing_twice_or_into_the_source_changes_nothing(studied, runner, tmp_path):
    exported = tmp_path / "history.csv"
    runner.invoke(args=["export-history", "--out", str(exported)])
    before = table_rows(get_engine(studied))
    result = runner.invoke(args=["import-history", str(exported)])
    assert result.exit_code == 0, result.output
    assert f"imported 0 reviews ({len(before['reviewlog'])} already present)" in result.output
    assert table_rows(get_engine(studied)) == before


def test_imported_submission_ids_never_collide_with_new_reviews(app_config, tmp_path, bank_dir, studied, runner, clock):
    """Imported ids embed the old database's card ids; the new database's next grades must not
    be mistaken for them (same id = 'already recorded')."""
    exported = tmp_path / "history.json"
    runner.invoke(args=["export-history", "--out", str(exported)])
    get_engine(studied).dispose()
    reordered = write_reordered_bank(bank_dir)
    restored = fresh_app(app_config, tmp_path, reordered, "restored")
    assert restored.test_cli_runner().invoke(args=["import-history", str(exported)]).exit_code == 0
    before = len(table_rows(get_engine(restored))["reviewlog"])
    clock.advance(days=30)
    graded = drive_reviews(restored.test_client(), clock, days=2, undo_every=0)
    assert len(table_rows(get_engine(restored))["reviewlog"]) == before + graded
    assert_cards_replay(get_engine(restored))
    get_engine(restored).dispose()


def write_reordered_bank(bank_dir: Path) -> Path:
    """The same decks with beta first: every card gets another database id."""
    folder = bank_dir.parent / "bank-reordered"
    folder.mkdir()
    (folder / "a-beta.yaml").write_text((bank_dir / "beta.yaml").read_text())
    (folder / "b-alpha.yaml").write_text((bank_dir / "alpha.yaml").read_text())
    return folder


# --- Malformed files --------------------------------------------------------------------


def csv_edit(column: str, value: str, line: int = 2):
    def edit(text: str) -> str:
        rows = list(csv.reader(io.StringIO(text)))
        rows[line - 1][rows[0].index(column)] = value
        out = io.StringIO()
        csv.writer(out, lineterminator="\n").writerows(rows)
        return out.getvalue()

    return edit


def json_edit(field: str, value, review: int = 1):
    def edit(text: str) -> str:
        document = json.loads(text)
        document["reviews"][review - 1][field] = value
        return json.dumps(document)

    return edit


def csv_rows_edit(change):
    """An edit of the parsed CSV rows (header first) by `change(rows)`."""

    def edit(text: str) -> str:
        rows = list(csv.reader(io.StringIO(text)))
        change(rows)
        out = io.StringIO()
        csv.writer(out, lineterminator="\n").writerows(rows)
        return out.getvalue()

    return edit


def _flip_correct(rows: list[list[str]]) -> None:
    column = rows[0].index("correct")
    rows[2][column] = "false" if rows[2][column] == "true" else "true"


def _regrade_a_live_review(rows: list[list[str]]) -> None:
    """Another grade in the same band (3 for 4, 1 for 0...) on a review that counts: the
    card's recorded schedule no longer replays."""
    header = rows[0]
    for row in rows[1:]:
        if row[header.index("undone")] == "false" and row[header.index("is_repeat")] == "false":
            quality = int(row[header.index("quality")])
            row[header.index("quality")] = str({0: 1, 1: 0, 2: 1, 3: 4, 4: 3, 5: 4}[quality])
            return
    raise AssertionError("no live first-pass review to edit")


def _drop_a_followed_review(rows: list[list[str]]) -> None:
    """Leave out a live review of a card that has later live ones."""
    header = rows[0]
    question, undone = header.index("question_id"), header.index("undone")
    live = [row for row in rows[1:] if row[undone] == "false"]
    for index, row in enumerate(live):
        if any(later[question] == row[question] for later in live[index + 1 :]):
            rows.remove(row)
            return
    raise AssertionError("no card with two live reviews")


def _extra_cell(rows: list[list[str]]) -> None:
    rows[2].append("extra")


def duplicated_row(text: str) -> str:
    lines = text.splitlines(keepends=True)
    return "".join(lines[:2] + [lines[1]] + lines[2:])


# (file suffix, edit of a good export, line named, field named)
BAD_FILES = {
    "quality-out-of-range": ("csv", csv_edit("quality", "7"), ":2:", "quality"),
    "quality-not-a-number": ("csv", csv_edit("quality", "five"), ":2:", "quality"),
    "quality-contradicts-correct": ("csv", csv_rows_edit(_flip_correct), ":3:", "quality"),
    "time-without-offset": ("csv", csv_edit("reviewed_at", "2026-03-02T12:00:00"), ":2:", "reviewed_at"),
    "date-malformed": ("csv", csv_edit("study_day", "2026-13-45"), ":2:", "study_day"),
    "empty-required": ("csv", csv_edit("before_interval", ""), ":2:", "before_interval"),
    "easiness-below-sm2-floor": ("csv", csv_edit("after_easiness", "0.5"), ":2:", "after_easiness"),
    "unknown-question": ("csv", csv_edit("question_id", "no-such-question"), ":2:", "question_id"),
    "choice-beyond-the-card": ("csv", csv_edit("choice", "9"), ":2:", "choice"),
    "bad-submission-id": ("csv", csv_edit("submission_id", "../../etc"), ":2:", "submission_id"),
    "repeated-submission-id": ("csv", duplicated_row, ":3:", "submission_id"),
    "grade-does-not-lead-to-its-schedule": ("csv", csv_rows_edit(_regrade_a_live_review), ":", "after_*"),
    "undone-flag-without-time": ("csv", csv_edit("undone", "true"), ":2:", "undone_at"),
    "missing-column": ("csv", lambda t: t.replace("duration_ms,", "", 1), ":1:", "missing duration_ms"),
    "a-review-left-out": ("csv", csv_rows_edit(_drop_a_followed_review), ":", "before_*"),
    "extra-cell": ("csv", csv_rows_edit(_extra_cell), ":3:", "fields"),
    "not-a-history": ("csv", lambda t: "name,score\nada,3\n", ":1:", "not a review history"),
    "json-syntax": ("json", lambda t: t[:-20], ":", "not valid JSON"),
    "json-not-history": ("json", lambda t: '{"format": "anki", "reviews": []}', ":1:", "format"),
    "json-wrong-type": ("json", json_edit("correct", "yes"), ": review #1", "correct"),
    "json-unknown-field": ("json", json_edit("rating", 3), ": review #1", "rating"),
    "json-bool-as-int": ("json", json_edit("quality", True), ": review #1", "quality"),
    # Past what Python's readers take: each once raised its own error as a traceback.
    "csv-field-past-the-csv-limit": ("csv", csv_edit("choice_text", "x" * 200_000), ":2:", "field larger than field limit"),
    "json-nested-past-the-recursion-limit": ("json", lambda t: t.split('"reviews"')[0] + '"reviews": ' + "[" * 100_000, ":",
                                             "nests arrays or objects too deeply"),
    "json-number-of-5000-digits": ("json", lambda t: re.sub(r'"quality": \d', '"quality": ' + "9" * 5000, t, count=1), ":",
                                   "4300 digits"),
    "time-before-year-one-in-utc": ("csv", csv_edit("reviewed_at", "0001-01-01T00:00:00+14:00"), ":2:", "reviewed_at"),
    "next-due-day-past-year-9999": ("csv", csv_edit("study_day", "9999-12-31"), ":2:", "past the year 9999"),
    # A version past 2**31 - 1 would make the card unanswerable: every form refuses it.
    "submission-id-of-11-digits": ("csv", csv_edit("submission_id", "card5-v99999999999"), ":2:", "at most 2,000,000,000"),
    "submission-id-past-two-billion": ("csv", csv_edit("submission_id", "card5-v2000000001"), ":2:", "at most 2,000,000,000"),
    "submission-id-in-other-digits": ("csv", csv_edit("submission_id", "card٥-v١"), ":2:", "must look like card12-v3"),
    "csv-header-past-the-csv-limit": ("csv", lambda t: "x" * 200_000 + "\n" + t, ":1:", "field larger than field limit"),
}


@pytest.fixture(scope="module")
def good_exports(tmp_path_factory) -> dict[str, str]:
    """A studied database's history as CSV and JSON, made once for the malformed-file cases."""
    folder = tmp_path_factory.mktemp("good-history")
    bank = write_bank(folder / "bank")
    clock = Clock()
    app = create_app({"DATABASE_URL": f"sqlite:///{folder / 'db.sqlite3'}", "SECRET_KEY": "x", "BANK_PATH": str(bank),
                      "TIMEZONE": "UTC", "CLOCK": clock}, instance_path=str(folder / "instance"))
    sync_bank(get_engine(app), bank)
    drive_reviews(app.test_client(), clock, days=4, undo_every=4)
    runner = app.test_cli_runner()
    exports = {fmt: runner.invoke(args=["export-history", "--format", fmt]).output for fmt in ("csv", "json")}
    get_engine(app).dispose()
    return exports


def test_the_good_exports_import(app, runner, tmp_path, good_exports):
    """The unedited files the malformed cases start from do import (so each case fails by its edit)."""
    for fmt, text in good_exports.items():
        (tmp_path / f"good.{fmt}").write_text(text)
        result = runner.invoke(args=["import-history", str(tmp_path / f"good.{fmt}")])
        assert result.exit_code == 0 and "imported" in result.output, result.output


def test_a_malformed_history_file_is_refused_and_nothing_is_written(app, runner, tmp_path, good_exports):
    """Each kind of damage in BAD_FILES, into one database (a refusal leaves it as it was)."""
    before = table_rows(get_engine(app))
    for kind, (fmt, edit, where, field) in sorted(BAD_FILES.items()):
        bad = tmp_path / f"{kind}.{fmt}"
        bad.write_text(edit(good_exports[fmt]), encoding="utf-8")
        result = runner.invoke(args=["import-history", str(bad)])
        assert result.exit_code == 1, (kind, result.output)
        assert "nothing was imported" in result.output, kind
        assert f"{bad}{where}" in result.output and field in result.output, (kind, result.output)
        assert table_rows(get_engine(app)) == before, kind


def test_a_history_missing_a_same_day_repeat_is_refused(app, runner, tmp_path, good_exports):
    """A repeat changes no SM-2 state, only the repeat day: without it the next review starts from
    a repeat day its predecessor did not leave. The refusal names that row and writes nothing."""
    rows = list(csv.reader(io.StringIO(good_exports["csv"])))
    header = rows[0]
    column = {name: header.index(name) for name in ("question_id", "undone", "is_repeat", "before_repeat_day")}
    live = [row for row in rows[1:] if row[column["undone"]] == "false"]
    repeat, following = next(
        (row, later)
        for index, row in enumerate(live)
        if row[column["is_repeat"]] == "true"
        for later in [next((r for r in live[index + 1 :] if r[column["question_id"]] == row[column["question_id"]]), None)]
        if later is not None
    )
    assert following[column["before_repeat_day"]] == ""  # the repeat (graded 4 or 5) cleared the repeat day
    rows.remove(repeat)
    damaged = tmp_path / "missing-repeat.csv"
    with damaged.open("w", newline="", encoding="utf-8") as out:
        csv.writer(out, lineterminator="\n").writerows(rows)
    before = table_rows(get_engine(app))

    result = runner.invoke(args=["import-history", str(damaged)])

    assert result.exit_code == 1 and "nothing was imported" in result.output, result.output
    line = rows.index(following) + 1
    assert f"{damaged}:{line}: fields 'before_*' (before_repeat_day, before_last_reviewed_at): card {repeat[column['question_id']]}" in result.output
    assert "(a review is missing?)" in result.output, result.output
    assert table_rows(get_engine(app)) == before


def test_a_review_id_already_used_for_another_review_is_refused(studied, runner, tmp_path):
    text = runner.invoke(args=["export-history"]).output
    other = csv_edit("reviewed_at", "2020-01-01T00:00:00+00:00")(text)
    (tmp_path / "other.csv").write_text(other)
    before = table_rows(get_engine(studied))
    result = runner.invoke(args=["import-history", str(tmp_path / "other.csv")])
    assert result.exit_code == 1 and "already in this database as a different review" in result.output
    assert table_rows(get_engine(studied)) == before


def test_importing_before_the_bank_is_synced_says_what_to_do(app_config, tmp_path, good_exports):
    _empty_postgres(app_config["DATABASE_URL"])
    bare = create_app(app_config, instance_path=str(tmp_path / "bare"))  # migrated, but no cards yet
    (tmp_path / "history.csv").write_text("\ufeff" + good_exports["csv"], encoding="utf-8")  # with a BOM
    result = bare.test_cli_runner().invoke(args=["import-history", str(tmp_path / "history.csv")])
    assert result.exit_code == 1 and "sync the bank it came from first (`studyapp bank sync`)" in result.output
    assert "history.csv:2: field 'question_id'" in result.output
    sync_bank(get_engine(bare), write_bank(tmp_path / "bank"))
    result = bare.test_cli_runner().invoke(args=["import-history", str(tmp_path / "history.csv")])
    assert result.exit_code == 0 and "imported" in result.output, result.output
    get_engine(bare).dispose()


@pytest.mark.slow
def test_fuzzed_history_files_are_imported_or_refused_cleanly(app, runner, tmp_path, good_exports, tmp_path_factory):
    """Random damage to a good file (a cell replaced, a line dropped or repeated, the file cut
    short): the import succeeds or says why and writes nothing; it never crashes."""
    engine = get_engine(app)
    outcomes: Counter = Counter()

    @settings(max_examples=FUZZED_FILES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(data=st.data())
    def fuzz(data):
        fmt = data.draw(st.sampled_from(["csv", "json"]), label="format")
        lines = good_exports[fmt].splitlines(keepends=True)
        damage = data.draw(st.sampled_from(["cell", "drop", "repeat", "cut"]), label="damage")
        index = data.draw(st.integers(0, len(lines) - 1), label="line")
        if damage == "cell" and fmt == "csv":
            rows = list(csv.reader(io.StringIO(good_exports[fmt])))
            row = rows[index]
            row[data.draw(st.integers(0, len(row) - 1), label="column")] = data.draw(nasty_text, label="value")
            out = io.StringIO()
            csv.writer(out, lineterminator="\n").writerows(rows)
            text = out.getvalue()
        elif damage == "cell":
            document = json.loads(good_exports[fmt])
            review = document["reviews"][index % len(document["reviews"])]
            review[data.draw(st.sampled_from(FIELD_NAMES), label="field")] = data.draw(json_value, label="value")
            text = json.dumps(document)
        elif damage == "drop":
            text = "".join(lines[:index] + lines[index + 1 :])
        elif damage == "repeat":
            text = "".join(lines[: index + 1] + lines[index:])
        else:
            text = good_exports[fmt][: data.draw(st.integers(0, len(good_exports[fmt])), label="cut")]
        path = tmp_path / f"fuzzed.{fmt}"
        path.write_text(text, encoding="utf-8")
        before = table_rows(engine)
        result = runner.invoke(args=["import-history", str(path)])
        assert result.exception is None or isinstance(result.exception, SystemExit), result.output
        outcomes["imported" if result.exit_code == 0 else "refused"] += 1
        if result.exit_code == 0:
            assert_cards_replay(engine)
            forget_reviews(engine)  # back to an empty history for the next example
        else:
            assert result.exit_code == 1 and "nothing was imported" in result.output, result.output
            assert table_rows(engine) == before

    fuzz()
    assert outcomes["refused"] > FUZZED_FILES // 2
    record_figures(tmp_path_factory.getbasetemp(), f"history-fuzz-{engine.dialect.name}", {
        "history_files_tried": sum(outcomes.values()), **outcomes,
    })


FUZZED_FILES = 120


def forget_reviews(engine) -> None:
    with engine.begin() as connection:
        connection.execute(ReviewLog.__table__.delete())
        connection.execute(Card.__table__.update().values(repetitions=0, easiness=2.5, interval=0, due_day=None,
                                                          repeat_day=None, last_reviewed_at=None))
