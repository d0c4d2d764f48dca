"""Standard Webhooks as the reference libraries send it, over real HTTP.

The requests are signed by the spec's own Python library (`standardwebhooks`)
and by Svix's client (`svix`), test extras, not by relay's code; `v1a`
(ed25519) by `cryptography`, as no reference library signs it.
"""

from __future__ import annotations

import base64
import json
import time
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from standardwebhooks.webhooks import Webhook as StandardWebhook
from svix.webhooks import Webhook as SvixWebhook

from relay.app import Relay
from relay.config import ConfigError
from relay.core.clock import FakeClock
from relay.store import EventQuery

from conftest import ConfigFactory, RelayFactory

VECTOR = json.loads(
    (Path(__file__).resolve().parents[1] / "fixtures/standard-webhooks/vector.json").read_text()
)
NOW = 1_800_000_000
KEY = b"0123456789abcdef0123456789abcdef"
PADDED = base64.b64encode(KEY[:31]).decode()  # 31 bytes: base64 ends in "="
UNPADDED = PADDED.rstrip("=")
AUDIT = {"audit": {"type": "file", "path": "audit.jsonl"}}


def sent_at(timestamp: int) -> datetime:
    return datetime.fromtimestamp(timestamp, tz=UTC)


async def start(
    make_config: ConfigFactory, start_relay: RelayFactory, now: float = NOW, **options: object
) -> Relay:
    routes = {
        "std": {"path": "/std", "targets": ["audit"], "source": "standard-webhooks", **options}
    }
    return await start_relay(make_config(AUDIT, routes), background=False, clock=FakeClock(now))


async def post(
    http: aiohttp.ClientSession, relay: Relay, body: str, headers: dict[str, str]
) -> int:
    async with http.post(relay.ingress_url + "/std", data=body.encode(), headers=headers) as r:
        return r.status


def standard_headers(
    msg_id: str, timestamp: int, signature: str, family: str = "webhook"
) -> dict[str, str]:
    return {
        f"{family}-id": msg_id,
        f"{family}-timestamp": str(timestamp),
        f"{family}-signature": signature,
        "Content-Type": "application/json",
    }


async def test_the_spec_test_vector(
    make_config: ConfigFactory, start_relay: RelayFactory, http: aiohttp.ClientSession
) -> None:
    relay = await start(make_config, start_relay, now=VECTOR["timestamp"], secret=VECTOR["secret"])
    headers = standard_headers(VECTOR["id"], VECTOR["timestamp"], VECTOR["signature"])
    assert await post(http, relay, VECTOR["payload"], headers) == 200
    [event] = await relay.store.list_events(EventQuery())
    assert event.idempotency_key == VECTOR["id"]


@pytest.mark.parametrize(
    "configured",
    ["whsec_" + PADDED, PADDED, "whsec_" + UNPADDED, UNPADDED],
    ids=["whsec-padded", "no-prefix", "unpadded", "no-prefix-unpadded"],
)
async def test_secret_forms_the_reference_library_accepts(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    http: aiohttp.ClientSession,
    configured: str,
) -> None:
    relay = await start(make_config, start_relay, secret=configured)
    body = '{"type": "invoice.paid"}'
    # The library is given the secret as its user would paste it: unpadded, no prefix.
    signature = StandardWebhook(UNPADDED).sign("msg_1", sent_at(NOW), body)
    assert await post(http, relay, body, standard_headers("msg_1", NOW, signature)) == 200
    forged = StandardWebhook(base64.b64encode(b"another key").decode()).sign(
        "msg_2", sent_at(NOW), body
    )
    assert await post(http, relay, body, standard_headers("msg_2", NOW, forged)) == 401


async def test_several_signatures_in_one_header_and_rotated_secrets(
    make_config: ConfigFactory, start_relay: RelayFactory, http: aiohttp.ClientSession
) -> None:
    old, new = base64.b64encode(b"old signing key").decode(), PADDED
    relay = await start(make_config, start_relay, secret=["whsec_" + new])
    body = '{"type": "invoice.paid"}'
    # A sender rotating its secret signs with both, space-separated.
    signatures = " ".join(
        StandardWebhook(secret).sign("msg_r", sent_at(NOW), body) for secret in (old, new)
    )
    assert await post(http, relay, body, standard_headers("msg_r", NOW, signatures)) == 200
    only_old = StandardWebhook(old).sign("msg_o", sent_at(NOW), body)
    assert await post(http, relay, body, standard_headers("msg_o", NOW, only_old)) == 401


async def test_svix_headers_signed_by_the_svix_library(
    make_config: ConfigFactory, start_relay: RelayFactory, http: aiohttp.ClientSession
) -> None:
    now = int(time.time())  # Svix's own verify below reads the real clock
    relay = await start(make_config, start_relay, now=now, secret="whsec_" + PADDED)
    body = '{"type": "user.created", "data": {"id": 7}}'
    signature = SvixWebhook("whsec_" + PADDED).sign("msg_svix", sent_at(now), body)
    headers = standard_headers("msg_svix", now, signature, family="svix")
    SvixWebhook("whsec_" + PADDED).verify(body, headers)  # what Svix itself accepts...
    assert await post(http, relay, body, headers) == 200  # ...relay accepts
    assert await post(http, relay, body, headers) == 200  # a re-send: a duplicate
    [event] = await relay.store.list_events(EventQuery())
    assert event.idempotency_key == "msg_svix"
    stale = standard_headers("msg_s2", now - 3600, signature, family="svix")
    assert await post(http, relay, body, stale) == 401


def whpk(private: Ed25519PrivateKey) -> str:
    raw = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return "whpk_" + base64.b64encode(raw).decode()


def v1a(private: Ed25519PrivateKey, msg_id: str, timestamp: int, body: str) -> str:
    signed = f"{msg_id}.{timestamp}.{body}".encode()
    return "v1a," + base64.b64encode(private.sign(signed)).decode()


async def test_v1a_ed25519_signatures(
    make_config: ConfigFactory, start_relay: RelayFactory, http: aiohttp.ClientSession
) -> None:
    sender = Ed25519PrivateKey.generate()
    relay = await start(make_config, start_relay, public_key=whpk(sender))
    body = '{"type": "invoice.paid"}'
    header = "v1,bm90IGEgc2lnbmF0dXJl " + v1a(sender, "msg_a", NOW, body)
    assert await post(http, relay, body, standard_headers("msg_a", NOW, header)) == 200
    stranger = v1a(Ed25519PrivateKey.generate(), "msg_b", NOW, body)
    assert await post(http, relay, body, standard_headers("msg_b", NOW, stranger)) == 401
    tampered = v1a(sender, "msg_c", NOW, body)
    assert await post(http, relay, body + " ", standard_headers("msg_c", NOW, tampered)) == 401
    hmac_only = StandardWebhook(PADDED).sign("msg_d", sent_at(NOW), body)
    assert await post(http, relay, body, standard_headers("msg_d", NOW, hmac_only)) == 401


def test_a_route_needs_a_secret_or_a_public_key(make_config: ConfigFactory) -> None:
    routes = {"std": {"path": "/std", "targets": ["audit"], "source": "standard-webhooks"}}
    with pytest.raises(ConfigError, match=r"routes\.std\.secret"):
        make_config(AUDIT, routes)
    bad = {"std": {**routes["std"], "public_key": "whpk_c2hvcnQ="}}
    with pytest.raises(ConfigError, match=r"public_key: expected an ed25519 public key"):
        make_config(AUDIT, bad)
