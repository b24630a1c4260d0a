"""The warm rank pools' stack folders in the temp directory, named by their owner's pid: torch-free, so the
app's lab server sweeps the folders of a child it had to kill outright without importing the engine."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from sharding_lab.proc_stat import alive

FOLDER_PREFIX = "sharding-lab-pool-"  # then the owner's pid: its ranks' stack files


def remove_stale_folders(temp_dir: str | None = None) -> list[str]:
    """Remove the pool folders left by owners that are gone (killed with SIGKILL, so no cleanup ran); the
    names removed. A folder whose owner pid is alive, or taken again by another process, is kept."""
    removed = []
    for folder in Path(temp_dir or tempfile.gettempdir()).glob(f"{FOLDER_PREFIX}*-*"):
        owner = folder.name[len(FOLDER_PREFIX):].split("-", 1)[0]
        if owner.isdigit() and int(owner) != os.getpid() and not alive(int(owner)):
            shutil.rmtree(folder, ignore_errors=True)  # another user's stays: not ours to remove
            if not folder.exists():
                removed.append(folder.name)
    return removed
