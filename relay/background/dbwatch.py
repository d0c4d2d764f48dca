"""Notice, loudly, when the database file relay has open is deleted or replaced.

SQLite goes on writing to an unlinked file without a word. Ingress refuses
new events (503) on its own per-request check; this watch is what tells a
person: a CRITICAL log line at once and every minute while it lasts, and an
alert (delivered from the still-open file by the running scheduler).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from relay.background.alerts import Alerter
from relay.store import Health

log = logging.getLogger("relay.store")

CHECK_SECONDS = 1.0
REPEAT_SECONDS = 60.0


class DatabaseWatch:
    def __init__(self, store: Health, alerter: Alerter, *, interval: float = CHECK_SECONDS) -> None:
        self._store = store
        self._alerter = alerter
        self._interval = interval
        self._stopped = asyncio.Event()
        self.problem: str | None = None

    async def run(self) -> None:
        logged_at = 0.0
        while not self._stopped.is_set():
            problem = self._store.file_problem()
            now = time.monotonic()
            if problem is not None and (
                problem != self.problem or now - logged_at >= REPEAT_SECONDS
            ):
                log.critical("%s", problem)
                logged_at = now
                if problem != self.problem:
                    self._alerter.problem(problem)
            elif problem is None and self.problem is not None:
                log.warning(
                    "database file %s is back at its path", getattr(self._store, "path", "")
                )
            self.problem = problem
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopped.wait(), self._interval)

    def stop(self) -> None:
        self._stopped.set()
