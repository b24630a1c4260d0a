"""The rate limiter's pure core, on a clock the test moves: exact counts, windows and retry times."""

from __future__ import annotations

import pytest

from studyapp.rate_limit import RateLimiter


class Clock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_record_counts_within_the_window_and_says_when_to_retry():
    clock = Clock()
    limiter = RateLimiter(limit=3, window_s=60, clock=clock)
    assert limiter.check("a").allowed and limiter.check("a").count == 0
    verdicts = []
    for _ in range(3):
        verdicts.append(limiter.record("a"))
        clock.now += 10
    assert [v.count for v in verdicts] == [1, 2, 3]
    assert [v.allowed for v in verdicts] == [True, True, False]
    # The first event (t=1000) leaves the window at t=1060; it is now t=1030.
    assert limiter.check("a").retry_after_s == 30
    assert limiter.check("b").allowed, "another key has its own count"
    clock.now = 1060
    assert limiter.check("a").allowed and limiter.check("a").count == 2


def test_hit_counts_only_what_it_allows():
    clock = Clock()
    limiter = RateLimiter(limit=2, window_s=100, clock=clock)
    assert [limiter.hit("s").allowed for _ in range(4)] == [True, True, False, False]
    assert limiter.check("s").count == 2, "refused hits are not counted"
    clock.now += 99.5
    refused = limiter.hit("s")
    assert not refused.allowed and refused.retry_after_s == 1, "never 0 while refused"
    clock.now += 0.5
    assert limiter.hit("s").allowed


def test_reset_forgets_a_key_and_idle_keys_are_dropped():
    clock = Clock()
    limiter = RateLimiter(limit=1, window_s=10, clock=clock, max_keys=3)
    limiter.record("a")
    limiter.reset("a")
    assert limiter.check("a").allowed
    for key in "bcde":
        limiter.record(key)
    assert len(limiter._events) == 3 and "b" not in limiter._events, "the key idle longest went first"
    clock.now += 10
    limiter.check("c")
    assert "c" not in limiter._events, "a key whose events all left the window is dropped"


@pytest.mark.parametrize("limit, window", [(0, 10), (1, 0)])
def test_a_limit_that_could_never_allow_anything_is_refused(limit, window):
    with pytest.raises(ValueError):
        RateLimiter(limit=limit, window_s=window, clock=Clock())
