"""A sliding-window rate limiter: at most `limit` events per key in any `window_s` seconds.

Pure: time comes from the clock it is given (monotonic seconds), so tests step through windows
without sleeping. Thread-safe (the server is threaded). Memory is bounded: a key whose events
have all left the window is dropped, and past `max_keys` keys the one idle longest goes first.

    limiter = RateLimiter(limit=10, window_s=900, clock=time.monotonic)
    verdict = limiter.check(key)     # may this key act now? (records nothing)
    verdict = limiter.record(key)    # count one event; verdict.count is the number in the window
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Verdict:
    allowed: bool  # another event may happen now
    count: int  # events in the window, this one included when recorded
    limit: int
    retry_after_s: int  # whole seconds until another event is allowed (0 when allowed)


class RateLimiter:
    def __init__(self, limit: int, window_s: float, clock: Callable[[], float], max_keys: int = 10_000):
        if limit < 1 or window_s <= 0:
            raise ValueError(f"a rate limit needs limit >= 1 and window_s > 0, got {limit}, {window_s}")
        self.limit = limit
        self.window_s = window_s
        self.clock = clock
        self.max_keys = max_keys
        self._events: OrderedDict[str, deque[float]] = OrderedDict()  # key -> event times, oldest first
        self._lock = threading.Lock()

    def _recent(self, key: str, now: float) -> deque[float]:
        events = self._events.get(key)
        if events is None:
            return deque()
        while events and events[0] <= now - self.window_s:
            events.popleft()
        if not events:
            del self._events[key]
        return events

    def _add(self, key: str, now: float) -> deque[float]:
        events = self._recent(key, now)
        events.append(now)
        self._events[key] = events
        self._events.move_to_end(key)
        while len(self._events) > self.max_keys:
            self._events.popitem(last=False)  # the key idle longest
        return events

    def _verdict(self, events: deque[float], now: float) -> Verdict:
        if len(events) < self.limit:
            return Verdict(True, len(events), self.limit, 0)
        # The oldest event that must leave the window before another is allowed.
        frees_at = events[len(events) - self.limit] + self.window_s
        return Verdict(False, len(events), self.limit, max(1, math.ceil(frees_at - now)))

    def check(self, key: str) -> Verdict:
        """Whether `key` may act now; counts nothing."""
        with self._lock:
            now = self.clock()
            return self._verdict(self._recent(key, now), now)

    def record(self, key: str) -> Verdict:
        """Count one event for `key` now; the verdict says whether a further one is allowed."""
        with self._lock:
            now = self.clock()
            events = self._add(key, now)
            return self._verdict(events, now)

    def hit(self, key: str) -> Verdict:
        """Count an event only if it is allowed: the check and the count in one step."""
        with self._lock:
            now = self.clock()
            events = self._recent(key, now)
            verdict = self._verdict(events, now)
            if not verdict.allowed:
                return verdict
            return Verdict(True, len(self._add(key, now)), self.limit, 0)

    def reset(self, key: str) -> None:
        with self._lock:
            self._events.pop(key, None)
