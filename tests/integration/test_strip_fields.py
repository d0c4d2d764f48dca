"""A route can keep the sender's key out of what it forwards.

Tilda sends its API key in the `api_key` form field when it is set as a
field (Tilda's webhook settings: "API key" sent in a field or a header). A
target with format = "raw" forwards the body as received, key included,
unless the route strips it; the stored event stays exactly as sent.
"""

from __future__ import annotations

from urllib.parse import parse_qsl

import aiohttp

from relay.core.clock import FakeClock

from conftest import ConfigFactory, RelayFactory, SinkFactory

LEAD = b"Name=%D0%90%D0%BD%D0%BD%D0%B0&api_key=tk-123456&Phone=%2B79990000001&tranid=7:1"


async def test_stripped_fields_never_leave_relay_and_the_event_is_kept_whole(
    make_config: ConfigFactory, start_relay: RelayFactory, start_sink: SinkFactory
) -> None:
    raw, raw_url = await start_sink([200])
    crm, crm_url = await start_sink([200])
    config = make_config(
        {
            "raw": {"type": "http", "url": raw_url},
            "crm": {
                "type": "http",
                "url": crm_url,
                "format": "form",
                "form": {"name": "{{ form.Name }}", "key": "{{ form.api_key | default('none') }}"},
            },
        },
        {
            "tilda": {
                "path": "/hooks/tilda",
                "source": "tilda",
                "api_key": "tk-123456",
                "strip_fields": ["api_key"],
                "targets": ["raw", "crm"],
            }
        },
    )
    relay = await start_relay(config, background=False, clock=FakeClock())
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            relay.ingress_url + "/hooks/tilda",
            data=LEAD,
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        ) as response,
    ):
        assert response.status == 200
    await relay.scheduler.drain()

    # Forwarded: every other byte as it came, the key gone.
    assert raw.requests[0].body == b"Name=%D0%90%D0%BD%D0%BD%D0%B0&Phone=%2B79990000001&tranid=7:1"
    assert dict(parse_qsl(crm.requests[0].body.decode())) == {"name": "Анна", "key": "none"}
    # Stored: exactly what Tilda sent.
    detail = await relay.store.get_event(1)
    assert detail is not None
    assert detail.payload.body == LEAD
