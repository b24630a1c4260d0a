"""The README's reliability table is what scripts/reliability-table renders from the committed
figures (tests/data/reliability.json, one whole run's reliability-*.json). That each test's fresh
figures keep the committed keys is checked where they are recorded (live_server.record_figures)."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
table = types.ModuleType("reliability_table")  # a script without .py: run its source as a module
table.__file__ = str(REPO / "scripts" / "reliability-table")
exec(compile(Path(table.__file__).read_text(), table.__file__, "exec"), table.__dict__)
TESTS_RECORDING = ["bad-banks", "concurrency", "crash", "fuzz", "history-fuzz"]
TESTS_RECORDING_ONCE = ["auth"]  # no database in what they count


@pytest.fixture
def figures() -> dict:
    return json.loads(table.FIGURES.read_text())


def test_the_readme_table_is_the_one_rendered_from_the_committed_figures(figures):
    assert table.readme_table(table.README.read_text()) == table.render(figures), "run `make reliability-table`"
    assert table.main(["--check"]) == 0


def test_the_committed_figures_are_a_whole_run_on_both_databases(figures):
    assert sorted(figures) == sorted([f"{test}-{db}" for test in TESTS_RECORDING for db in ("postgresql", "sqlite")]
                                     + TESTS_RECORDING_ONCE)
    for name, values in figures.items():
        if "reviews_lost" in values:
            assert values["reviews_lost"] == 0, name
        if "statuses" in values:
            assert all(int(status) < 500 for status in values["statuses"]), name


def test_every_cell_comes_from_the_figures(figures, tmp_path):
    """A changed figure changes the table, and the check then fails."""
    rendered = table.render(figures)
    changed = json.loads(json.dumps(figures))
    changed["crash-sqlite"]["reviews_lost"] = 1
    changed["concurrency-postgresql"]["statuses"]["500"] = 2
    changed["auth"]["logins_rate_limited_429"] = 77
    (tmp_path / "figures.json").write_text(json.dumps(changed))
    assert table.render(changed) != rendered
    assert "**1**" in table.render(changed) and "; 2 |" in table.render(changed)
    assert f"| {figures['auth']['wrong_tokens_refused_401']} / 77 |" in table.render(changed)
    assert table.main(["--check", "--figures", str(tmp_path / "figures.json")]) == 1


def test_collect_gathers_a_runs_files_by_name(figures, tmp_path):
    for name, values in figures.items():
        folder = tmp_path / f"test_{name}0"
        folder.mkdir()
        (folder / f"reliability-{name}.json").write_text(json.dumps(values))
    assert table.collect(tmp_path) == figures


def test_merge_replaces_only_the_tests_a_run_recorded(figures, tmp_path):
    (tmp_path / "figures.json").write_text(json.dumps(figures))
    (tmp_path / "run" / "test_x0").mkdir(parents=True)
    (tmp_path / "run" / "test_x0" / "reliability-auth.json").write_text(json.dumps({**figures["auth"], "statuses": {}}))
    assert table.main(["--collect", str(tmp_path / "run"), "--merge", "--figures", str(tmp_path / "figures.json")]) == 0
    merged = json.loads((tmp_path / "figures.json").read_text())
    assert merged == {**figures, "auth": {**figures["auth"], "statuses": {}}}
