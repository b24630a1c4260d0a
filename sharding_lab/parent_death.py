"""Processes that end with the process that started them, even when it is killed with SIGKILL (which
runs no cleanup): Linux's PR_SET_PDEATHSIG. Torch-free, so the web app's lab processes use it too:

    python -m sharding_lab.parent_death PARENT_PID COMMAND [ARG ...]

runs COMMAND (exec, same pid) with SIGTERM on its way when PARENT_PID dies, so a lab or simulation the
app started does not run on, orphaned, beside the next server's (and SIGTERM lets the lab CLI stop its
ranks and remove its files).
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import signal
import sys


def die_with_parent(parent: int, signum: int = signal.SIGKILL) -> None:
    """Linux: have the kernel send this process `signum` when its parent (pid `parent`) dies, even by
    SIGKILL, or the parent's thread that started it ends; exit at once if the parent is already gone.
    (Not `getppid() == 1`: a container's pid 1 is a live parent, and every rank it started exited.)
    The request survives an exec. Elsewhere it does nothing."""
    if not sys.platform.startswith("linux"):
        return
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signum)
    if os.getppid() != parent:  # it died before the request took effect
        os._exit(1)


def guarded(argv: list[str]) -> list[str]:
    """`argv`, run so that it receives SIGTERM when this process dies (on Linux; as it is elsewhere).
    The thread that starts it must outlive it (the kernel signals when that thread ends)."""
    if not sys.platform.startswith("linux"):
        return list(argv)
    if shutil.which(argv[0]) is None:  # as Popen says it, here, not in the guard after it started
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), argv[0])
    return [sys.executable, "-m", "sharding_lab.parent_death", str(os.getpid()), *argv]


def main(argv: list[str]) -> None:
    parent, *command = argv
    die_with_parent(int(parent), signal.SIGTERM)
    try:
        os.execvp(command[0], command)
    except OSError as error:  # gone since `guarded` found it: one line, a shell's status
        print(f"cannot run {command[0]}: {error.strerror}", file=sys.stderr)
        sys.exit(127)


if __name__ == "__main__":
    main(sys.argv[1:])
