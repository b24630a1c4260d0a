"""The SM-2 scheduler (Wozniak, 1990), pure: no Flask, no SQL, no clock.

A review takes the card's state and a quality grade 0..5 and returns the new state.
Same-day repeats of Wozniak's step 7 are not reviews in this sense: the caller logs them
without calling `review`, so they change neither easiness, repetitions nor interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import IntEnum

INITIAL_EASINESS = 2.5
MIN_EASINESS = 1.3  # below this, intervals grow too slowly and cards come back too often (SM-2, step 5)
PASSING_QUALITY = 3  # q >= 3 is a successful recall
REPEAT_UNTIL_QUALITY = 4  # step 7: cards graded below this come back the same day
# A multiple-choice answer is graded on the side of the passing line its correctness puts it.
CORRECT_QUALITIES = (3, 4, 5)
WRONG_QUALITIES = (0, 1, 2)


class Quality(IntEnum):
    """SM-2's six grades, in Wozniak's wording."""

    BLACKOUT = 0  # complete blackout
    WRONG_REMEMBERED = 1  # incorrect response; the correct one remembered
    WRONG_EASY = 2  # incorrect response; the correct one seemed easy to recall
    HARD = 3  # correct response recalled with serious difficulty
    HESITANT = 4  # correct response after a hesitation
    PERFECT = 5  # perfect response


QUALITY_WORDING: dict[int, str] = {
    0: "Complete blackout",
    1: "Wrong; the answer was familiar",
    2: "Wrong; the answer seemed easy",
    3: "Right, with serious difficulty",
    4: "Right, after a hesitation",
    5: "Perfect response",
}


@dataclass(frozen=True)
class SM2State:
    repetitions: int  # n: successful reviews in a row
    easiness: float  # EF
    interval: int  # I, in days


NEW_CARD = SM2State(repetitions=0, easiness=INITIAL_EASINESS, interval=0)


# SM-2's arithmetic is decimal (EF moves in steps of 0.02), but floats drift: 2.5 + 0.1 - 0.14 ...
# lands on 2.1000000000000005, and ceil(10 * 1.6000000000000008) is 17, not 16. Rounding to this
# many decimals removes the drift without changing any value SM-2 can reach.
DECIMALS = 9


def next_easiness(easiness: float, quality: int) -> float:
    """EF' = EF + (0.1 - (5-q)(0.08 + (5-q)0.02)), floored at 1.3."""
    miss = 5 - quality
    return max(MIN_EASINESS, round(easiness + (0.1 - miss * (0.08 + miss * 0.02)), DECIMALS))


def review(state: SM2State | None, quality: int) -> SM2State:
    """Return the state after one graded review; `None` is a new card. Never mutates `state`."""
    if isinstance(quality, bool) or not isinstance(quality, int) or not 0 <= quality <= 5:
        raise ValueError(f"quality must be an integer from 0 to 5, got {quality!r}")
    state = state or NEW_CARD
    easiness = next_easiness(state.easiness, quality)
    if quality < PASSING_QUALITY:
        return SM2State(repetitions=0, easiness=easiness, interval=1)
    if state.repetitions == 0:
        interval = 1
    elif state.repetitions == 1:
        interval = 6
    else:
        # The interval grows by the easiness from before this review's update.
        interval = math.ceil(round(state.interval * state.easiness, DECIMALS))
    return SM2State(repetitions=state.repetitions + 1, easiness=easiness, interval=interval)


def allowed_qualities(correct: bool) -> tuple[int, ...]:
    """A right answer is graded 3..5, a wrong one 0..2 (SM-2's passing line)."""
    return CORRECT_QUALITIES if correct else WRONG_QUALITIES


def misgraded(correct: bool, quality: int) -> str | None:
    """Why `quality` cannot grade a right (or wrong) answer; None when it can."""
    allowed = allowed_qualities(correct)
    if quality in allowed:
        return None
    return f"a {'right' if correct else 'wrong'} answer is graded {allowed[0]} to {allowed[-1]}, got {quality}"


def needs_same_day_repeat(quality: int) -> bool:
    """Step 7: a card graded below 4 comes back in the same session until graded 4 or 5."""
    return quality < REPEAT_UNTIL_QUALITY


def replay(qualities: list[int]) -> SM2State:
    """The state a card reaches from new through these graded reviews (repeats excluded)."""
    state: SM2State | None = None
    for quality in qualities:
        state = review(state, quality)
    return state or NEW_CARD
