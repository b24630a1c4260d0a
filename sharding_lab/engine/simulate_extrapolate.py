"""A simulated training step extrapolated from 3 and 4 blocks to any number of blocks, exactly.

The simulation (sharding_lab.engine.simulate) samples the tracker's bytes by category after every op
of the step: one *event* a vector of bytes per category, the total last. This module cuts a step's
events into pieces, and from two short runs (a and a + 1 blocks) works out the events of a run with
any number of blocks: its peak moment, each category's maximum and the marked moments, byte for byte.
No torch here.

The cut. Each event carries the innermost block the module tracker has open (forward: the highest
index open; backward: the lowest, the one most recently entered) or none. A step is then
- a *prefix*: the events before the first block (the root's all-gather, the embeddings);
- *passes*, one per forward and one per backward of each micro-batch: in each, one *segment* per
  block, in the order the pass visits them (forward 0..L-1, backward L-1..0). Events outside every
  block (the final norm, the head and the loss after the last forward block; the root's
  post-backward after the last backward block; FSDP's hooks between blocks) belong to the segment
  before them;
- the *optimizer step*: every event while `optimizer.step()` runs (and any after it).

Why the extrapolation is exact. Every tensor alive at an event belongs to the root, to one block, or
to the op in flight. The blocks have the same shapes and the same shards, and FSDP treats block i the
same way whatever L is, except at the two ends of a pass, where a block has no neighbour to prefetch
or follows the root. So, for L >= 3:
1. a prefix event's bytes are the root's plus L times what one block holds then: affine in L;
2. the k-th event of the segment of the block at position j of a pass is `c + j*d + L*e` for blocks
   away from both ends (1 <= j <= L-2: d is what one block behind the pass holds more than one ahead
   of it, e what every block holds besides), and the first and last segments are such a template of
   their own. Anchored at the start (j = 0, 1) or at the end (j = L-1, L-2), each is affine in L;
   and since the interior is affine in j, its maximum (of the total, or of any one category) lies at
   j = 1 or j = L-2: anchored events, all of them;
3. the optimizer (Adam, one parameter at a time) adds to the bytes held when it starts (affine in L)
   the temporaries of the parameter it is updating, which depend on that parameter's shape only:
   the same set of increments for every L >= 1, each first met at the same place in the order.
Two runs fix every affine function, and so every event that can hold a maximum. The structure the
argument rests on (the same prefix, passes and anchored segments in both runs, the interior
segment's length, one set of optimizer increments) is checked on the runs themselves; anything
else raises `NotExtrapolable`, and the caller simulates every block instead. A test holds the
result byte-equal to simulating every block, for every engine option.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

Vector = tuple[int, ...]  # bytes per category at one moment; the last entry is the total
SMALLEST = 3  # the shorter of the two runs: a block away from both ends of every pass needs L >= 3
EDGE = 1  # segments at each end of a pass that may differ from the interior (no neighbour to prefetch)


class NotExtrapolable(ValueError):
    """The two runs do not have the structure the extrapolation rests on."""


@dataclass(frozen=True)
class Event:
    """The tracker's bytes after one op, and where in the step the op ran."""

    block: int | None  # the innermost block open (see the module docstring), None outside every block
    backward: bool
    optimizer: bool
    bytes: Vector


@dataclass(frozen=True)
class Pass:
    backward: bool
    segments: tuple[tuple[Vector, ...], ...]  # one per block, in the order this pass visits them


@dataclass(frozen=True)
class Timeline:
    """One simulated step of `n_blocks` blocks, cut as the module docstring says."""

    n_blocks: int
    prefix: tuple[Vector, ...]
    passes: tuple[Pass, ...]
    optimizer: tuple[Vector, ...]
    optimizer_start: Vector  # the bytes held when `optimizer.step()` starts (not an event itself)
    marks: dict[str, Vector]  # named moments (after forward, after the step): bytes then


@dataclass(frozen=True)
class StepMemory:
    """What the simulation reports of a step, whichever way it was worked out."""

    peak: Vector  # the first event with the largest total: the peak moment, by category
    category_peaks: Vector  # each category's own maximum over the step's events
    marks: dict[str, Vector]


class PeakKeeper:
    """The peak moment and each category's maximum, over events given in the order they happen."""

    def __init__(self) -> None:
        self.peak: Vector | None = None
        self.category_peaks: list[int] | None = None

    def add(self, vector: Vector) -> None:
        if self.peak is None:
            self.peak, self.category_peaks = vector, list(vector)
            return
        if vector[-1] > self.peak[-1]:  # strictly: the first moment to reach the peak is the peak's
            self.peak = vector
        peaks = self.category_peaks
        for i, value in enumerate(vector):
            if value > peaks[i]:
                peaks[i] = value

    def result(self, marks: dict[str, Vector]) -> StepMemory:
        if self.peak is None:
            raise ValueError("no events")
        return StepMemory(self.peak, tuple(self.category_peaks), dict(marks))


