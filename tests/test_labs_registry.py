"""The lab registry matches the catalogue, stays torch-free, and its SVG and summaries are sound."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from sharding_lab import svg, units
from sharding_lab.catalog import CATALOG
from sharding_lab.labs import LABS, get_lab, summarize
from sharding_lab.labs.base import Conditions, Table

REPO = Path(__file__).resolve().parent.parent


def test_every_catalogue_lab_has_a_registry_entry_and_vice_versa():
    assert list(LABS) == [info.id for info in CATALOG]
    for info in CATALOG:
        assert LABS[info.id].info == info


def test_the_committed_lab_results_state_each_labs_claim_and_cards_as_the_catalogue_does():
    # exports/lab-results.json is what a fresh install and the Anki decks show: a catalogue change must
    # re-run the labs (`sharding-lab run --all --export exports/lab-results.json`) and rebuild the decks.
    committed = json.loads((REPO / "exports" / "lab-results.json").read_text(encoding="utf-8"))
    assert list(committed) == sorted(info.id for info in CATALOG)
    stale = [info.id for info in CATALOG
             if (committed[info.id]["claim"], committed[info.id]["questions"]) != (info.claim, list(info.questions))]
    assert stale == [], f"exports/lab-results.json states older claims or cards for {stale}"


def test_an_unknown_lab_is_refused_with_the_known_ids():
    with pytest.raises(KeyError, match="what-fsdp-shards"):
        get_lab("no-such-lab")


@pytest.mark.parametrize("lab_id", list(LABS))
def test_each_lab_runs_named_configurations_of_known_strategies(lab_id):
    runs = LABS[lab_id].runs(2)
    assert runs, lab_id
    assert len({run.key for run in runs}) == len(runs), "keys name runs uniquely"
    assert all(run.config.strategy in {"ddp", "zero1", "zero2", "zero3"} for run in runs)
    assert all(run.config.world_size >= 1 for run in runs)


def test_persistent_memory_scaling_runs_at_one_n_and_two_n_ranks():
    world_sizes = sorted({run.config.world_size for run in LABS["persistent-memory-scaling"].runs(2)})
    assert world_sizes == [1, 2, 4]


def test_importing_the_labs_does_not_import_torch():
    code = "import sys, sharding_lab.labs, sharding_lab.labs.commands, sharding_lab.svg; print('torch' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_a_verdict_with_no_conditions_does_not_hold():
    assert Conditions().verdict().holds is False


def test_a_failed_condition_fails_the_verdict_and_says_so():
    conditions = Conditions()
    conditions.require(True, "first")
    conditions.require(False, "second")
    verdict = conditions.verdict()
    assert verdict.holds is False
    assert verdict.reasons == ("first", "NOT second")


def test_summarize_drops_measurements_and_charts_and_keeps_the_rest():
    run = {
        "lab": "x",
        "holds": True,
        "finding": "f",
        "table": {},
        "config": {},
        "measurements": {},
        "charts": {},
    }
    summary = summarize(run)
    assert "measurements" not in summary and "charts" not in summary
    assert summary["lab"] == "x" and summary["holds"] is True
    assert "measurements" in run, "the run itself is not changed"


def _parse(svg_text: str) -> ElementTree.Element:
    return ElementTree.fromstring(svg_text)


def test_stacked_bar_chart_is_valid_self_contained_svg_with_escaped_text():
    chart = svg.stacked_bar_chart(
        "<script>alert(1)</script> & co",
        [svg.Bar("ddp <N=2>", {"params": 100, "grads": 50}), svg.Bar("zero3", {"params": 50})],
        ["params", "grads"],
    )
    root = _parse(chart)  # escaping keeps it well-formed XML
    assert root.tag.endswith("svg")
    assert "<script>" not in chart and "&lt;script&gt;" in chart
    assert "href" not in chart, "no external assets"
    labels = [element.text for element in root.iter() if element.tag.endswith("text")]
    assert "ddp <N=2>" in labels


def test_bars_are_drawn_in_proportion_to_their_values():
    chart = svg.stacked_bar_chart("t", [svg.Bar("a", {"x": 200}), svg.Bar("b", {"x": 100})], ["x"])
    widths = [
        float(e.get("width"))
        for e in _parse(chart).iter()
        if e.tag.endswith("rect") and e.get("y") != "0" and e.get("height") == "22"
    ]
    assert widths[0] == pytest.approx(2 * widths[1])


def test_timeline_chart_draws_a_lane_per_module_and_a_marker_per_collective():
    timeline = svg.Timeline(
        lanes=["root", "blocks.0"],
        spans=[svg.Span("blocks.0", 1, 2, "forward")],
        markers=[svg.Marker("blocks.0", 0, "all_gather", "all_gather 1 KiB <forward>")],
        bands=[svg.Band(0, 2, "forward")],
        length=3,
    )
    root = _parse(svg.timeline_chart("step", timeline))
    assert len([e for e in root.iter() if e.tag.endswith("polygon")]) == 1
    texts = [e.text for e in root.iter() if e.tag.endswith("text")]
    assert "root" in texts and "blocks.0" in texts


def test_human_bytes():
    assert units.human_bytes(512) == "512 B"
    assert units.human_bytes(1536) == "1.5 KiB"
    assert units.human_bytes(3 * 1024**3) == "3.0 GiB"
    assert units.human_bytes(None) == "-"
    # Rounded as printed: a value just under a unit reads as that unit, never "1024.0 KiB".
    assert units.human_bytes(1024**2 - 1) == "1.0 MiB" and units.human_bytes(1023.6) == "1.0 KiB"
    assert units.human_bytes(1024**2 - 52) == "1023.9 KiB"  # 1,048,524 / 1024 = 1023.949...


def test_human_bytes_past_a_thousand_tib():
    # The planner's largest answers: a peak of 3.1e20 B once read "281548.6 TiB".
    assert units.human_bytes(3 * 1024**5) == "3.0 PiB"
    assert units.human_bytes(309_559_663_450_000_000_000) == "268.5 EiB"  # / 1024**6 = 268.50...
    assert units.human_bytes(2048 * 1024**6) == "2,048.0 EiB"  # the largest unit, never an exponent


def test_a_table_reads_back_from_its_json_and_refuses_what_is_not_one():
    table = Table(("run", "bytes", "held"), (("zero3", 7, True), ("ddp", 1.5, None)))
    assert Table.from_json(json.loads(json.dumps(table.to_dict()))) == table
    assert Table.from_json({"columns": ["a"], "rows": [["x", [1, 2], {"k": 1}], "not a row", 5]}) == Table(
        ("a",), (("x", "[1, 2]", '{"k": 1}'),))
    for odd in (None, "table", [], {"columns": []}, {"columns": "a"}, {"rows": [[1]]}):
        assert Table.from_json(odd) is None, odd
    assert Table.from_json({"columns": ["a"], "rows": 5}) == Table(("a",), ())
