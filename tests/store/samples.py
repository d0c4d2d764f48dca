"""Events for the store tests: one shape, varied by what each test needs."""

from __future__ import annotations

from relay.core.payload import Payload
from relay.store import NewDelivery, NewEvent

T0 = 1_800_000_000.0


def event(
    key: str | None = None,
    route: str = "orders",
    body: bytes = b'{"a": 1}',
    at: float = T0,
) -> NewEvent:
    return NewEvent(
        route=route,
        idempotency_key=key,
        received_at=at,
        remote_addr="127.0.0.1",
        payload=Payload(
            method="POST",
            path="/hooks/orders",
            query="x=1",
            headers=[("Content-Type", "application/json"), ("X-Dup", "1"), ("X-Dup", "2")],
            content_type="application/json",
            body=body,
        ),
    )


TWO = [NewDelivery("crm"), NewDelivery("audit")]
