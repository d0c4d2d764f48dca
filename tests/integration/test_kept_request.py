"""The request an attempt keeps is bounded as a whole and masked before it
is cut (relay.delivery.kept): the URL, each header, the headers together,
the body.

Before, headers were kept whole: one 878 KiB webhook whose template copies a
field into a header stored 4.3 MiB over 5 attempts (x16 over a full cycle,
from an unauthenticated sender while a target is down).
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import aiohttp

from relay.core.clock import FakeClock
from relay.core.outcome import RESPONSE_EXCERPT_BYTES
from relay.delivery.kept import CUT, HEADER_KEPT, HEADERS_KEPT, URL_KEPT
from relay.store import EventQuery

from conftest import ConfigFactory, RelayFactory, SinkFactory
from helpers import post_accepted

SECRET = "tok-SECRET-0123456789"


async def test_a_huge_templated_header_is_kept_bounded_its_secret_masked_whole(
    tmp_path: Path,
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
) -> None:
    sink, url = await start_sink([503, 503, 503, 503, 200])
    crm = {
        "type": "http",
        "url": url,
        "retry": {"unit": "1ms"},
        "headers": {
            # The secret starts just before the cut: masked whole, never half.
            "X-Note": "{{ json.pad }}${CRM_TOKEN}",
            # Each under the 8 KiB a server takes in one field (aiohttp, nginx).
            **{f"X-Comment-{n}": "{{ json.comment }}" for n in range(9)},
        },
    }
    relay = await start_relay(
        make_config(
            {"crm": crm},
            {"leads": {"path": "/hooks/leads", "targets": ["crm"]}},
            environ={"CRM_TOKEN": SECRET},
        ),
        background=False,
        clock=FakeClock(),
    )
    body = json.dumps(
        {"comment": "x" * 7000, "pad": "p" * (HEADER_KEPT - 6), "more": "m" * 878 * 1024}
    ).encode()
    await post_accepted(http, relay.ingress_url + "/hooks/leads", body)
    await relay.scheduler.drain()
    assert len(sink.requests) == 5
    assert len(sink.requests[0].headers["X-Comment-8"]) == 7000  # sent whole

    with sqlite3.connect(tmp_path / "relay.db") as db:
        kept = db.execute("SELECT request, request_body FROM attempts").fetchall()
    assert len(kept) == 5
    bound = URL_KEPT + HEADERS_KEPT + RESPONSE_EXCERPT_BYTES + 1024  # and the JSON around them
    assert all(len(head.encode()) + len(tail) <= bound for head, tail in kept)
    [event] = await relay.store.list_events(EventQuery())
    detail = await relay.store.get_event(event.id)
    assert detail is not None
    for attempt in detail.attempts[event.deliveries[0].id]:
        assert attempt.request is not None
        headers = dict(attempt.request.headers)
        assert headers["X-Comment-0"].endswith(CUT)
        assert len(headers["X-Comment-0"]) == HEADER_KEPT
        assert "tok-" not in headers["X-Note"]  # not a piece of it left before the cut
        # Past HEADERS_KEPT in all, the rest are counted, not kept.
        assert headers[CUT].endswith("more headers not kept")
        assert "X-Comment-8" not in headers
        assert attempt.request.size == len(body)
        assert attempt.request.body.endswith(CUT.encode())
