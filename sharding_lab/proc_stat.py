"""A process's state and group as Linux's /proc/<pid>/stat gives them (torch-free: the app uses it too)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class ProcessStat:
    pid: int
    state: str  # "R" running, "S" sleeping, ... "Z" a zombie: ended, not yet reaped
    group: int  # its process group id

    @property
    def live(self) -> bool:
        return self.state != "Z"


def read_stat(pid: int) -> ProcessStat | None:
    """The process's stat, or None when it has ended or there is no /proc (not Linux)."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name, in parentheses, may hold spaces and ")": the fields after it start past the last one.
    fields = text.rsplit(")", 1)[1].split()
    if len(fields) < 3:
        return None
    state, _parent, group = fields[:3]
    return ProcessStat(pid, state, int(group))


def own_threads(name: str) -> list[int]:
    """The ids of this process's threads named `name` (their /proc comm); none without /proc. Each reads
    back with `read_stat(tid)`."""
    tasks = PROC / "self" / "task"
    try:
        tids = [entry.name for entry in tasks.iterdir()]
    except OSError:
        return []
    found = []
    for tid in tids:
        try:
            if (tasks / tid / "comm").read_text().strip() == name:
                found.append(int(tid))
        except OSError:  # ended while read
            continue
    return found


def every_process() -> list[ProcessStat]:
    """Every process /proc shows now (one that ends while it is read is left out; none without /proc)."""
    if not PROC.is_dir():
        return []
    found = (read_stat(int(entry.name)) for entry in PROC.iterdir() if entry.name.isdigit())
    return [stat for stat in found if stat is not None]


def alive(pid: int) -> bool:
    """Whether `pid` is a running process (a zombie, dead but not yet reaped, is not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    stat = read_stat(pid)
    return stat is None or stat.live  # None: no /proc (not Linux), or it ended just now
