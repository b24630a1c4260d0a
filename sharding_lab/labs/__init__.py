"""Labs: each catalogue claim, the configurations that test it, a check that can fail, and a report.

    from sharding_lab.engine.run_labs import run_lab       # measuring needs torch
    run = run_lab("what-fsdp-shards", world_size=2)       # run["holds"], run["finding"], run["table"]

This package never imports torch or the engine: the web app lists labs and renders stored runs, and
tests check labs on stored or doctored measurements. Where things are:

    registry.py          LABS: every lab by catalogue id (sharding_lab.catalog holds id, title, claim)
    base.py              Lab, RunSpec, Verdict, Report, Table; Conditions collects a check's reasons
    model_state_labs.py  what each rank holds between steps (DDP vs FSDP, ZeRO stages, Adam, 1/N scaling)
    gathering_labs.py    what is gathered during the step (reshard-after-forward, stage 3, FSDP = ZeRO-3)
    comm_labs.py         which collectives run when and how many bytes they move
    charts.py            measurements -> SVG charts (drawn by sharding_lab.svg)
    evaluate.py          a lab's run JSON from measurements; summaries for exports
    commands.py          the `sharding-lab list` and `sharding-lab run` subcommands

Each lab's `analyse` turns its measurements (sharding_lab.measurement) into one analysis object that
both its check and its report read.
"""

from sharding_lab.labs.base import Lab, Report, RunSpec, Table, Verdict
from sharding_lab.labs.evaluate import evaluate, summarize
from sharding_lab.labs.registry import LABS, get_lab

__all__ = ["LABS", "Lab", "Report", "RunSpec", "Table", "Verdict", "evaluate", "get_lab", "summarize"]
