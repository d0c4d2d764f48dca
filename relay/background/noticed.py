"""What a database command did, said in the service's own log.

`sudo relay pause crm` or `relay requeue --route leads` runs as a process of
its own: its line goes to the operator's terminal, and the running service
acts on the change within a second without a word in its journal. A person
reading `journalctl -u relay` then sees deliveries flow or stop for no
reason. So the service reads the audit (every action is one row of it, with
who acted) and logs each action a database command took once it appears.
Actions taken through this service (API, dashboard) log their own line when
they happen (relay.ops.actions) and are not said twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from relay.ops.actions import log_action
from relay.store import BY_CLI, AuditEntry, Queries, StoreError

log = logging.getLogger("relay.audit")

CHECK_SECONDS = 2.0
# Read at most this many new actions a pass; more (a script's loop) are
# counted in one line rather than each said.
READ_AT_ONCE = 50


class ActionsNoticed:
    def __init__(self, store: Queries, *, interval: float = CHECK_SECONDS) -> None:
        self._store = store
        self._interval = interval
        self._stopped = asyncio.Event()
        self._seen: int | None = None  # the newest action read; None: not read yet

    async def run(self) -> None:
        while not self._stopped.is_set():
            with contextlib.suppress(StoreError):  # the store's own watch says so
                await self.look()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopped.wait(), self._interval)

    async def look(self) -> list[AuditEntry]:
        """Log the database commands' actions since the last look (the first
        look only learns where the audit is: what came before the start is
        history). Returns what it logged."""
        newest = await self._store.list_audit(READ_AT_ONCE)
        seen, self._seen = self._seen, newest[0].id if newest else (self._seen or 0)
        if seen is None:
            return []
        new = [entry for entry in reversed(newest) if entry.id > seen]
        said = [entry for entry in new if entry.by.startswith(BY_CLI)]
        if len(new) == READ_AT_ONCE and newest[-1].id > seen + 1:
            log.info(
                "about %d earlier actions came at once and are not said here;"
                " `relay audit` lists them all",
                newest[-1].id - seen - 1,
            )
        for entry in said:
            log_action(
                "operator action, by a database command",
                entry.by,
                entry.action,
                entry.subject,
                entry.count,
            )
        return said

    def stop(self) -> None:
        self._stopped.set()
