"""SM-2 (studyapp/sm2.py): exact sequences worked out by hand, then properties over any grades.

EF changes per grade q by 0.1 - (5-q)(0.08 + (5-q)0.02):
q=5: +0.10, q=4: 0.00, q=3: -0.14, q=2: -0.32, q=1: -0.54, q=0: -0.80 (floored at 1.3).
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from studyapp.sm2 import (
    NEW_CARD,
    QUALITY_WORDING,
    Quality,
    SM2State,
    needs_same_day_repeat,
    next_easiness,
    replay,
    review,
)

grades = st.integers(min_value=0, max_value=5)
passing = st.integers(min_value=3, max_value=5)
failing = st.integers(min_value=0, max_value=2)
histories = st.lists(grades, max_size=40)


def states_through(qualities: list[int]) -> list[SM2State]:
    states, state = [], None
    for quality in qualities:
        state = review(state, quality)
        states.append(state)
    return states


# --- Known sequences, by hand ----------------------------------------------------------


def test_a_new_card_is_ef_2_5_n_0_i_0():
    assert NEW_CARD == SM2State(repetitions=0, easiness=2.5, interval=0)
    assert review(None, 4) == review(NEW_CARD, 4) == SM2State(1, 2.5, 1)


@pytest.mark.parametrize(
    ("qualities", "expected"),
    [
        # EF +0.1 each time; I: 1, 6, then ceil(6 x 2.7) = ceil(16.2) = 17 (EF before the third
        # review is 2.7: two updates have happened), then ceil(17 x 2.8) = ceil(47.6) = 48
        ([5, 5, 5, 5], [(1, 2.6, 1), (2, 2.7, 6), (3, 2.8, 17), (4, 2.9, 48)]),
        # EF stays 2.5: 1, 6, 15, ceil(37.5) = 38
        ([4, 4, 4, 4], [(1, 2.5, 1), (2, 2.5, 6), (3, 2.5, 15), (4, 2.5, 38)]),
        # EF 2.36, 2.22, 2.08, 1.94; I: 1, 6, ceil(6 x 2.22) = ceil(13.32) = 14, ceil(14 x 2.08) = ceil(29.12) = 30
        ([3, 3, 3, 3], [(1, 2.36, 1), (2, 2.22, 6), (3, 2.08, 14), (4, 1.94, 30)]),
        # a lapse at q=2 after three successes: n=0, I=1, but EF still drops 2.8 -> 2.48;
        # then 1, 6 again and ceil(6 x 2.68) = ceil(16.08) = 17
        (
            [5, 5, 5, 2, 5, 5, 5],
            [(1, 2.6, 1), (2, 2.7, 6), (3, 2.8, 17), (0, 2.48, 1), (1, 2.58, 1), (2, 2.68, 6), (3, 2.78, 17)],
        ),
        # the README's example: a lapse at q=0 costs 0.8 (2.8 -> 2.0), then 1, 1, 6 and ceil(6 x 2.2) = ceil(13.2) = 14
        (
            [5, 5, 5, 0, 5, 5, 5],
            [(1, 2.6, 1), (2, 2.7, 6), (3, 2.8, 17), (0, 2.0, 1), (1, 2.1, 1), (2, 2.2, 6), (3, 2.3, 14)],
        ),
        # q=0 twice: 2.5 -> 1.7 -> 0.9, floored at 1.3; q=3 at the floor stays at 1.3
        ([0, 0, 3, 5], [(0, 1.7, 1), (0, 1.3, 1), (1, 1.3, 1), (2, 1.4, 6)]),
        # q=1 costs 0.54: 2.5 -> 1.96
        ([1, 4, 4, 4], [(0, 1.96, 1), (1, 1.96, 1), (2, 1.96, 6), (3, 1.96, 12)]),
    ],
)
def test_known_sequences(qualities, expected):
    got = [(s.repetitions, s.easiness, s.interval) for s in states_through(qualities)]
    # EF compared exactly: the scheduler must not drift away from SM-2's decimal arithmetic
    assert got == expected


def test_interval_grows_by_the_easiness_from_before_this_review():
    # 3,3,3: the third interval is ceil(6 x 2.22) = 14; with this review's updated EF 2.08 it would be 13
    assert replay([3, 3, 3]).interval == 14
    # 5,5,5,5: ceil(17 x 2.8) = 48; with the updated 2.9 it would be ceil(49.3) = 50
    assert replay([5, 5, 5, 5]).interval == 48


@pytest.mark.parametrize(
    ("qualities", "interval"),
    [
        # 0 -> 1.7, 5 -> 1.8, 5 -> 1.9, 5 (I=ceil(6 x 1.9)=12) -> 2.0, 2 -> 1.68 lapse, 3 -> 1.54 (I=1),
        # 5 -> 1.64 (I=6), 3 -> 1.5 (I=ceil(6 x 1.64)=10), 5: ceil(10 x 1.5) = 15.
        ([0, 5, 5, 5, 2, 3, 5, 3, 5], 15),
        # 4,4,5,0 leave EF 1.8; then 5 (I=1, 1.9), 5 (I=6, 2.0), 4 (I=12), 5 (I=24, 2.1), 4 (I=ceil(50.4)=51),
        # 4: ceil(51 x 2.1) = ceil(107.1) = 108. Float drift in EF once made these 16 and 120.
        ([4, 4, 5, 0, 5, 5, 4, 5, 4, 4], 108),
    ],
)
def test_no_floating_point_drift_in_intervals(qualities, interval):
    assert replay(qualities).interval == interval


def test_next_easiness_per_grade():
    assert [next_easiness(2.5, q) for q in range(6)] == [1.7, 1.96, 2.18, 2.36, 2.5, 2.6]
    assert next_easiness(1.3, 0) == 1.3
    assert next_easiness(1.4, 3) == 1.3  # 1.26 floored


# --- Input checking --------------------------------------------------------------------


@pytest.mark.parametrize("bad", [-1, 6, 100, True, False, 3.0, 4.5, "4", None])
def test_quality_outside_0_to_5_or_not_an_int_is_refused(bad):
    with pytest.raises(ValueError, match="quality"):
        review(None, bad)
    with pytest.raises(ValueError):
        replay([5, bad])


def test_quality_enum_is_accepted_and_worded():
    assert review(None, Quality.PERFECT) == review(None, 5)
    assert [int(q) for q in Quality] == [0, 1, 2, 3, 4, 5]
    assert sorted(QUALITY_WORDING) == [0, 1, 2, 3, 4, 5]
    assert all(QUALITY_WORDING[q].strip() for q in range(6))


def test_review_does_not_mutate_its_input():
    state = SM2State(repetitions=3, easiness=2.2, interval=15)
    before = dataclasses.replace(state)
    after = review(state, 5)
    assert state == before
    assert after is not state
    assert after == SM2State(4, 2.3, 33)  # ceil(15 x 2.2) = 33
    with pytest.raises(dataclasses.FrozenInstanceError):
        state.interval = 1  # type: ignore[misc]


# --- Step 7 and replay -----------------------------------------------------------------


def test_same_day_repeat_below_4():
    assert [needs_same_day_repeat(q) for q in range(6)] == [True, True, True, True, False, False]


def test_replay():
    assert replay([]) == NEW_CARD
    assert replay([5, 5, 5, 5]) == SM2State(4, 2.9, 48)
    assert replay([5, 5, 5, 2]) == SM2State(0, 2.48, 1)


# --- Properties ------------------------------------------------------------------------


@given(histories)
def test_replay_is_the_fold_of_review(qualities):
    states = states_through(qualities)
    assert replay(qualities) == (states[-1] if states else NEW_CARD)


@given(st.lists(grades, min_size=1, max_size=60))
def test_easiness_and_interval_stay_in_bounds(qualities):
    for state in states_through(qualities):
        assert state.easiness >= 1.3
        assert state.interval >= 1
        assert state.repetitions >= 0


@given(histories, failing)
def test_a_failure_always_resets_but_still_updates_easiness(qualities, quality):
    before = replay(qualities)
    after = review(before, quality)
    assert (after.repetitions, after.interval) == (0, 1)
    assert after.easiness == next_easiness(before.easiness, quality)
    assert after.easiness < before.easiness or after.easiness == 1.3


@given(histories, passing)
def test_a_success_counts_one_more_repetition(qualities, quality):
    before = replay(qualities)
    after = review(before, quality)
    assert after.repetitions == before.repetitions + 1
    expected = {0: 1, 1: 6}.get(before.repetitions, math.ceil(before.interval * Fraction(str(before.easiness))))
    assert after.interval == expected


@given(histories, failing, st.lists(passing, min_size=3, max_size=20))
def test_intervals_grow_on_a_run_of_successes(prefix, lapse, run):
    intervals = [s.interval for s in states_through([*prefix, lapse, *run])][-len(run) :]
    assert intervals[:2] == [1, 6]
    # from n >= 2 every success multiplies by EF >= 1.3 and rounds up: strictly longer
    assert all(later > earlier for earlier, later in zip(intervals[1:-1], intervals[2:], strict=True))


@given(histories)
def test_easiness_matches_exact_decimal_arithmetic(qualities):
    easiness = Fraction(5, 2)
    for quality in qualities:
        miss = 5 - quality
        easiness = max(Fraction(13, 10), easiness + Fraction(1, 10) - miss * (Fraction(8, 100) + miss * Fraction(2, 100)))
    assert replay(qualities).easiness == float(easiness)


@given(histories)
def test_intervals_match_exact_arithmetic(qualities):
    repetitions, easiness, interval = 0, Fraction(5, 2), 0
    for quality in qualities:
        miss = 5 - quality
        if quality < 3:
            repetitions, interval = 0, 1
        else:
            interval = 1 if repetitions == 0 else 6 if repetitions == 1 else math.ceil(interval * easiness)
            repetitions += 1
        easiness = max(Fraction(13, 10), easiness + Fraction(1, 10) - miss * (Fraction(8, 100) + miss * Fraction(2, 100)))
    state = replay(qualities)
    assert (state.repetitions, state.interval) == (repetitions, interval)
