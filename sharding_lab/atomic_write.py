"""Files replaced whole or not at all: written to a scratch file beside the final path, then renamed
over it. A crash or an error mid-write (a full disk, a killed process) leaves the old file as it was and
no half-written one; a reader sees the old file or the new. Used for everything the project writes
that a user keeps: the exports (Anki packages, manifest, lab results), review-history backups.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def replacing(path: Path, *, mode: int = 0o644, durable: bool = False) -> Iterator[Path]:
    """A scratch path beside `path` to write to. On a clean exit it takes `mode` and replaces `path`,
    fsynced first when `durable` (a backup that must survive a power cut, not only a crash); on an
    exception it is removed and `path` is untouched."""
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    os.close(fd)
    scratch = Path(name)
    try:
        yield scratch
        os.chmod(scratch, mode)
        if durable:
            with open(scratch, "rb+") as written:
                os.fsync(written.fileno())
        os.replace(scratch, path)
    except BaseException:
        scratch.unlink(missing_ok=True)
        raise


def write_text(path: Path, text: str, *, mode: int = 0o644, durable: bool = False) -> None:
    """`text` as UTF-8 at `path`, whole or not at all (newlines as given)."""
    with replacing(path, mode=mode, durable=durable) as scratch:
        scratch.write_text(text, encoding="utf-8", newline="")
