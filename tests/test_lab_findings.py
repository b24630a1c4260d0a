"""A lab's finding from the first minute: the latest local run, else the committed reference
(studyapp.lab_runs.findings), on the labs index, a lab page, a card's answer side and in export-anki."""

from __future__ import annotations

import html
import json
import re
import shutil
from datetime import datetime, timezone
from pathlib import Path

import pytest
from conftest import REPO, with_committed_lab_results
from sqlmodel import Session, select

from sharding_lab.labs.evaluate import measured_where
from studyapp.db import get_engine
from studyapp.lab_runs.findings import LabFinding, choose, measured_date
from studyapp.models import LabRun, RunStatus

REFERENCE = json.loads((REPO / "exports" / "lab-results.json").read_text(encoding="utf-8"))


def text(response) -> str:
    """The page's words, tags left out."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", response.get_data(as_text=True))).split())


@pytest.fixture
def app_config(app_config: dict, tmp_path: Path) -> dict:
    return with_committed_lab_results(app_config, tmp_path)


def local_run(app, lab_id: str, finding: str) -> None:
    with Session(get_engine(app)) as session:
        result = {**REFERENCE[lab_id], "finding": finding}
        result["config"] = {**result["config"], "world_size": 4}
        moment = datetime(2026, 3, 1, 9, 30, tzinfo=timezone.utc)
        session.add(LabRun(lab_id=lab_id, params={"world_size": 4}, status=RunStatus.done, result=result,
                           created_at=moment, started_at=moment, finished_at=moment))
        session.commit()


def test_choose_prefers_the_local_run_and_keeps_the_reference():
    local = {"a": {"finding": "here"}, "b": None}
    reference = {"a": {"finding": "committed"}, "b": {"finding": "committed b"}, "c": "not a result"}
    assert choose(local, reference) == {"a": {"finding": "here"}, "b": {"finding": "committed b"}}
    run = LabRun(lab_id="a", status="done", result={"finding": "here"}, created_at=datetime(2026, 3, 1, tzinfo=timezone.utc),
                 finished_at=datetime(2026, 3, 1, 9, tzinfo=timezone.utc))
    both = LabFinding("a", run, reference["a"])
    assert both.result == {"finding": "here"} and not both.is_reference
    assert both.measured_at == datetime(2026, 3, 1, 9, tzinfo=timezone.utc)
    only = LabFinding("b", None, reference["b"])
    assert only.is_reference and only.measured_at is None  # no date recorded: none invented
    assert measured_date({"measured_at": "2026-02-01T10:00:00+00:00"}) == datetime(2026, 2, 1, 10, tzinfo=timezone.utc)
    assert measured_date({"measured_at": "yesterday"}) is None


def test_measured_where_names_device_ranks_backend_torch_model_and_strategies():
    on_cpu = {"device": "cpu", "world_size": 2, "world_sizes": [2], "backend": "gloo", "torch_version": "2.13.0+cpu",
              "cuda_version": None, "gpu_name": None, "size": "tiny", "strategy": "ddp, zero3", "strategies": ["ddp", "zero3"]}
    assert measured_where({"config": on_cpu}) == ["cpu", "world size 2", "gloo backend", "torch 2.13.0+cpu", "tiny model",
                                                  "strategies ddp, zero3"]
    on_gpu = {**on_cpu, "device": "cuda", "gpu_name": "NVIDIA H200", "cuda_version": "13.0", "world_sizes": [1, 2],
              "backend": "nccl", "strategies": ["zero3"], "strategy": "zero3"}
    assert measured_where({"config": on_gpu}) == ["cuda (NVIDIA H200)", "world sizes 1, 2", "nccl backend",
                                                  "torch 2.13.0+cpu", "CUDA 13.0", "tiny model", "strategy zero3"]
    assert measured_where({}) == [] and measured_where({"config": "odd"}) == [] and measured_where(None) == []
    assert measured_where({"config": {"device": ["cpu"], "world_size": True, "size": ""}}) == []


def test_a_fresh_install_shows_every_labs_committed_finding(client):
    page = text(client.get("/labs"))
    assert "not run yet" not in page
    assert page.count("committed reference") == len(REFERENCE)
    assert page.count("Run it here") == len(REFERENCE)


def test_a_lab_page_shows_the_reference_with_where_it_was_measured(client):
    page = text(client.get("/labs/adam-optimizer-state"))
    assert "Not run here yet" in page and "Run it here" in page
    measured = REFERENCE["adam-optimizer-state"]["measured_at"][:10]  # the committed file's own date
    assert f"Committed reference, measured on cpu, world size 2, gloo backend, torch 2.13.0+cpu, tiny model, strategies ddp, zero3, {measured}" in page
    assert REFERENCE["adam-optimizer-state"]["finding"] in page


def test_a_local_run_is_the_latest_and_the_reference_stays_for_comparison(app, client):
    local_run(app, "adam-optimizer-state", "measured here at 4 ranks")
    page = text(client.get("/labs/adam-optimizer-state"))
    assert page.index("measured here at 4 ranks") < page.index("Committed reference, for comparison")
    assert REFERENCE["adam-optimizer-state"]["finding"] in page and "world size 4" in page
    index = text(client.get("/labs"))
    assert index.count("committed reference") == len(REFERENCE) - 1 and "run here" in index


def test_the_cards_answer_side_shows_the_reference_then_the_local_run(app, client):
    card = text(client.get("/questions/beta-adam"))
    assert "Measured: the claim held." in card and REFERENCE["adam-optimizer-state"]["finding"] in card
    measured = REFERENCE["adam-optimizer-state"]["measured_at"][:10]
    assert f"Committed reference, measured on cpu, world size 2, gloo backend, torch 2.13.0+cpu, tiny model, strategies ddp, zero3, {measured} · Run it here" in card
    local_run(app, "adam-optimizer-state", "measured here at 4 ranks")
    card = text(client.get("/questions/beta-adam"))
    assert "measured here at 4 ranks" in card and "Run here, measured on cpu, world size 4, gloo backend, torch 2.13.0+cpu, tiny model, strategies ddp, zero3, 2026-03-01" in card


def test_export_anki_takes_the_same_rule_and_dates_a_local_run(app, runner, tmp_path):
    local_run(app, "adam-optimizer-state", "measured here at 4 ranks")
    out = tmp_path / "out"
    out.mkdir()
    shutil.copy(REPO / "exports" / "lab-results.json", out / "lab-results.json")
    result = runner.invoke(args=["export-anki", "--out", str(out)])
    assert result.exit_code == 0, result.output
    carried = json.loads((out / "lab-results.json").read_text(encoding="utf-8"))
    assert carried["adam-optimizer-state"]["finding"] == "measured here at 4 ranks"
    assert carried["adam-optimizer-state"]["measured_at"] == "2026-03-01T09:30:00+00:00"
    assert carried["what-fsdp-shards"] == REFERENCE["what-fsdp-shards"]


@pytest.mark.parametrize("content", ["[]", "null", '"x"', "{", '{"adam-optimizer-state": ["not", "a result"]}'])
def test_a_reference_file_that_is_not_lab_results_counts_as_none(app, client, csrf_token, content):
    # Valid JSON of the wrong shape is as unreadable as a truncated file: no reference, not a 500.
    (Path(app.config["EXPORTS_DIR"]) / "lab-results.json").write_text(content, encoding="utf-8")
    labs = client.get("/labs")
    assert labs.status_code == 200 and "committed reference" not in text(labs)
    lab = client.get("/labs/adam-optimizer-state")
    assert lab.status_code == 200 and "Not run yet: press “Run this lab”" in text(lab)
    card = client.get("/questions/beta-adam")
    assert card.status_code == 200
    assert "Measured:" not in text(card) and "Run this lab →" in text(card)
    study = client.get("/study").get_data(as_text=True)
    shown = {name: re.search(rf'name="{name}" value="(\d+)"', study).group(1) for name in ("card_id", "version")}
    answered = client.post("/study/answer", data={"csrf_token": csrf_token, **shown, "choice": "1"})
    assert answered.status_code == 200 and "Run this lab →" in text(answered)


ODD_FIELDS = [  # one field of a hand-edited entry with the wrong type, and words the pages must not show
    ({"table": {"columns": ["run", "bytes"], "rows": 5}}, []),
    ({"table": {"columns": ["run", "bytes"], "rows": [["zero3", 7], "a row that is a string", {"k": 1}]}}, []),
    ({"table": "a table that is a string"}, ["a table that is a string"]),
    ({"holds": "false"}, ["The claim held", "Measured: the claim held"]),
    ({"finding": ["a", "list"]}, ["['a', 'list']"]),
    ({"at_scale": {"7b": 1}}, ["{'7b': 1}"]),
    ({"config": {"device": {"odd": 1}, "world_size": [2], "backend": "gloo"}}, ["{'odd': 1}", "[2] ranks"]),
]


@pytest.mark.parametrize(("odd", "never_shown"), ODD_FIELDS)
def test_a_hand_edited_reference_entry_shows_what_it_can(app, client, odd, never_shown):
    entry = {**REFERENCE["adam-optimizer-state"], **odd}
    (Path(app.config["EXPORTS_DIR"]) / "lab-results.json").write_text(json.dumps({"adam-optimizer-state": entry}), encoding="utf-8")
    for url in ("/labs", "/labs/adam-optimizer-state", "/questions/beta-adam"):
        response = client.get(url)
        assert response.status_code == 200, url
        page = text(response)
        assert not [words for words in never_shown if words in page], url
    lab = text(client.get("/labs/adam-optimizer-state"))
    assert "Committed reference" in lab
    if "holds" in odd:  # only a JSON true holds
        assert "The claim did NOT hold." in lab and "did NOT hold" in text(client.get("/labs"))
    if "rows" in odd.get("table", {}):  # the rows that are lists stay, the others go
        table = client.get("/labs/adam-optimizer-state").get_data(as_text=True)
        rows = re.findall(r"<tr>(.*?)</tr>", table.split('class="lab-table"')[1].split("</table>")[0])
        body = [re.findall(r"<td>(.*?)</td>", row) for row in rows[1:]]
        assert body == ([["zero3", "7"]] if isinstance(odd["table"]["rows"], list) else [])
    if "config" in odd:
        assert "Committed reference, measured on gloo backend, 20" in lab  # then the date


@pytest.mark.parametrize(("reasons", "listed"), [([1, "kept"], ["kept"]), ("a string", [])])
def test_a_local_run_with_odd_fields_shows_what_it_can(app, client, reasons, listed):
    local_run(app, "adam-optimizer-state", "measured here at 4 ranks")
    with Session(get_engine(app)) as session:
        run = session.exec(select(LabRun)).one()
        run.result = {**run.result, "table": {"columns": ["a"], "rows": [[[1, 2]], [None], [True]]}, "reasons": reasons}
        session.add(run)
        session.commit()
    page = client.get("/labs/adam-optimizer-state")
    assert page.status_code == 200
    latest = page.get_data(as_text=True).split('id="latest-result"')[1].split('id="reference-result"')[0]
    assert re.findall(r"<td>(.*?)</td>", latest) == ["[1, 2]", "None", "True"]  # a list cell as its JSON text
    assert re.findall(r"<li>(.*?)</li>", latest) == listed
    assert "measured on cpu, world size 4, gloo backend, torch 2.13.0+cpu, tiny model" in text(page)
