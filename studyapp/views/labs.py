"""A page per lab from the catalogue: its claim, the questions it backs, how to run it, its results;
and the JSON API that runs it (through studyapp.lab_runs, never in this process).

    GET  /labs                          labs.index
    GET  /labs/<lab_id>                 labs.lab_page       claim, questions, "Run this lab", results
    GET  /labs/<lab_id>/results         labs.results        the results part alone (the page's JS swaps it in)
    GET  /labs/devices                  labs.devices        {"pending": ..., "options": HTML, "notes": HTML}: the
                                                            device choice as the lab process answered (the page's
                                                            JS polls it while that answer is pending)
    POST /labs/<lab_id>/runs            labs.start_run      world_size and device (cpu, or cuda when the lab
                                                            process sees a GPU): 202 {"run_id": ...}; a form post
                                                            redirects back (429 past the per-session limit, when
                                                            login is required)
    GET  /labs/runs/<run_id>            labs.run_status     {"status": ..., "result": {...}}
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import Any

from flask import Blueprint, abort, current_app, flash, jsonify, redirect, render_template, request, url_for
from markupsafe import Markup
from sqlmodel import Session, select

from sharding_lab.catalog import CATALOG, LabInfo, lab_info
from sharding_lab.labs.registry import LABS
from sharding_lab.run_config import DEVICES
from studyapp.auth import limit_lab_runs
from studyapp.csrf import FORM_FIELD
from studyapp.db import get_engine, get_session
from studyapp.lab_runs import RunStatus, app_worker, enqueue, notify_queued, world_sizes
from studyapp.lab_runs.devices import detection
from studyapp.lab_runs.findings import LabFinding, ShownResult, lab_findings
from studyapp.lab_runs.queue import ACTIVE, active_runs, aware, expected_seconds, queue_position, utcnow
from studyapp.models import Card, LabRun
from studyapp.safe_svg import safe_charts
from studyapp.views.forms import form_value, json_body

bp = Blueprint("labs", __name__, url_prefix="/labs")
PAST_RUNS_SHOWN = 20


def _wants_json() -> bool:
    return request.is_json or request.accept_mimetypes.best == "application/json"


def _lab_or_404(lab_id: str) -> LabInfo:
    lab = lab_info(lab_id)
    if lab is None:
        abort(404, description=f"There is no lab '{lab_id[:60]}'.")
    return lab


def findings(lab_id: str | None = None) -> dict[str, LabFinding]:
    """Per lab: its latest local run, else the committed reference in EXPORTS_DIR."""
    return lab_findings(get_session(), current_app.config.get("EXPORTS_DIR"), lab_id)


def card_lab(lab_id: str) -> dict[str, Any]:
    """What labs/_card_lab.html shows for a card's lab: the lab (None if not catalogued) and its
    finding (the latest local run, else the reference; None when neither exists)."""
    lab = lab_info(lab_id)
    return {"lab": lab, "finding": findings(lab_id).get(lab_id) if lab else None}


@bp.get("")
def index():
    return render_template("labs/index.html", labs=CATALOG, findings=findings())


@bp.get("/<lab_id>")
def lab_page(lab_id: str):
    lab = _lab_or_404(lab_id)
    cards = get_session().exec(select(Card).where(Card.lab == lab_id, Card.retired.is_(False)).order_by(Card.position)).all()
    synced = {card.question_id for card in cards}
    active = next(iter(active_runs(get_session(), lab_id)), None)
    return render_template(
        "labs/lab.html",
        lab=lab,
        cards=cards,
        unsynced=[qid for qid in lab.questions if qid not in synced],
        runnable=lab_id in LABS,
        rank_choices=[RankChoice(size, LABS[lab_id].world_sizes(size)) for size in world_sizes()] if lab_id in LABS else [],
        active=active,
        **(_device_choice() if lab_id in LABS else {"detection": None, "cuda_notes": []}),
        **_results(lab_id),
    )


@dataclass(frozen=True)
class RankChoice:
    """A world size N the form offers, with the rank counts the lab's runs use at N (N and 2N for a
    scaling lab): the choice says what it starts."""

    world_size: int
    ranks: tuple[int, ...]

    @property
    def label(self) -> str:
        if self.ranks == (self.world_size,):
            return str(self.world_size)
        return f"{self.world_size} (runs at {_joined(self.ranks)} ranks)"


def _joined(numbers: tuple[int, ...]) -> str:
    """1, 2 and 4."""
    words = [str(n) for n in numbers]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def run_ranks(lab_id: str, run: LabRun) -> str:
    """The rank counts a past run used ("2, 4"), from the world size it asked for; blank when its
    parameters predate world sizes or the lab is gone."""
    asked = run.params.get("world_size") if isinstance(run.params, dict) else None
    if lab_id not in LABS or type(asked) is not int:
        return str(asked or "")
    return ", ".join(map(str, LABS[lab_id].world_sizes(asked)))


def _device_choice() -> dict[str, Any]:
    """What labs/_device_options.html and _device_notes.html show: the detection so far (asked of a lab
    process, never of this one) and, where it found a GPU, where each world size's ranks would run."""
    found = detection()
    on_gpu = found.devices is not None and "cuda" in found.devices.devices
    return {"detection": found,
            "cuda_notes": [found.devices.placement_note("cuda", size) for size in world_sizes()] if on_gpu else []}


