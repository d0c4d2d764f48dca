"""What a receiver de-duplicates on: one identity per delivery (an event to
one target), the same on every attempt, retry, requeue, restart and instance
of that delivery, and never made again for another.

It is `msg_relay_<delivery id>_<tag>`, the tag a random value stored with the
delivery when it is accepted (relay.store.accept.message_tags). A database's
ids alone repeat: every database numbers from 1, and a restored backup, a
copied file or a second relay numbers again what another already sent. The
tag does not. It goes out as `Idempotency-Key` and, on a signed request, as
`webhook-id`. ASCII by construction (digits, lowercase hex, `_`), at most 37
characters for ids below 10^10 (Worldline, the strictest receiver we know of,
takes 40).

A delivery stored before each delivery had an identity of its own, and not
waiting for its first attempt then, keeps the key its attempts carried (its
event's key, else its event id; `event_keyed`), so a receiver that saw it
still knows it; as does one stored by an older relay on a cluster being
upgraded one instance at a time.
"""

from __future__ import annotations

from relay.core.records import ClaimedDelivery


def delivery_key(delivery_id: int, tag: str | None) -> str:
    """A delivery's identity from its id and stored tag. Without a tag (stored
    before tags existed) the id alone, as those deliveries' webhook-id was."""
    return f"msg_relay_{delivery_id}_{tag}" if tag else f"msg_relay_{delivery_id}"


def event_key(delivery: ClaimedDelivery) -> str:
    """The event's key (the sender's, or the route's template), else its id:
    what templates see as `event.idempotency_key`. Not unique beyond its
    route and database: never what a receiver de-duplicates on."""
    return delivery.idempotency_key or str(delivery.event_id)


def receiver_key(delivery: ClaimedDelivery) -> str:
    """The `Idempotency-Key` this delivery is sent with, on every attempt."""
    if delivery.event_keyed:
        return event_key(delivery)
    return delivery_key(delivery.id, delivery.message_tag)


def as_sf_string(value: str) -> str:
    """`value` as a Structured Field String (RFC 9651 section 3.3.3), the
    Idempotency-Key draft's form: in double quotes, `"` and `\\` escaped.
    `value` is ASCII without controls (an identity always is; an older
    delivery's event key has been through the header rule first)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
