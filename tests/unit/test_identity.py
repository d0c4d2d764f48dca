"""A delivery's identity as a receiver reads it (relay.core.identity), in
both wire forms: the IETF draft's String read back by a parser written from
RFC 9651 (tests/receivers.py), whatever an older delivery's event key holds."""

from __future__ import annotations

from urllib.parse import unquote

import pytest

from relay.core.identity import delivery_key, receiver_key
from relay.core.payload import Payload
from relay.core.records import ClaimedDelivery
from relay.kinds.target import Envelope
from relay.targets.base import relay_headers

from receivers import sf_string


def claimed(key: str | None, *, event_keyed: bool, delivery_id: int = 9_999_999_999) -> Envelope:
    delivery = ClaimedDelivery(
        id=delivery_id,
        event_id=7,
        route="orders",
        target="crm",
        attempts=0,
        attempts_in_cycle=0,
        manual=False,
        resume_status=None,
        resume_at=None,
        idempotency_key=key,
        received_at=0.0,
        payload=Payload.received("POST", "/", "", [], b""),
        message_tag="0123456789abcdef",
        event_keyed=event_keyed,
    )
    return Envelope(delivery, attempt=1, sent_at=0.0)


def test_an_identity_is_short_ascii_and_its_own_whatever_the_event_key() -> None:
    one = claimed("заказ-1", event_keyed=False)
    key = receiver_key(one.delivery)
    assert key == "msg_relay_9999999999_0123456789abcdef"
    assert key.isascii()
    assert len(key) <= 37  # ids below 10^10; Worldline takes 40
    assert relay_headers(one)["Idempotency-Key"] == key
    assert delivery_key(3, None) == "msg_relay_3"  # stored before tags: its webhook-id


@pytest.mark.parametrize(
    "event_key",
    ["order-1", 'say "1"', "back\\slash", "заказ-1", None],
)
def test_the_draft_form_reads_back_for_every_key_an_older_delivery_keeps(
    event_key: str | None,
) -> None:
    envelope = claimed(event_key, event_keyed=True)
    token = relay_headers(envelope)["Idempotency-Key"]
    string = relay_headers(envelope, "string")["Idempotency-Key"]
    assert string.isascii()
    assert string.isprintable()
    read = sf_string(string)
    assert read == token
    # Non-ASCII went percent-encoded (the one header rule), and reads back exactly.
    assert unquote(read) == (event_key or "7")
