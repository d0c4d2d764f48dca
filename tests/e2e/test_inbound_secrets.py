"""A request's own credentials never show, in any view, in any encoding.

Tilda sends its API key as the `api_key` form field (or the X-Tilda-Api-Key
header); a generic sender may put its token in `?token=`. relay stores the
request exactly as sent, so the key is in the stored body or query, often
percent-encoded. Every view — `relay show` (with or without the service's
environment), the admin API and the dashboard's event page — masks it after
decoding. Values that are not secrets (an SMTP host, a chat id) stay visible.
"""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import quote_plus, unquote, unquote_plus, urlencode

import aiohttp

from helpers import RelayProcess, relay_cli, write_config

TILDA_KEY = "tilda/key+7 f3"  # characters that percent-encoding changes
HOOK_TOKEN = "tok/en 42+x"
ENV = {"TILDA_API_KEY": TILDA_KEY, "HOOK_TOKEN": HOOK_TOKEN, "SMTP_HOST": "127.0.0.1"}


def _leaks(text: str, *secrets: str) -> list[str]:
    """Secrets found in the text, or in it decoded either way."""
    decoded = (text, unquote(text), unquote_plus(text))
    return sorted(secret for secret in secrets if any(secret in view for view in decoded))


async def test_inbound_keys_are_masked_in_every_view(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "relay.toml",
        {
            "targets": {
                "audit": {"type": "file", "path": "audit.jsonl"},
                "mail": {
                    "type": "smtp",
                    "host": "${SMTP_HOST}",
                    "port": 2525,
                    "tls": "none",
                    "from": "relay@example.com",
                    "to": ["manager@example.com"],
                },
            },
            "routes": {
                "tilda": {
                    "path": "/hooks/tilda",
                    "source": "tilda",
                    "api_key": "${TILDA_API_KEY}",
                    "targets": ["audit"],
                },
                "orders": {
                    "path": "/hooks/orders",
                    "token": "${HOOK_TOKEN}",
                    "targets": ["audit"],
                },
            },
        },
    )
    relay = RelayProcess(config, tmp_path / "relay.log", env=ENV).start()
    try:
        async with aiohttp.ClientSession() as http:
            lead = urlencode(
                {"Name": "Anna", "Phone": "+79990000001", "api_key": TILDA_KEY, "tranid": "1:1"}
            )
            async with http.post(
                relay.url + "/hooks/tilda",
                data=lead,
                headers={"Content-Type": "application/x-www-form-urlencoded"},
            ) as response:
                assert response.status == 200, await response.text()
            async with http.post(
                relay.url + "/hooks/orders?token=" + quote_plus(HOOK_TOKEN),
                json={"order": 1, "api_key": "json-key-123"},
                headers={"Idempotency-Key": "order-1"},
            ) as response:
                assert response.status == 200, await response.text()

            api = {}
            for event_id in ("1", "2"):
                async with http.get(f"{relay.admin_url}/api/v1/events/{event_id}") as response:
                    api[event_id] = await response.text()
                    assert response.status == 200
            async with http.get(f"{relay.admin_url}/events/1") as response:
                page_tilda = await response.text()
            async with http.get(f"{relay.admin_url}/events/2") as response:
                page_orders = await response.text()
    finally:
        await relay.astop()

    # The CLI without the service's environment: the config's ${VARS} are unset.
    shown = {
        event_id: relay_cli("show", event_id, "--config", str(config)).stdout
        + relay_cli("show", event_id, "--config", str(config), "--json").stdout
        for event_id in ("1", "2")
    }
    # ...and with it.
    shown_env = relay_cli("show", "2", "--config", str(config), env=ENV).stdout
    for text in (*shown.values(), shown_env, *api.values(), page_tilda, page_orders):
        assert _leaks(text, TILDA_KEY, HOOK_TOKEN, "json-key-123") == []
    assert "Anna" in shown["1"]  # the rest is shown
    assert "Anna" in page_tilda
    assert "api_key" in page_tilda  # the field is there, its value masked
    assert json.loads(api["2"])["query"] == "token=***"
    # A host from ${SMTP_HOST} is not a secret: the log shows the address.
    assert "ingress on http://127.0.0.1:" in relay.log()
