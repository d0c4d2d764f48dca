"""What a target is: something that sends one delivery and says how it went.

A target knows nothing of SQLite, schedules or routes. It gets an `Envelope`
and returns an `Outcome`; the scheduler decides what happens next.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from relay.outcome import Outcome


@dataclass(frozen=True)
class Envelope:
    event_id: int
    delivery_id: int
    route: str
    target: str
    attempt: int  # 1 for the first attempt; repeats after a crash mid-attempt
    # The event's idempotency key, or its id: sent so a target can de-duplicate.
    idempotency_key: str
    received_at: float
    method: str
    path: str
    query: str
    headers: Sequence[tuple[str, str]]
    content_type: str | None
    body: bytes


class Target(Protocol):
    name: str

    async def start(self) -> None: ...

    async def send(self, envelope: Envelope) -> Outcome:
        """Deliver once. Never raises for a delivery problem: that is an Outcome.

        The caller bounds the time (a timeout is an Outcome it makes itself).
        """
        ...

    async def close(self) -> None: ...


def relay_headers(envelope: Envelope) -> dict[str, str]:
    """The headers every outgoing request carries, so receivers can de-duplicate."""
    return {
        "Idempotency-Key": envelope.idempotency_key,
        "X-Relay-Event-Id": str(envelope.event_id),
        "X-Relay-Attempt": str(envelope.attempt),
    }
