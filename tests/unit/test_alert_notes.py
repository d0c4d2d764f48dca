"""The alerter on a shared store (relay.alerts, PostgreSQL's alert_notes),
against a whole in-memory AlertNotes whose writes can be held in flight."""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Sequence

from relay.alerts import Alerter
from relay.clock import FakeClock
from relay.config import AlertsConfig
from relay.store import Accepted, AlertNote, NewDelivery, NewEvent


class SlowNotes:
    """alert_notes in memory; each note_alerts waits for `go` once `hold` is set."""

    def __init__(self) -> None:
        self.notes: list[AlertNote] = []
        self.hold = False
        self.go = asyncio.Event()
        self.writing = asyncio.Event()

    async def note_alerts(self, notes: Sequence[bytes], now: float) -> None:
        if self.hold:
            self.writing.set()
            await self.go.wait()
        for note in notes:
            self.notes.append(AlertNote(len(self.notes) + 1, now, note))

    async def alert_notes(self) -> list[AlertNote]:
        return list(self.notes)

    async def send_alert(
        self,
        notes: Collection[int],
        event: NewEvent | None,
        deliveries: Sequence[NewDelivery],
        now: float,
    ) -> Accepted | None:
        raise AssertionError("a follower sends no alert")


async def test_notes_being_stored_when_the_alerter_stops_are_stored_once() -> None:
    # relay stops while the alerter's task is storing its notes (a slow
    # database at shutdown): stop()'s own flush must not store that batch a
    # second time, or the leader says those deliveries went dead twice.
    shared = SlowNotes()
    alerter = Alerter(
        AlertsConfig(target="ops"), None, FakeClock(0.0), shared=shared, leading=lambda: False
    )
    running = asyncio.create_task(alerter.run())
    shared.hold = True
    alerter.problem("database: disk almost full")
    async with asyncio.timeout(5):
        await shared.writing.wait()
    stopping = asyncio.create_task(alerter.stop())
    await asyncio.sleep(0.01)
    shared.go.set()
    async with asyncio.timeout(5):
        await stopping
        await running
    assert [note.note for note in shared.notes] == [
        b'{"kind":"problem","text":"database: disk almost full"}'
    ]
