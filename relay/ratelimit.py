"""Pacing for targets with a rate limit: one send every 1/rate seconds.

Sends come evenly spaced, never in bursts, so a receiver that counts
requests in any sliding window never sees more than its limit. Time is
passed in, like everywhere below the scheduler.
"""

from __future__ import annotations

from relay.config import Rate


class Pacer:
    def __init__(self, rate: Rate, now: float) -> None:
        self.rate = rate
        # 0.1 % slower than the limit: a receiver's clock and ours may differ
        # by a rounding error, and at exactly the limit that is one too many.
        self._interval = 1.001 / rate.per_second
        self._next = now  # the earliest moment the next send may go

    def available(self, now: float) -> int:
        """How many sends may go now: 1 or 0 (no bursts)."""
        return 1 if now >= self._next else 0

    def take(self, count: int, now: float) -> None:
        # Idle time does not pile up into a burst: pacing restarts from now.
        self._next = max(self._next, now) + count * self._interval

    def ready_at(self, now: float) -> float:
        return max(now, self._next)

    def hold(self, until: float) -> None:
        """Nothing goes before `until`: the receiver asked to be left alone."""
        self._next = max(self._next, until)