@bp.get("/devices")
def devices():
    choice = _device_choice()
    return jsonify(pending=choice["detection"].pending,
                   options=render_template("labs/_device_options.html", **choice),
                   notes=render_template("labs/_device_notes.html", **choice))


@bp.get("/<lab_id>/results")
def results(lab_id: str):
    lab = _lab_or_404(lab_id)
    return render_template("labs/_results.html", lab=lab, **_results(lab_id))


def _results(lab_id: str) -> dict[str, Any]:
    runs = get_session().exec(
        select(LabRun).where(LabRun.lab_id == lab_id).order_by(LabRun.id.desc()).limit(PAST_RUNS_SHOWN)
    ).all()
    finding = findings(lab_id).get(lab_id)
    latest = finding.local if finding and not finding.is_reference else None
    result = finding.result if latest is not None else None
    return {
        "latest": latest,
        "result": ShownResult.parse(result) if result is not None else None,
        "reference": ShownResult.parse(finding.reference) if finding and finding.reference is not None else None,
        "charts": shown_charts(result.get("charts")) if result else [],
        "runs": runs,
        "run_ranks": {run.id: run_ranks(lab_id, run) for run in runs},
    }


@dataclass(frozen=True)
class ShownChart:
    """A run's chart as labs/_results.html shows it: the SVG cleaned by studyapp.safe_svg (None when
    refused), its title, and its figures as text."""

    name: str
    svg: Markup | None
    title: str
    figures: list[str]  # each mark's hover <title> ("ddp: params 939 KiB"), in the order drawn


def shown_charts(charts: object) -> list[ShownChart]:
    """The run's charts with a text alternative. A sharding_lab.svg chart keeps its figures only in the
    <title> of each bar segment or marker, which a mouse shows on hover; the run stores no other copy of
    them (its measurements are the engine's raw JSON), so they are read back from those titles."""
    shown = []
    for name, svg in safe_charts(charts):
        if svg is None:
            shown.append(ShownChart(name, None, name, []))
            continue
        root = ET.fromstring(str(svg))  # well-formed: safe_svg rebuilt it from parsed XML
        marks = [element for element in root.iter() if element is not root]
        figures = [text for mark in marks if (text := (mark.findtext("title") or "").strip())]
        shown.append(ShownChart(name, svg, (root.findtext("title") or "").strip() or name, figures))
    return shown


@bp.post("/<lab_id>/runs")
@limit_lab_runs  # per session, when served beyond loopback
def start_run(lab_id: str):
    if lab_id not in LABS:  # only registered labs run, whatever the catalogue lists
        abort(404, description=f"There is no runnable lab '{lab_id[:60]}'.")
    asked = _run_request()
    run = enqueue(get_engine(), lab_id, asked.world_size, asked.device)
    notify_queued(current_app._get_current_object())
    if _wants_json():
        response = jsonify(run_id=run.id, status=run.status, url=url_for("labs.run_status", run_id=run.id))
        return response, 202, {"Location": url_for("labs.run_status", run_id=run.id)}
    flash(f"Run #{run.id} is {run.status}: its result appears below when it is done.")
    return redirect(url_for("labs.lab_page", lab_id=lab_id), code=303)


