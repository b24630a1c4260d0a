"""Runnable labs: each catalogue claim measured on a real sharded run, checked, and reported.

    from sharding_lab.labs import LABS, run_lab
    run = run_lab("what-fsdp-shards", world_size=2)   # run["holds"], run["finding"], run["table"]

Importing this package never imports torch; only running a lab does. Where things are:

    registry.py          LABS: every lab by catalogue id (sharding_lab.catalog holds id, title, claim)
    base.py              Lab, RunSpec, Verdict, Report, Table; Conditions collects a check's reasons
    model_state_labs.py  what each rank holds between steps (DDP vs FSDP, ZeRO stages, Adam, 1/N scaling)
    gathering_labs.py    what is gathered during the step (reshard-after-forward, stage 3, FSDP = ZeRO-3)
    comm_labs.py         which collectives run when and how many bytes they move
    readings.py          the one place that knows the engine's measurement JSON
    charts.py            measurements -> SVG charts (drawn by sharding_lab.svg)
    runner.py            run_labs: one launch per world size, then check and report; summarize
    commands.py          the `sharding-lab list` and `sharding-lab run` subcommands
"""

from sharding_lab.labs.base import Lab, Report, RunSpec, Table, Verdict
from sharding_lab.labs.registry import LABS, get_lab
from sharding_lab.labs.runner import evaluate, measure_specs, run_lab, run_labs, summarize

__all__ = [
    "LABS",
    "Lab",
    "Report",
    "RunSpec",
    "Table",
    "Verdict",
    "evaluate",
    "get_lab",
    "measure_specs",
    "run_lab",
    "run_labs",
    "summarize",
]
