"""Runnable labs: each catalogue claim measured on a real sharded run, checked, and reported.

    from sharding_lab.labs import LABS, run_lab
    run = run_lab("what-fsdp-shards", world_size=2)   # run["holds"], run["finding"], run["table"]

Importing this package never imports torch; only running a lab does.
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
