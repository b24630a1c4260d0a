"""Plan simulations: the "Will it fit?" page's exact answer, as a job kind in the lab-run queue.

A plan simulation is a LabRun row whose `lab_id` is PLAN_SIMULATION (a name no lab can take: labs are
slugs, this has a colon) and whose `params` are the planner inputs that change the simulated bytes
(`SIMULATION_FIELDS`: GPU memory, headroom and the chosen strategy do not, so the page reuses one
simulation for them all). The worker claims it like any run and runs

    python -m sharding_lab.cli plan ... --strategy all --simulate --json

in a process of its own (the web process never imports torch), where `sharding_lab.cli` calls the
engine's FSDP2 simulation for each strategy it can simulate. The stored result is that report's
per-strategy "simulation" entries (a planner `plan_json`, or {"unavailable": why}).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from studyapp.lab_runs.process import Outcome, run_json_process
from studyapp.lab_runs.queue import ACTIVE, PLAN_SIMULATION, utcnow
from studyapp.models import LabRun, RunStatus

# The inputs a simulation depends on, as the page's query names them (its params, in this order).
SIMULATION_FIELDS: tuple[str, ...] = (
    "size", "layers", "width", "heads", "vocab", "seq_len", "tied", "gpus", "mesh", "micro_batch", "seq",
    "mixed_precision", "activation_checkpointing", "cpu_offload", "grad_accum",
)
RECENT_SIMULATIONS = 200  # how many recent simulations the page looks through for its inputs'
_FLAGS = ("tied", "mixed_precision", "activation_checkpointing", "cpu_offload")


def simulation_params(inputs: Mapping[str, str]) -> dict[str, str]:
    """The stored parameters of a simulation: the canonical inputs it depends on (strings, as in the URL)."""
    return {name: str(inputs.get(name, "")) for name in SIMULATION_FIELDS}


def plan_argv(command: Sequence[str], params: Mapping[str, str]) -> list[str]:
    """`sharding-lab plan` for these (already validated) parameters, every strategy, simulated, as JSON.
    A fixed argv list, never a shell: each value is checked to be a whole number, a size name or a mesh."""
    def number(name: str) -> str:
        value = params[name]
        if not value.isascii() or not value.isdigit():
            raise ValueError(f"{name} must be a whole number, got {value!r}")
        return value

    argv = [*command, "plan"]
    if params["size"] != "custom":
        if not params["size"].replace("-", "").isalnum():
            raise ValueError(f"not a size name: {params['size']!r}")
        argv += ["--size", params["size"]]
    else:
        argv += [item for name in ("layers", "width", "heads", "vocab", "seq_len")
                 for item in (f"--{name.replace('_', '-')}", number(name))]
    if params["mesh"]:
        replicas, shards = params["mesh"].split("x")
        argv += ["--mesh", f"{int(replicas)}x{int(shards)}"]
    else:
        argv += ["--gpus", number("gpus")]
    argv += ["--micro-batch", number("micro_batch"), "--grad-accum", number("grad_accum")]
    if params["seq"]:  # empty: the model's own sequence length
        argv += ["--seq", number("seq")]
    argv += [f"--{name.replace('_', '-')}" for name in _FLAGS if params.get(name) == "on"]
    return [*argv, "--strategy", "all", "--simulate", "--json"]


def enqueue_simulation(engine: Engine, params: Mapping[str, str]) -> LabRun:
    """Queue a plan simulation; the same parameters already waiting or running is that run."""
    params = dict(params)
    with Session(engine, expire_on_commit=False) as session:
        active = select(LabRun).where(LabRun.lab_id == PLAN_SIMULATION, LabRun.status.in_(ACTIVE)).order_by(LabRun.id)
        for run in session.exec(active).all():
            if run.params == params:
                return run
        run = LabRun(lab_id=PLAN_SIMULATION, params=params, status=RunStatus.queued, created_at=utcnow())
        session.add(run)
        session.commit()
        return run


def latest_simulation(session: Session, params: Mapping[str, str]) -> LabRun | None:
    """The newest simulation of these parameters that is waiting, running or done (a failed one only
    when it is the newest: the page says why)."""
    query = (
        select(LabRun).where(LabRun.lab_id == PLAN_SIMULATION).order_by(LabRun.id.desc()).limit(RECENT_SIMULATIONS)
    )
    for run in session.exec(query).all():
        if run.params == dict(params):
            return run
    return None


def simulation_outcome(
    command: Sequence[str],
    run: LabRun,
    timeout_s: float,
    on_start: Callable[[subprocess.Popen], None] | None = None,
) -> Outcome:
    """Run one plan simulation to its end; whatever goes wrong is a failed outcome, never an exception."""
    try:
        outcome = run_json_process(plan_argv(command, run.params), timeout_s, on_start=on_start,
                                   stopped="the simulation was stopped", no_json="no plan JSON")
    except (OSError, ValueError, KeyError) as error:
        return Outcome(RunStatus.failed, error=f"could not start the simulation: {error}")
    if outcome.result is None:
        return outcome
    try:
        strategies = outcome.result["strategies"]
        simulations = {name: entry["simulation"] for name, entry in strategies.items() if "simulation" in entry}
    except (KeyError, TypeError, AttributeError):
        return Outcome(RunStatus.failed, error="no plan JSON: the report has no strategies.")
    return Outcome(RunStatus.done, result={"lab": PLAN_SIMULATION, "simulations": simulations})


def simulated_plans(run: LabRun | None) -> dict[str, dict[str, Any]]:
    """Per strategy, a done run's simulated plan (`plan_json`) or {"unavailable": why}."""
    if run is None or run.status != RunStatus.done or not isinstance(run.result, dict):
        return {}
    simulations = run.result.get("simulations")
    return {str(k): v for k, v in simulations.items() if isinstance(v, dict)} if isinstance(simulations, dict) else {}
