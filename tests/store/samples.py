"""Events for the store tests: one shape, varied by what each test needs."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from relay.core.payload import Payload
from relay.store import NewDelivery, NewEvent, Store

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


async def identities_survive_their_migration(
    store: Store, roll_back: Callable[[Store, list[int]], Awaitable[Store]]
) -> Store:
    """Deliveries stored before each had an identity of its own, through the
    migration that gives them one. `roll_back(store, untagged)` closes
    `store`, makes its database as it was before that migration (and the
    deliveries `untagged` as stored before tags), and opens it again.

    The one attempted before keeps the key, the webhook-id and the mail
    Message-ID its attempts carried; the one never attempted takes an
    identity of its own. Returns the store open after."""
    import hashlib

    from relay.core.identity import delivery_key, receiver_key
    from relay.kinds.target import Envelope
    from relay.store import AttemptRecord, RetryAt
    from relay.targets.smtp import message_id

    from helpers import record

    await store.accept_event(event("order-1"), [NewDelivery("crm")], T0)
    await store.accept_event(event(None), [NewDelivery("crm")], T0)
    [attempted] = await store.claim_due(T0, T0 + 30, {"crm": 1})
    failed = AttemptRecord(1, T0, 0.01, "retry", 503, "HTTP 503")
    await record(store, attempted, failed, RetryAt(T0 + 10), T0 + 1)
    store = await roll_back(store, [attempted.id, attempted.id + 1])
    old, new = sorted(await store.claim_due(T0 + 10, T0 + 70, {"crm": 2}), key=lambda c: c.id)

    assert old.id == attempted.id
    assert old.event_keyed
    assert receiver_key(old) == "order-1"
    assert delivery_key(old.id, old.message_tag) == f"msg_relay_{old.id}"  # its webhook-id
    # The Message-ID as relay made it before (the event's key in its seed).
    seed = f"{old.event_id}|{old.received_at}|order-1|mail".encode()
    made_before = (
        f"<relay.{old.event_id}.mail.{hashlib.sha256(seed).hexdigest()[:16]}@shop.example>"
    )
    assert message_id(Envelope(old, 2, T0), "mail", "relay@shop.example") == made_before

    assert not new.event_keyed
    assert new.message_tag is not None
    assert len(new.message_tag) == 16
    assert receiver_key(new) == f"msg_relay_{new.id}_{new.message_tag}"
    return store
