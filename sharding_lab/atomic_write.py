"""Files replaced whole or not at all: written to a scratch file beside the final path, then renamed
over it. A crash or an error mid-write (a full disk, a killed process) leaves the old file as it was and
no half-written one; a reader sees the old file or the new. Used for everything the project writes
that a user keeps: the exports (Anki packages, manifest, lab results), review-history backups, and
(made once, never replaced) the app's secret key and login token. A scratch file a killed writer
left is removed by the next write of the same path.
"""

from __future__ import annotations

import glob
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sharding_lab.proc_stat import alive

SCRATCH_SUFFIX = ".part"


def remove_stale_scratch(path: Path) -> None:
    """Remove the scratch files of `path` that a killed writer left (SIGKILL runs no cleanup): each
    names the process that made it, and one whose process no longer runs is nobody's."""
    for leftover in path.parent.glob(f".{glob.escape(path.name)}.*{SCRATCH_SUFFIX}"):
        pid = leftover.name[len(path.name) + 2:].split(".", 1)[0]
        if pid.isdecimal() and not alive(int(pid)):
            leftover.unlink(missing_ok=True)


@contextmanager
def scratch_beside(path: Path) -> Iterator[Path]:
    """An empty scratch file beside `path` (same folder, so a rename is atomic, and a killed writer's is
    found by `remove_stale_scratch`), removed when the block ends unless it was renamed away."""
    remove_stale_scratch(path)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{os.getpid()}.", suffix=SCRATCH_SUFFIX)
    os.close(fd)
    scratch = Path(name)
    try:
        yield scratch
    finally:
        scratch.unlink(missing_ok=True)


def _settle(scratch: Path, mode: int, durable: bool) -> None:
    os.chmod(scratch, mode)
    if durable:
        with open(scratch, "rb+") as written:
            os.fsync(written.fileno())


@contextmanager
def replacing(path: Path, *, mode: int = 0o644, durable: bool = False) -> Iterator[Path]:
    """A scratch path beside `path` to write to. On a clean exit it takes `mode` and replaces `path`,
    fsynced first when `durable` (a backup that must survive a power cut, not only a crash); on an
    exception it is removed and `path` is untouched."""
    with scratch_beside(path) as scratch:
        yield scratch
        _settle(scratch, mode, durable)
        os.replace(scratch, path)


def create_text(path: Path, text: str, *, mode: int = 0o644, durable: bool = False) -> bool:
    """`text` at `path` only if nothing is there yet, whole or not at all: True if this call made it,
    False if the file existed (another process may have made it a moment before: read it). Never an
    empty or half-written file, even when two processes start at once or one is killed midway."""
    if path.exists():  # the usual case, every later start: nothing to write
        return False
    with scratch_beside(path) as scratch:
        scratch.write_text(text, encoding="utf-8", newline="")
        _settle(scratch, mode, durable)
        try:
            os.link(scratch, path)  # fails, atomically, where `path` exists
        except FileExistsError:
            return False
    return True


def write_text(path: Path, text: str, *, mode: int = 0o644, durable: bool = False) -> None:
    """`text` as UTF-8 at `path`, whole or not at all (newlines as given)."""
    with replacing(path, mode=mode, durable=durable) as scratch:
        scratch.write_text(text, encoding="utf-8", newline="")
