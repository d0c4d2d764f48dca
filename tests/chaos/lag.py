"""How long the event loop was held: a probe coroutine that asks to wake every
few milliseconds and records how late it was woken."""

from __future__ import annotations

import asyncio
import time
from types import TracebackType


class LagProbe:
    """`async with LagProbe() as probe:` ... then `probe.worst` (seconds)."""

    def __init__(self, interval: float = 0.005) -> None:
        self.interval = interval
        self.worst = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            before = time.perf_counter()
            await asyncio.sleep(self.interval)
            self.worst = max(self.worst, time.perf_counter() - before - self.interval)

    async def __aenter__(self) -> LagProbe:
        self._task = asyncio.create_task(self._run())
        await asyncio.sleep(0)
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
