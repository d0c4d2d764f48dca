"""Bytes that are not UTF-8 stay distinct wherever they decide identity.

A site in cp1251 (1C-Bitrix and older PHP shops default to it; the HTML
forms' `accept-charset`, WHATWG URL "application/x-www-form-urlencoded
serializing", percent-encodes each byte of the page's encoding) sends
equal-length words whose bytes differ but whose UTF-8 reading with U+FFFD is
the same: `оплачен` and `отменен` both read "�������". Each place that
compares, keys, orders or indexes a payload is walked here with such pairs:
the payload comparison under one key, the ordering line, the search index.
(The key itself: tests/integration/test_key_conflicts.py.)
"""

from __future__ import annotations

import aiohttp
import pytest

from relay.core.canonical import payload_digest
from relay.core.clock import FakeClock
from relay.core.secrets import Masker
from relay.ops.search import document, parse_search
from relay.store import EventQuery, Status

from conftest import ConfigFactory, RelayFactory, SinkFactory

FORM = "application/x-www-form-urlencoded"
# Equal length, and the same once each byte that is not UTF-8 is a U+FFFD.
PAIRS = [("оплачен", "отменен"), ("заказ-1", "товар-1"), ("Иванов", "Петров")]


def cp1251_form(**fields: str) -> bytes:
    """A form as a cp1251 page's browser sends it: each byte percent-encoded."""
    return "&".join(
        name + "=" + "".join(f"%{byte:02X}" for byte in value.encode("cp1251"))
        for name, value in fields.items()
    ).encode()


@pytest.mark.parametrize(("first", "second"), PAIRS)
def test_the_payload_comparison_keeps_each_pair_apart(first: str, second: str) -> None:
    one, other = cp1251_form(status=first), cp1251_form(status=second)
    assert payload_digest(one, FORM) != payload_digest(other, FORM)
    # Formatting is still not content: `+` and `%20` are one space.
    spaced = cp1251_form(status=first + " x")
    assert payload_digest(spaced.replace(b"%20", b"+"), FORM) == payload_digest(spaced, FORM)
    # A UTF-8 form compares as it always did (digests of stored events hold).
    assert payload_digest("status=оплачен".encode(), FORM) == payload_digest(
        b"status=%D0%BE%D0%BF%D0%BB%D0%B0%D1%87%D0%B5%D0%BD", FORM
    )


@pytest.mark.parametrize(("first", "second"), PAIRS)
def test_the_search_index_keeps_each_pair_apart(first: str, second: str) -> None:
    def text(word: str, content_type: str) -> str:
        body = cp1251_form(status=word)
        return document(
            1, headers=[], query="", content_type=content_type, body=body, masker=Masker()
        ).text

    assert text(first, FORM) != text(second, FORM)
    # Declared, the charset makes the words what a person searches for.
    declared = FORM + "; charset=windows-1251"
    assert text(first, declared) == first.lower()
    assert parse_search(first).words == (first.lower(),)


async def test_a_cancellation_under_the_key_of_a_payment_is_not_a_duplicate(
    make_config: ConfigFactory, start_relay: RelayFactory, http: aiohttp.ClientSession
) -> None:
    # Before: `status=оплачен` then `status=отменен` under one Idempotency-Key
    # compared equal and the cancellation was answered "duplicate", never stored.
    config = make_config(
        {"crm": {"type": "file", "path": "crm.jsonl"}},
        {"shop": {"path": "/shop", "targets": ["crm"]}},
    )
    relay = await start_relay(config, background=False)
    answers = []
    for status in ("оплачен", "отменен", "оплачен"):
        headers = {"Content-Type": FORM, "Idempotency-Key": "order-1001"}
        body = cp1251_form(order="1001", status=status)
        async with http.post(relay.ingress_url + "/shop", data=body, headers=headers) as answer:
            assert answer.status == 200
            answers.append(await answer.json())
    assert [a["status"] for a in answers] == ["queued", "queued", "duplicate"]
    events = await relay.store.list_events(EventQuery())
    assert [(e.id, e.conflict_of) for e in events] == [(2, 1), (1, None)]  # newest first


async def test_two_orders_are_two_lines_of_order_by(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
) -> None:
    # Before: `заказ-1` and `товар-1` were one ordering key, so the dead first
    # order held the second one's delivery until a person dealt with it.
    sink, url = await start_sink([422, 200])
    config = make_config(
        {"crm": {"type": "http", "url": url}},
        {
            "shop": {
                "path": "/shop",
                "targets": [{"target": "crm", "order_by": "{{ form.order }}"}],
            }
        },
    )
    clock = FakeClock()
    relay = await start_relay(config, background=False, clock=clock)
    for order in ("заказ-1", "товар-1"):
        body = cp1251_form(order=order)
        headers = {"Content-Type": FORM}
        async with http.post(relay.ingress_url + "/shop", data=body, headers=headers) as answer:
            assert answer.status == 200
    await relay.scheduler.drain()
    events = await relay.store.list_events(EventQuery())
    statuses = sorted(event.deliveries[0].status for event in events)
    assert statuses == sorted([Status.DEAD, Status.DELIVERED])
    assert len(sink.requests) == 2