@dataclass(frozen=True)
class RunRequest:
    """What a POST to start_run may ask for."""

    world_size: int  # one of LAB_WORLD_SIZES
    device: str  # "cpu", or "cuda" when the lab process sees a GPU


def _run_request() -> RunRequest:
    """The parameters a run takes, world_size and device, from a JSON body or the form; anything else
    is refused (400, or 409 for cuda while the lab process is still being asked for its GPUs)."""
    if request.is_json:
        body = json_body()
        if not isinstance(body, dict):
            abort(400, description="The body must be a JSON object such as {\"world_size\": 2, \"device\": \"cpu\"}.")
    else:
        body = {key: form_value(key) for key in request.form if key != FORM_FIELD}
    unknown = sorted(set(body) - set(RunRequest.__dataclass_fields__))
    if unknown:
        abort(400, description=f"Unknown parameter(s): {', '.join(name[:40] for name in unknown[:5])}; "
              "a lab run takes only world_size and device.")
    return RunRequest(world_size=_world_size(body), device=_device(body.get("device", "cpu")))


def _world_size(body: dict[str, Any]) -> int:
    allowed = world_sizes()
    raw = body.get("world_size", allowed[0])
    if isinstance(raw, str) and raw.strip().isascii() and raw.strip().isdigit() and len(raw.strip()) < 4:
        raw = int(raw.strip())
    if type(raw) is not int or raw not in allowed:  # not 2.0, not true
        abort(400, description=f"world_size must be one of {', '.join(map(str, allowed))}, got {str(raw)[:40]!r}.")
    return raw


def _device(raw: Any) -> str:
    """cpu always; cuda only when the lab process was found to see a GPU (asked, never guessed here)."""
    if not isinstance(raw, str) or raw.strip() not in DEVICES:
        abort(400, description=f"device must be one of {', '.join(DEVICES)}, got {str(raw)[:40]!r}.")
    device = raw.strip()
    if device == "cpu":
        return device
    found = detection()
    if found.pending:
        abort(409, description=f"device {device} asked while a lab process is still looking for GPUs on this "
              "machine (detection is under way); try again in a few seconds, or use cpu.")
    if found.error:
        abort(400, description=f"device {device} asked, but {found.error}; use cpu.")
    refusal = found.devices.refusal(device)
    if refusal:
        abort(400, description=f"{refusal}.")
    return device


@bp.get("/runs/<run_id>")
def run_status(run_id: str):
    session = get_session()
    run = find_run(session, run_id)
    if run is None:
        abort(404, description=f"There is no lab run {run_id}.")
    return jsonify(run_json(session, run))


def find_run(session: Session, run_id: str) -> LabRun | None:
    """The run a status URL names. The id is read here rather than by an `<int:>` converter, whose
    mismatch (`/labs/runs/abc`) would be a 404 of no route, an HTML page, on a JSON API."""
    if not (run_id.isascii() and run_id.isdecimal()) or int(run_id) >= 2**31:
        return None
    return session.get(LabRun, int(run_id))


def run_json(session: Session, run: LabRun) -> dict[str, Any]:
    """The JSON API's view of a run (a lab's or a plan simulation's): status and, once over, the lab's JSON
    or {"error": ...}; `unstored` while this process's worker waits for the database to take its result."""
    started, finished = aware(run.started_at), aware(run.finished_at)
    body: dict[str, Any] = {
        "run_id": run.id,
        "lab_id": run.lab_id,
        "status": run.status,
        "params": run.params,
        "created_at": aware(run.created_at).isoformat(),
        "started_at": started.isoformat() if started else None,
        "finished_at": finished.isoformat() if finished else None,
        "elapsed_s": round(((finished or utcnow()) - started).total_seconds(), 1) if started else None,
        "result": None,
    }
    if run.status in ACTIVE:
        body["expected_s"] = expected_seconds(session, run)
        worker = app_worker(current_app)
        if worker is not None and worker.unstored is not None and worker.unstored.run_id == run.id:
            body["unstored"] = worker.unstored.reason  # finished; the database has not taken its result yet
    if run.status == RunStatus.queued:
        body["queue_position"] = queue_position(session, run)
    elif run.status == RunStatus.done:
        body["result"] = run.result
    elif run.status == RunStatus.failed:
        body["result"] = {"error": run.error or "failed"}
        body["error"] = run.error or "failed"
    return body