def cut(events: Sequence[Event], n_blocks: int, optimizer_start: Vector, marks: dict[str, Vector]) -> Timeline:
    """Cut one step's events into prefix, passes and optimizer step."""
    prefix: list[Vector] = []
    passes: list[tuple[bool, list[int], list[list[Vector]]]] = []  # (backward, blocks, segments)
    optimizer: list[Vector] = []
    current: tuple[bool, int] | None = None
    for event in events:
        if event.optimizer or optimizer:
            optimizer.append(event.bytes)
            continue
        if event.block is None or (event.backward, event.block) == current:
            if current is None:
                prefix.append(event.bytes)
            else:
                passes[-1][2][-1].append(event.bytes)
            continue
        if current is None or current[0] != event.backward:
            passes.append((event.backward, [], []))
        passes[-1][1].append(event.block)
        passes[-1][2].append([event.bytes])
        current = (event.backward, event.block)
    for backward, blocks, _ in passes:
        order = list(range(n_blocks))
        if blocks != (order[::-1] if backward else order):
            direction = "backward" if backward else "forward"
            raise NotExtrapolable(f"a {direction} pass visits blocks {blocks}, not each of {n_blocks} once in order")
    return Timeline(
        n_blocks,
        tuple(prefix),
        tuple(Pass(backward, tuple(tuple(s) for s in segments)) for backward, _, segments in passes),
        tuple(optimizer),
        optimizer_start,
        dict(marks),
    )


def _affine(at_a: Vector, at_b: Vector, a: int, n: int) -> Vector:
    """The vector at n blocks of a function affine in the number of blocks, known at a and a + 1."""
    return tuple(x + (n - a) * (y - x) for x, y in zip(at_a, at_b, strict=True))


def _same_length(what: str, a: Sequence, b: Sequence) -> None:
    if len(a) != len(b):
        raise NotExtrapolable(f"{what}: {len(a)} events with fewer blocks, {len(b)} with one more")


def _increments(timeline: Timeline) -> dict[Vector, int]:
    """The optimizer's increments over the bytes held when it started, each with its first index."""
    first: dict[Vector, int] = {}
    for i, vector in enumerate(timeline.optimizer):
        first.setdefault(tuple(v - s for v, s in zip(vector, timeline.optimizer_start, strict=True)), i)
    return first


def extrapolate(a: Timeline, b: Timeline, n_blocks: int) -> StepMemory:
    """The step of `n_blocks` blocks, from timelines of `a.n_blocks` and `a.n_blocks + 1` blocks."""
    la = a.n_blocks
    if b.n_blocks != la + 1 or la < SMALLEST or n_blocks < la:
        raise ValueError(f"needs runs of L and L + 1 >= {SMALLEST + 1} blocks and a target of at least L")
    # (order, vector): the order is where the event happens in the step of n_blocks blocks.
    candidates: list[tuple[tuple, Vector]] = []
    _same_length("the prefix", a.prefix, b.prefix)
    candidates += [((0, i), _affine(x, y, la, n_blocks)) for i, (x, y) in enumerate(zip(a.prefix, b.prefix, strict=True))]

    if [p.backward for p in a.passes] != [p.backward for p in b.passes]:
        raise NotExtrapolable("the two runs have different passes")
    for p, (pass_a, pass_b) in enumerate(zip(a.passes, b.passes, strict=True)):
        interior = pass_b.segments[EDGE : len(pass_b.segments) - EDGE]
        for segment in (*pass_a.segments[EDGE : la - EDGE], *interior[1:]):
            _same_length(f"pass {p}'s interior", interior[0], segment)
        anchors = [(j, j, j) for j in range(EDGE + 1)]  # (position at n, in a, in b) from the start
        anchors += [(n_blocks - 1 - t, la - 1 - t, la - t) for t in range(EDGE + 1)]  # and from the end
        for position, in_a, in_b in anchors:
            segment_a, segment_b = pass_a.segments[in_a], pass_b.segments[in_b]
            _same_length(f"pass {p}, block {position}", segment_a, segment_b)
            pairs = enumerate(zip(segment_a, segment_b, strict=True))
            candidates += [((1, p, position, k), _affine(x, y, la, n_blocks)) for k, (x, y) in pairs]

    increments_a, increments_b = _increments(a), _increments(b)
    if set(increments_a) != set(increments_b):
        raise NotExtrapolable("the optimizer's increments differ between the two runs")
    start = _affine(a.optimizer_start, b.optimizer_start, la, n_blocks)
    candidates += [
        ((2, first), tuple(s + d for s, d in zip(start, increment, strict=True)))
        for increment, first in increments_b.items()
    ]

    if set(a.marks) != set(b.marks):
        raise NotExtrapolable("the two runs marked different moments")
    marks = {name: _affine(a.marks[name], b.marks[name], la, n_blocks) for name in a.marks}
    return _peaks(candidates, marks)


def _peaks(candidates: Iterable[tuple[tuple, Vector]], marks: dict[str, Vector]) -> StepMemory:
    keeper = PeakKeeper()
    for _, vector in sorted(candidates, key=lambda c: c[0]):
        keeper.add(vector)
    return keeper.result(marks)
