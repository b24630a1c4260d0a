"""End to end: `studyapp bank sync` on each kind of malformed bank file (test_bank's cases, made
from the real bank) prints file:line and the field, exits 1, and leaves the database exactly as
it was: row for row, and on SQLite byte for byte."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
from db_checks import table_rows
from live_server import record_figures
from review_driver import drive_reviews
from test_bank import CASES

from studyapp.db import get_engine

BANK = Path(__file__).resolve().parent.parent / "bank"


@pytest.fixture
def bank_dir(tmp_path: Path) -> Path:
    """A copy of the real bank (the malformed cases are edits of bank/fsdp.yaml)."""
    return Path(shutil.copytree(BANK, tmp_path / "bank"))


def database_bytes(app) -> str | None:
    """A hash of the SQLite file with every connection closed (its WAL folded in); None elsewhere."""
    engine = get_engine(app)
    engine.dispose()
    if engine.dialect.name != "sqlite":
        return None
    path = Path(engine.url.database)
    assert not Path(f"{path}-wal").exists() or Path(f"{path}-wal").stat().st_size == 0
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_malformed_bank_is_refused_naming_file_line_and_field_and_the_database_is_untouched(
    app, client, clock, runner, bank_dir, tmp_path_factory
):
    assert len(CASES) >= 10
    assert drive_reviews(client, clock, days=1, undo_every=3) > 5  # a history worth protecting
    good = (bank_dir / "fsdp.yaml").read_text(encoding="utf-8")
    rows, digest = table_rows(get_engine(app)), database_bytes(app)
    refused, changed = 0, []  # changed: the cases after which the database's rows or (SQLite) bytes differ
    for make_case in CASES:
        case = make_case()
        (bank_dir / "fsdp.yaml").write_text(case.edit.text, encoding="utf-8")
        result = runner.invoke(args=["bank", "sync"])
        name = make_case.__name__
        after = table_rows(get_engine(app)), database_bytes(app)
        if after != (rows, digest):
            changed.append(name)
            rows, digest = after  # each case is judged against the database as it found it
        refused += result.exit_code == 1 and "Nothing was changed." in result.output
        assert result.exit_code == 1, (name, result.output)
        assert "Nothing was changed." in result.output, name
        for line, _question, field in case.expected:
            assert f"{bank_dir / 'fsdp.yaml'}:{line}" in result.output, (name, result.output)
            if field is not None:
                assert f"field '{field}'" in result.output, (name, result.output)
    assert changed == [], f"these malformed banks changed the database: {changed}"
    assert refused == len(CASES)
    (bank_dir / "fsdp.yaml").write_text(good, encoding="utf-8")
    result = runner.invoke(args=["bank", "sync"])  # the same database still takes a good bank
    assert result.exit_code == 0 and "0 added, 0 updated, 0 retired" in result.output, result.output
    record_figures(tmp_path_factory.getbasetemp(), f"bad-banks-{get_engine(app).dialect.name}", {
        "malformed_bank_kinds_refused": refused, "database_changed": len(changed),
    })
