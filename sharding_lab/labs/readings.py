"""What the labs read from one engine measurement (the JSON of `sharding_lab.engine.measure`).

Every lab goes through these accessors, so the engine's JSON layout is known in one place. Pure
Python: checks and reports run on stored or doctored measurements without torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sharding_lab.analytic import FP32_ADAM_BYTES, MODEL_STATE_PARTS

PARTS = MODEL_STATE_PARTS  # ("params", "grads", "optimizer")
_PART_FIELDS = {"params": "params_bytes", "grads": "grads_bytes", "optimizer": "optimizer_bytes"}
_BLOCK_NAME = re.compile(r"(?:^|\.)blocks\.(\d+)$")  # the engine names blocks "blocks.<i>"


def strategy(m: dict) -> str:
    return m["config"]["strategy"]


def world_size(m: dict) -> int:
    return int(m["config"]["world_size"])


def num_params(m: dict) -> int:
    """Ψ: every parameter element of the unsharded model."""
    return int(m["config"]["num_params"])


def n_blocks(m: dict) -> int:
    return int(m["config"]["n_blocks"])


def ranks(m: dict) -> list[dict]:
    return m["memory"]["per_rank"]


def part_bytes(m: dict, part: str) -> list[int]:
    """Bytes of one model-state part (params, grads, optimizer) each rank holds between steps."""
    return [int(rank[_PART_FIELDS[part]]) for rank in ranks(m)]


def model_states_bytes(m: dict) -> list[int]:
    return [sum(part_bytes(m, part)[r] for part in PARTS) for r in range(len(ranks(m)))]


def full_bytes(m: dict, part: str) -> int:
    """Bytes of one part for the whole unsharded model in fp32 Adam (4Ψ, 4Ψ, 8Ψ)."""
    return FP32_ADAM_BYTES[part] * num_params(m)


def padded_num_params(m: dict) -> int:
    """Ψ after FSDP pads each parameter's dim 0 to a multiple of N (Ψ itself when nothing is padded)."""
    return int(m["config"].get("padded_num_params") or num_params(m))


def padded_full_bytes(m: dict, part: str) -> int:
    """Bytes of one part for the whole model including FSDP's padding: what an all-gather moves."""
    return FP32_ADAM_BYTES[part] * padded_num_params(m)


def padded_part_bytes(m: dict, part: str) -> list[int]:
    """Each rank's bytes of `part` plus the padding its shard is short of (FSDP's last ranks)."""
    per_element = FP32_ADAM_BYTES[part]
    return [
        int(rank[_PART_FIELDS[part]]) + per_element * int(rank.get("padding_elements") or 0)
        for rank in ranks(m)
    ]


def held_in_full(m: dict, part: str) -> bool:
    """Whether every rank holds the whole model's `part` (replicated, as under DDP)."""
    return all(b == full_bytes(m, part) for b in part_bytes(m, part))


def sharded(m: dict, part: str) -> bool:
    """Whether the ranks split `part` with nothing replicated: their bytes add up to one full copy and
    none holds more than 1/N of the padded model (FSDP pads dims that N does not divide)."""
    held = part_bytes(m, part)
    return sum(held) == full_bytes(m, part) and max(held) <= padded_full_bytes(m, part) // world_size(m)


def full_model_states_bytes(m: dict) -> int:
    return sum(full_bytes(m, part) for part in PARTS)


def shares(m: dict, part: str) -> list[float]:
    """Each rank's bytes of `part` as a fraction of the whole model's."""
    full = full_bytes(m, part)
    return [b / full for b in part_bytes(m, part)]


def unsharded_after_forward(m: dict) -> list[int]:
    """Bytes of gathered (full) parameters still held when forward ends, per rank."""
    return [int(rank.get("unsharded_params_after_forward_bytes") or 0) for rank in ranks(m)]


def unsharded_peak(m: dict) -> list[int]:
    """The most bytes of gathered (full) parameters held at once during the step, per rank."""
    return [int(rank.get("unsharded_params_peak_bytes") or 0) for rank in ranks(m)]


