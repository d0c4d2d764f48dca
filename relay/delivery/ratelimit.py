"""Pacing for targets with a rate limit: one send every 1/rate seconds.

Sends come evenly spaced, never in bursts, so a receiver that counts
requests in any sliding window never sees more than its limit. Two clocks
keep it: when a delivery may be claimed (`available`, `take`), and when its
request may be written (`send_at`, `sent`), measured from the moment the
previous one really went out: a send delayed after its claim (a slow
template, a new connection) must not leave the next one too close behind
it. Time is passed in, like everywhere below the scheduler.
"""

from __future__ import annotations

from relay.config import Rate

# 1 % slower than the limit: what reaches a receiver was written by relay
# and carried by the network, and the network may delay one request a few
# milliseconds more than the next. A window holding `rate` sends then spans
# 1 % more than its length: 10 ms for "2/s", as for "50/s".
PACE_MARGIN = 1.01


class Pacer:
    def __init__(self, rate: Rate, now: float) -> None:
        self.rate = rate
        self._interval = PACE_MARGIN / rate.per_second
        self._next = now  # the earliest moment the next send may be claimed
        self._sent: float | None = None  # when the last request was written

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

    def send_at(self, now: float) -> float:
        """The earliest moment a claimed send may be written."""
        return now if self._sent is None else max(now, self._sent + self._interval)

    def sent(self, at: float) -> None:
        """A request was written at `at`: the next one is spaced from it, and
        is not claimed before it may go."""
        self._sent = at if self._sent is None else max(self._sent, at)
        self._next = max(self._next, at + self._interval)
