"""Will it fit? The planner's inputs as a GET form (the URL is the question, so an answer can be shared),
the analytic answer for every strategy at once, and the exact one from the lab worker.

    GET  /plan                          plan.index              the form and the analytic answer (400: the
                                                                form again, each bad field named)
    GET  /plan/results                  plan.results            the answer part alone (the page's JS swaps it in)
    POST /plan/simulations              plan.start_simulation   202 {"run_id", "url"}; a form post redirects back
    GET  /plan/simulations/<run_id>     plan.simulation_status  {"status", ...} as labs.run_status

The analytic figures come from `sharding_lab.planner` (torch-free, instant). The simulation runs in the lab
worker's queue as its own job kind (studyapp.lab_runs.plan_runs), never in this process.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from flask import Blueprint, abort, current_app, flash, jsonify, redirect, render_template, request, url_for
from werkzeug.datastructures import MultiDict

from sharding_lab.model_config import SIZES
from sharding_lab.plan_command import simulation_unavailable
from sharding_lab.planner import (
    BOUNDS,
    GB,
    Category,
    Mesh,
    ModelShape,
    Plan,
    PlanRequest,
    filing_difference,
    padding_note,
    plan_analytic,
    with_strategy,
)
from sharding_lab.planner_comm import NO_COLLECTIVES, WIRE_DERIVATION
from sharding_lab.strategies import STRATEGIES, Strategy
from sharding_lab.units import decimal_bytes, human_bytes
from studyapp.auth import limit_lab_runs
from studyapp.csrf import FORM_FIELD
from studyapp.db import get_engine, get_session
from studyapp.lab_runs import RunStatus, notify_queued
from studyapp.lab_runs.plan_runs import (
    enqueue_simulation,
    latest_simulation,
    simulated_plans,
    simulation_params,
)
from studyapp.lab_runs.queue import PLAN_SIMULATION
from studyapp.plan_chart import ChartBar, memory_chart
from studyapp.views.forms import json_body
from studyapp.views.labs import find_run, run_json  # a lab run's JSON: one shape for both job kinds

bp = Blueprint("plan", __name__, url_prefix="/plan")

CUSTOM = "custom"  # the inputs' bounds (MAX_*) are the planner's: one GET's work is bounded as the CLI's


@dataclass(frozen=True)
class Field:
    """One input: its query name, its label on the page, and its default."""

    name: str
    label: str
    default: str
    kind: str = "int"  # int, float, flag, choice, mesh
    minimum: float = 1
    maximum: float = BOUNDS.dim
    hint: str = ""
    positive: bool = False  # a float that must be above 0 (its minimum then is only for the range message)


_SEVEN_B = SIZES["7b"]
FIELDS: dict[str, Field] = {f.name: f for f in (
    Field("size", "Model", "7b", "choice", hint="a named size, or “custom shape” to use the shape below"),
    Field("layers", "Layers", str(_SEVEN_B.n_layer), maximum=BOUNDS.layers),
    Field("width", "Width", str(_SEVEN_B.n_embd)),
    Field("heads", "Heads", str(_SEVEN_B.n_head), hint="must divide the width"),
    Field("vocab", "Vocabulary", str(_SEVEN_B.vocab_size)),
    Field("seq_len", "Model sequence length", str(_SEVEN_B.block_size), hint="the longest sequence it takes"),
    Field("tied", "Tied embedding and head", "", "flag"),
    Field("gpus", "GPUs", "64", maximum=BOUNDS.gpus),
    Field("mesh", "HSDP mesh (replicas x shards)", "", "mesh",
          hint="optional, e.g. 8x8; must make up the GPUs (an empty GPUs field takes it)"),
    Field("gpu_memory_gb", "GPU memory (GB)", "80", "float", minimum=0, maximum=BOUNDS.gpu_memory_gb,
          hint="decimal GB per GPU: an H100 has 85.5 (planning with its label's 80 leaves 6.4% unused), an H200 150.8", positive=True),
    Field("headroom", "Headroom (%)", "10", "float", minimum=0, maximum=99,
          hint="kept free for the CUDA context, NCCL and the allocator"),
    Field("micro_batch", "Micro-batch", "1", maximum=BOUNDS.micro_batch, hint="sequences per GPU per forward"),
    Field("seq", "Sequence", "", hint="tokens per sequence; empty: the model's sequence length"),
    Field("strategy", "Your strategy", "zero3", "choice", hint="its verdict comes first; all four are shown"),
    Field("grad_accum", "Gradient-accumulation steps", "1", maximum=BOUNDS.grad_accum),
    Field("mixed_precision", "bf16 mixed precision", "", "flag"),
    Field("activation_checkpointing", "Activation checkpointing (per block)", "", "flag"),
    Field("cpu_offload", "CPU offload (FSDP2's CPUOffloadPolicy)", "", "flag"),
)}
SHAPE_FIELDS = ("layers", "width", "heads", "vocab", "seq_len")
SIZE_CHOICES = (*SIZES, CUSTOM)
DECIMAL = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
TRUE = ("on", "1", "true", "yes")
FALSE = ("", "0", "false", "no", "off")


@dataclass
class Inputs:
    """The form as read: every field's canonical text (what the form shows and the URL carries), the
    errors by field, and the request they make when there are none."""

    values: dict[str, str]
    errors: dict[str, str] = field(default_factory=dict)
    request: PlanRequest | None = None

    def query(self) -> dict[str, str]:
        """The inputs for a URL: flags only when on, empty optional fields left out."""
        return {name: value for name, value in self.values.items() if value != ""}


def _n(value: float) -> str:
    return f"{int(value):,}" if value == int(value) else f"{value:g}"


def _number(f: Field, raw: str, errors: dict[str, str]) -> str:
    text = raw.strip()
    if f.kind == "int":
        if not text.isascii() or not text.isdigit() or len(text) > 9:
            errors[f.name] = f"{f.label} must be a whole number from {_n(f.minimum)} to {_n(f.maximum)}, got {text[:40]!r}."
            return text[:40]
        value: float = int(text)
        canonical = str(int(text))
    else:
        # A decimal in ASCII digits: float() would also take other scripts' digits, "1_000", "inf" and "nan".
        value = float(text) + 0.0 if len(text) <= 40 and DECIMAL.fullmatch(text) else math.nan  # -0 reads as 0
        if not math.isfinite(value):  # 1e999 too
            errors[f.name] = f"{f.label} must be a number, got {text[:40]!r}."
            return text[:40]
        # The text as typed (the request is built from it, and the verdict repeats it), but -0 as 0.
        canonical = text.lstrip("-") if value == 0 else text
    if f.positive and not value > 0:
        errors[f.name] = f"{f.label} must be positive, got {canonical}."
    elif not f.minimum <= value <= f.maximum:
        errors[f.name] = f"{f.label} must be from {_n(f.minimum)} to {_n(f.maximum)}, got {canonical}."
    return canonical


def read_inputs(source: MultiDict) -> Inputs:
    """Parse the form strictly: every bad field gets a message that names it; nothing raises."""
    values: dict[str, str] = {}
    errors: dict[str, str] = {}
    fresh = not any(name in source for name in FIELDS)  # no question asked yet: the defaults
    size = (source.get("size", FIELDS["size"].default) or "").strip()
    named = SIZES.get(size)
    for f in FIELDS.values():
        raw = source.get(f.name)
        if raw is None and (fresh or f.kind != "flag"):
            raw = f.default
        raw = raw or ""
        if named is not None and f.name in SHAPE_FIELDS:  # a named size shows its own shape
            raw = str({"layers": named.n_layer, "width": named.n_embd, "heads": named.n_head,
                       "vocab": named.vocab_size, "seq_len": named.block_size}[f.name])
        if f.kind == "flag":
            if raw.strip().lower() not in TRUE + FALSE:
                errors[f.name] = f"{f.label} is a checkbox: on or off, got {raw[:40]!r}."
            values[f.name] = "on" if raw.strip().lower() in TRUE else ""
        elif f.kind == "choice":
            choices = SIZE_CHOICES if f.name == "size" else tuple(str(s) for s in STRATEGIES)
            if raw.strip() not in choices:
                errors[f.name] = f"{f.label} must be one of {', '.join(choices)}, got {raw[:40]!r}."
            values[f.name] = raw.strip()[:40]
        elif f.kind == "mesh":
            values[f.name] = _mesh_text(raw, errors)
        elif raw.strip() == "" and f.name == "seq":
            values[f.name] = ""
        elif raw.strip() == "":
            errors[f.name] = f"{f.label} is required."
            values[f.name] = ""
        else:
            values[f.name] = _number(f, raw, errors)
    inputs = Inputs(values, errors)
    _check_together(inputs)
    for f in FIELDS.values():  # after the joint rules, which may drop a GPUs error the mesh settles
        given = list(dict.fromkeys(source.getlist(f.name)))
        if len(given) > 1:  # a hand-edited URL: which one was meant is not ours to guess
            shown = ", ".join(repr(text[:40]) for text in given[:3])
            errors[f.name] = f"{f.label} is given {len(given)} different ways ({shown}): give it once."
    inputs.errors = {name: errors[name] for name in [*FIELDS, "request"] if name in errors}  # in the form's order
    if not inputs.errors:
        inputs.request = _request(inputs)
    return inputs


def _mesh_text(raw: str, errors: dict[str, str]) -> str:
    text = raw.strip().lower().replace(" ", "").replace("×", "x").replace("*", "x")
    if text == "":
        return ""
    parts = text.split("x")
    if len(parts) != 2 or not all(p.isascii() and p.isdigit() and 0 < len(p) < 7 for p in parts):
        errors["mesh"] = f"HSDP mesh must be REPLICASxSHARDS such as 8x8, got {raw[:40]!r}."
        return raw.strip()[:40]
    replicas, shards = int(parts[0]), int(parts[1])
    if replicas < 1 or shards < 1:
        errors["mesh"] = f"HSDP mesh needs at least 1 x 1, got {text}."
    return f"{replicas}x{shards}"


def _check_together(inputs: Inputs) -> None:
    """The rules that join fields, each charged to the field a person would change."""
    v, errors = inputs.values, inputs.errors

    def number(name: str) -> int | None:
        return int(v[name]) if name not in errors and v[name].isdigit() else None

    width, heads = number("width"), number("heads")
    if width and heads and width % heads:
        errors.setdefault("heads", f"Heads ({heads}) must divide the width ({width}).")
    mesh_gpus = math.prod(map(int, v["mesh"].split("x"))) if v["mesh"] and "mesh" not in errors else None
    if mesh_gpus and v["gpus"] == "":  # only the mesh given: it says how many GPUs
        if mesh_gpus > BOUNDS.gpus:
            errors["mesh"] = f"HSDP mesh {v['mesh']} is {mesh_gpus:,} GPUs, more than {BOUNDS.gpus:,}."
        else:
            errors.pop("gpus", None)
            v["gpus"] = str(mesh_gpus)
    gpus = number("gpus")
    if mesh_gpus and "mesh" not in errors and gpus and mesh_gpus != gpus:
        errors["mesh"] = (f"HSDP mesh {v['mesh']} is {mesh_gpus:,} GPUs, but GPUs is {gpus:,}: "
                          "replicas x shards must make up the GPUs.")
    seq, seq_len = number("seq"), number("seq_len")
    if seq and seq_len and seq > seq_len:
        errors.setdefault("seq", f"Sequence ({seq}) exceeds the model's sequence length ({seq_len}).")
    strategy = v["strategy"]
    if "strategy" not in errors and not Strategy.parse(strategy).fully_sharded:
        if v["cpu_offload"]:
            errors.setdefault("cpu_offload", f"CPU offload is FSDP2's (zero2, zero3): {strategy} does not "
                              "shard parameters. Choose zero2 or zero3, or turn offload off.")
        if v["mesh"] and "mesh" not in errors and int(v["mesh"].split("x")[0]) > 1:
            errors.setdefault("mesh", f"An HSDP mesh (replicas > 1) is FSDP2's (zero2, zero3), not {strategy}.")


def _request(inputs: Inputs) -> PlanRequest | None:
    v = inputs.values
    try:
        if v["size"] != CUSTOM:
            model = ModelShape.named(v["size"])
            if v["tied"]:
                model = ModelShape(model.layers, model.width, model.heads, model.vocab, model.seq_len,
                                   tied=True, bias=model.bias, name=model.name)
        else:
            model = ModelShape(*(int(v[name]) for name in SHAPE_FIELDS), tied=bool(v["tied"]))
        mesh = Mesh.parse(v["mesh"]) if v["mesh"] else Mesh.of(int(v["gpus"]))
        return PlanRequest(
            model, mesh, float(v["gpu_memory_gb"]),
            micro_batch=int(v["micro_batch"]), seq=int(v["seq"]) if v["seq"] else None,
            strategy=Strategy.parse(v["strategy"]), mixed_precision=bool(v["mixed_precision"]),
            activation_checkpointing=bool(v["activation_checkpointing"]), cpu_offload=bool(v["cpu_offload"]),
            grad_accum_steps=int(v["grad_accum"]), headroom=float(v["headroom"]) / 100,
        )
    except ValueError as error:  # a rule the planner has and the checks above do not: still the form's fault
        inputs.errors["request"] = f"The planner refused these inputs: {error}."
        return None


# --- the answer -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Column:
    """One strategy's analytic plan, or why there is none (offload and HSDP are FSDP2's)."""

    strategy: Strategy
    plan: Plan | None
    not_applicable: str = ""


def analytic_columns(request: PlanRequest) -> list[Column]:
    columns = []
    for strategy in STRATEGIES:
        try:
            columns.append(Column(strategy, plan_analytic(with_strategy(request, strategy))))
        except ValueError as error:
            columns.append(Column(strategy, None, str(error)))
    return columns


def _simulation_state(inputs: Inputs) -> dict[str, Any]:
    params = simulation_params(inputs.values)
    run = latest_simulation(get_session(), params)
    request = inputs.request
    simulable = {str(s): simulation_unavailable(with_strategy(request, s))
                 for s in STRATEGIES if s.fully_sharded and _applicable(request, s)}
    return {
        "run": run,
        "active": run is not None and run.status in (RunStatus.queued, RunStatus.running),
        "simulated": simulated_plans(run),
        "unavailable": {name: why for name, why in simulable.items() if why},
        "can_simulate": any(why is None for why in simulable.values()),
        "params": params,
    }


def _applicable(request: PlanRequest, strategy: Strategy) -> bool:
    try:
        with_strategy(request, strategy)
    except ValueError:
        return False
    return True


def answer(inputs: Inputs) -> dict[str, Any]:
    """Everything plan/_results.html shows for a valid request."""
    request = inputs.request
    columns = analytic_columns(request)
    simulation = _simulation_state(inputs)
    analytic = {str(c.strategy): c.plan.peak.bytes_by_category() for c in columns if c.plan}
    simulated = {name: {k: v["bytes"] for k, v in sim["peak"]["categories"].items()}
                 for name, sim in simulation["simulated"].items() if "peak" in sim}
    bars = [ChartBar(name, by_category, "analytic") for name, by_category in analytic.items()]
    bars += [ChartBar(f"{name} sim", by_category, "simulated") for name, by_category in simulated.items()]
    simulation["filing"] = {  # where the two methods file bytes differently, said once per strategy
        name: filing_difference(analytic[name], by_category, unit=decimal_bytes)
        for name, by_category in simulated.items() if name in analytic
    }
    methods = "analytic and simulated" if any(bar.method == "simulated" for bar in bars) else "analytic"
    title = f"Per-GPU peak memory by strategy ({methods}) against {inputs.values['gpu_memory_gb']} GB per GPU"
    chosen = next(c for c in columns if c.strategy is request.strategy)
    left_out: dict[str, list[str]] = {}  # each caveat once, with the strategies it applies to
    for column in columns:
        for text in column.plan.leaves_out if column.plan else ():
            left_out.setdefault(text, []).append(str(column.strategy))
    return {
        "plan_request": request,
        "left_out": list(left_out.items()),
        "columns": columns,
        "chosen": chosen,
        "categories": list(Category),
        "chart": memory_chart(bars, [str(c) for c in Category], gpu_bytes=request.gpu_memory_bytes,
                              usable_bytes=request.usable_bytes, title=title),
        "simulation": simulation,
        "wire_derivation": WIRE_DERIVATION,
        "no_collectives": NO_COLLECTIVES,
        # Where FSDP2's padding is a material part of a peak (more GPUs than a tensor's rows): how much, and why.
        "padding_notes": {str(c.strategy): note for c in columns
                          if c.plan and (note := padding_note(c.plan, decimal_bytes))},
        "decimal_bytes": decimal_bytes,
        "human_bytes": human_bytes,
        "GB": GB,
    }


def _page(inputs: Inputs, template: str):
    context: dict[str, Any] = {
        "inputs": inputs, "fields": FIELDS, "size_choices": SIZE_CHOICES, "strategies": STRATEGIES,
        "sizes": SIZES, "custom": CUSTOM,
    }
    if inputs.errors:
        return render_template(template, **context), 400
    context.update(answer(inputs))
    return render_template(template, **context)


@bp.get("")
def index():
    return _page(read_inputs(request.args), "plan/index.html")


@bp.get("/results")
def results():
    return _page(read_inputs(request.args), "plan/_results.html")


def _wants_json() -> bool:
    return request.is_json or request.accept_mimetypes.best == "application/json"


@bp.post("/simulations")
@limit_lab_runs  # per session, when served beyond loopback: as a lab run
def start_simulation():
    if request.is_json:
        body = json_body()
        if not isinstance(body, dict) or not all(isinstance(v, str) for v in body.values()):
            abort(400, description='The body must be a JSON object of the form\'s fields as strings, e.g. {"size": "7b"}.')
        source = MultiDict(body)
    else:
        source = MultiDict([(k, v) for k, v in request.form.items(multi=True) if k != FORM_FIELD])
    inputs = read_inputs(source)
    if inputs.errors:
        abort(400, description=" ".join(inputs.errors.values()))
    simulation = _simulation_state(inputs)
    if not simulation["can_simulate"]:
        abort(400, description="The simulation cannot answer these inputs: "
              + "; ".join(f"{k}: {v}" for k, v in simulation["unavailable"].items()) + ".")
    run = enqueue_simulation(get_engine(), simulation["params"])
    notify_queued(current_app._get_current_object())
    status_url = url_for("plan.simulation_status", run_id=run.id)
    if _wants_json():
        return jsonify(run_id=run.id, status=run.status, url=status_url), 202, {"Location": status_url}
    flash(f"Simulation #{run.id} is {run.status}: its column appears beside the analytic one when it is done.")
    return redirect(url_for("plan.index", **inputs.query()), code=303)


@bp.get("/simulations/<run_id>")
def simulation_status(run_id: str):
    session = get_session()
    run = find_run(session, run_id)
    if run is None or run.lab_id != PLAN_SIMULATION:
        abort(404, description=f"There is no plan simulation {run_id}.")
    return jsonify(run_json(session, run))