def all_gather_buffer_peak(m: dict) -> list[int]:
    """The most bytes held in all-gather output buffers at once, per rank: gathered bytes waiting to be
    copied out into a unit's parameters (a prefetched block waits here until it starts)."""
    return [int((rank.get("category_peaks") or {}).get("all_gather_buffers") or 0) for rank in ranks(m)]


def categories(m: dict, rank: int = 0) -> dict[str, int]:
    return {name: int(value) for name, value in ranks(m)[rank]["categories"].items()}


def collectives(m: dict, *, op: str | None = None, phase: str | None = None) -> list[dict]:
    """The step's collectives in issue order, optionally only one op and/or phase."""
    return [
        c
        for c in m["comm"]["collectives"]
        if (op is None or c["op"] == op) and (phase is None or c["phase"] == phase)
    ]


def block_index(module: str | None) -> int | None:
    """The block number in a module name like 'blocks.3', or None for the root and others."""
    match = _BLOCK_NAME.search(module or "")
    return int(match.group(1)) if match else None


def gathered_bytes_by_module(m: dict) -> dict[str, int]:
    """Full parameter bytes of each FSDP unit, read off its forward all-gathers (one per unit)."""
    result: dict[str, int] = {}
    for c in collectives(m, op="all_gather", phase="forward"):
        result[c["module"]] = result.get(c["module"], 0) + int(c["bytes"])
    return result


def root_and_block_bytes(m: dict) -> tuple[int, int]:
    """(root unit's full parameter bytes, largest block unit's), from the forward all-gathers."""
    by_module = gathered_bytes_by_module(m)
    blocks = [b for name, b in by_module.items() if block_index(name) is not None]
    root = sum(b for name, b in by_module.items() if block_index(name) is None)
    return root, max(blocks, default=0)


def paper_units(op: str) -> int:
    """Buffers an op moves in the ZeRO paper's accounting: all-reduce = reduce-scatter + all-gather."""
    return 2 if op == "all_reduce" else 1


def volume_in_params(m: dict) -> float:
    """The step's communication in multiples of the model's fp32 bytes (Ψ), paper accounting."""
    moved = sum(paper_units(c["op"]) * int(c["bytes"]) for c in collectives(m))
    return moved / full_bytes(m, "params")


def totals_by_op(m: dict) -> dict[str, dict]:
    """Per op: count, logical bytes and derived wire bytes of the step, computed from the list."""
    totals: dict[str, dict] = {}
    for c in collectives(m):
        entry = totals.setdefault(c["op"], {"count": 0, "bytes": 0, "wire_bytes_derived": 0})
        entry["count"] += 1
        entry["bytes"] += int(c["bytes"])
        entry["wire_bytes_derived"] += int(c.get("wire_bytes_derived") or 0)
    return totals


@dataclass(frozen=True)
class Event:
    """One timeline entry, normalised: a collective, or a module's forward/backward start or end."""

    position: int  # index in the ordered timeline
    kind: str  # "collective", "start" or "end"
    module: str
    phase: str  # forward, backward, optimizer
    op: str = ""  # the collective, for kind == "collective"
    bytes: int = 0


def timeline(m: dict) -> list[Event]:
    """The step's ordered timeline. Module events are named `forward_start`, `backward_end`, ...;
    their phase is read from the name, which says which compute they bound."""
    events = []
    for position, raw in enumerate(m["comm"]["timeline"]):
        module = raw.get("module") or ""
        if raw["event"] == "collective":
            events.append(
                Event(position, "collective", module, raw.get("phase") or "", raw["op"], int(raw["bytes"]))
            )
        else:
            phase, _, edge = raw["event"].partition("_")
            events.append(Event(position, edge, module, phase))
    return events


def module_event(events: list[Event], module_block: int, phase: str, kind: str) -> Event | None:
    """The first `kind` (start/end) event of block `module_block` in `phase`."""
    for event in events:
        if event.kind == kind and event.phase == phase and block_index(event.module) == module_block:
            return event
    return None


def block_collectives(events: list[Event], op: str, phase: str) -> dict[int, list[Event]]:
    """Block number -> its `op` collectives in `phase`, in order."""
    result: dict[int, list[Event]] = {}
    for event in events:
        if event.kind == "collective" and event.op == op and event.phase == phase:
            index = block_index(event.module)
            if index is not None:
                result.setdefault(index, []).append(event)
    return result
