"""Labs run from the app: a queue of LabRun rows, and a worker that runs them one at a time.

    queue.py     the rows and their moves: enqueue, claim, finish; the latest finished run per lab
    worker.py    the thread and the machine-wide lock that runs the queue; the LAB_* settings
    server.py    the lab server: one long-lived child, `sharding-lab serve-labs`, whose warm ranks run
                 every lab (the default)
    process.py   one lab as a child process of its own: `LAB_COMMAND run LAB --world-size N --device D --json`
    devices.py   the devices a lab can run on here (GPUs, torch and CUDA versions), asked of a lab process

The web process never imports torch: a lab always runs in a child process.
"""

from studyapp.lab_runs.process import Outcome
from studyapp.lab_runs.queue import claim_next, enqueue, finish, latest_done
from studyapp.lab_runs.worker import (
    INTERRUPTED,
    SHUTDOWN,
    LabWorker,
    app_worker,
    execute,
    init_app,
    lock_path,
    notify_queued,
    runner_lock,
    start_worker,
    world_sizes,
)
from studyapp.models import RunStatus

__all__ = [
    "INTERRUPTED",
    "SHUTDOWN",
    "LabWorker",
    "Outcome",
    "RunStatus",
    "app_worker",
    "claim_next",
    "enqueue",
    "execute",
    "finish",
    "init_app",
    "latest_done",
    "lock_path",
    "notify_queued",
    "runner_lock",
    "start_worker",
    "world_sizes",
]
