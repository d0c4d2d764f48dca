"""Where "now" comes from. Everything below the scheduler takes `now` as an argument."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch."""
        ...

    async def wait(self, wake: asyncio.Event, until: float) -> None:
        """Return when `wake` is set or the clock reaches `until`, whichever is first."""
        ...


class SystemClock:
    def now(self) -> float:
        return time.time()

    async def wait(self, wake: asyncio.Event, until: float) -> None:
        timeout = until - time.time()
        if wake.is_set() or timeout <= 0:
            return
        try:
            async with asyncio.timeout(timeout):
                await wake.wait()
        except TimeoutError:
            pass


class FakeClock:
    """A clock that jumps: waiting until a time means being there at once.

    Lets a test run the whole 18-hour default retry cycle in milliseconds.
    """

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds

    def set(self, when: float) -> None:
        self._now = when

    async def wait(self, wake: asyncio.Event, until: float) -> None:
        # Let whatever is ready run first; it may set `wake`.
        await asyncio.sleep(0)
        if not wake.is_set() and until > self._now:
            self._now = until
