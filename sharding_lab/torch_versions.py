"""The torch versions the engine has run on, and the check that refuses any other before a rank starts.

The engine leans on FSDP2 internals and memory trackers that change between torch releases (between
2.11 and 2.13 the all-gather FSDP2 calls was renamed, FSDP2's parameter groups became a list, and
DTensor's shape-propagation scratch stopped reaching the trackers), so a figure is only as good as the
versions its code was run on. Torch-free: the parent reads the installed version from its metadata,
without importing torch; each rank process checks the torch it imported again when it imports the engine.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from importlib import metadata

# Each build the whole test suite has passed on, and where.
RUN_ON: tuple[tuple[str, str], ...] = (
    ("2.11.0+cu130", "the lent H200 machine's build; in CI on CPU (make test-torch211)"),
    ("2.13.0+cpu", "CI's build (constraints.txt)"),
    ("2.14.1+cu130", "once, on CPU, not in CI"),
)
OLDEST, NEWEST = (2, 11), (2, 14)  # the minor releases those builds span
UNTESTED_OK = "SHARDING_LAB_UNTESTED_TORCH"  # set to 1 to run on a torch outside that range anyway


class TorchVersionOutsideRange(ValueError):
    """The installed torch is older or newer than any the engine has run on."""


def minor(version: str) -> tuple[int, int] | None:
    """(major, minor) of a version string such as '2.11.0+cu130'; None if it does not read as one."""
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match.group(1)), int(match.group(2))) if match else None


def installed() -> str | None:
    """The installed torch's version, read from its metadata (torch is not imported); None if absent."""
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


def check(version: str | None, env: Mapping[str, str] | None = None) -> str | None:
    """None if `version` is within the range run on. Outside it, raise TorchVersionOutsideRange naming the
    version, the range and the way to run anyway; with UNTESTED_OK=1 set, return that text as a warning."""
    env = os.environ if env is None else env
    parsed = minor(version) if version else None
    if parsed is not None and OLDEST <= parsed <= NEWEST:
        return None
    span = f"{'.'.join(map(str, OLDEST))} to {'.'.join(map(str, NEWEST))}"
    builds = "; ".join(f"{build} ({where})" for build, where in RUN_ON)
    text = (
        f"torch {version or '(not installed)'} is outside the versions this engine has run on, {span} "
        f"({builds}). Install torch from that range (`pip install -c constraints.txt torch`), or set "
        f"{UNTESTED_OK}=1 to run anyway: its private FSDP2 and tracker internals may differ, and a figure "
        f"may be wrong without failing."
    )
    if version and parsed is not None and env.get(UNTESTED_OK) == "1":
        return f"warning: {text}"
    raise TorchVersionOutsideRange(text)
