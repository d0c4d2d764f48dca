"""Signed deliveries: Standard Webhooks headers on an http target with `sign`.

The receiver below is written from the specification's text
(standard-webhooks/standard-webhooks, spec/standard-webhooks.md, "Verifying
webhooks": the signed content is "{webhook-id}.{webhook-timestamp}.{raw
body}", HMAC-SHA256 keyed with the base64-decoded part of the "whsec_"
secret; `webhook-signature` is a space-delimited list of "v1,<base64>"), not
from relay's signing code.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import Mapping

import aiohttp
import pytest

from relay.config import ConfigError
from relay.core.clock import FakeClock
from relay.store import EventQuery
from relay.targets.signing import sign, signature_headers

from conftest import ConfigFactory, RelayFactory, SinkFactory

# The specification's published test vector, as used by its reference
# library's own test (standard-webhooks, libraries/python/tests/
# test_webhooks.py::test_sign_function).
SPEC_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
SPEC_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
SPEC_TIMESTAMP = 1614265330
SPEC_PAYLOAD = b'{"test": 2432232314}'
SPEC_SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="

OLD_SECRET = "whsec_" + base64.b64encode(b"old secret of the receiver, 32b!").decode()
NEW_SECRET = "whsec_" + base64.b64encode(b"new secret after the rotation!!!").decode()


def spec_verifies(secret: str, headers: Mapping[str, str], body: bytes, now: float) -> bool:
    """A receiver as the spec tells one to verify: any v1 signature may match."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    webhook_id = headers["webhook-id"]
    timestamp = headers["webhook-timestamp"]
    if abs(now - int(timestamp)) > 5 * 60:  # the spec's suggested tolerance
        return False
    content = f"{webhook_id}.{timestamp}.".encode() + body
    expected = base64.b64encode(hmac.new(key, content, hashlib.sha256).digest()).decode()
    for versioned in headers["webhook-signature"].split(" "):
        version, _, signature = versioned.partition(",")
        if version == "v1" and hmac.compare_digest(signature, expected):
            return True
    return False


def test_spec_test_vector() -> None:
    key = base64.b64decode(SPEC_SECRET.removeprefix("whsec_"))
    assert sign([key], SPEC_ID, SPEC_TIMESTAMP, SPEC_PAYLOAD) == SPEC_SIGNATURE


def test_the_spec_receiver_accepts_the_spec_vector() -> None:
    # Proves the receiver used below against the spec, not against relay.
    headers = {
        "webhook-id": SPEC_ID,
        "webhook-timestamp": str(SPEC_TIMESTAMP),
        "webhook-signature": SPEC_SIGNATURE,
    }
    assert spec_verifies(SPEC_SECRET, headers, SPEC_PAYLOAD, SPEC_TIMESTAMP)
    assert not spec_verifies(SPEC_SECRET, headers, SPEC_PAYLOAD + b" ", SPEC_TIMESTAMP)


ROUTES = {"lead": {"path": "/hooks/lead", "targets": ["crm"]}}


@pytest.mark.parametrize("body_format", ["raw", "json"])
async def test_signed_across_retries_and_rotation(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
    body_format: str,
) -> None:
    sink, url = await start_sink([503, 503, 200])
    target = {
        "type": "http",
        "url": url,
        "sign": ["${OLD_SIGNING_SECRET}", "${RELAY_SIGNING_SECRET}"],
    }
    if body_format == "json":
        target |= {"format": "json", "body": '{"name": {{ json.name | tojson }}, "n": 1}'}
    config = make_config(
        {"crm": target},
        ROUTES,
        environ={"OLD_SIGNING_SECRET": OLD_SECRET, "RELAY_SIGNING_SECRET": NEW_SECRET},
    )
    clock = FakeClock()
    relay = await start_relay(config, background=False, clock=clock)
    async with http.post(relay.ingress_url + "/hooks/lead", json={"name": "Анна"}) as answer:
        assert answer.status == 200
    await relay.scheduler.drain()
    assert len(sink.requests) == 3
    ids = set()
    timestamps = []
    for request in sink.requests:
        headers = {name.lower(): value for name, value in request.headers.items()}
        ids.add(headers["webhook-id"])
        timestamps.append(int(headers["webhook-timestamp"]))
        # Either secret verifies: a receiver mid-rotation holds one of them.
        for secret in (OLD_SECRET, NEW_SECRET):
            assert spec_verifies(secret, headers, request.body, int(headers["webhook-timestamp"]))
        assert len(headers["webhook-signature"].split(" ")) == 2
        if body_format == "json":
            assert json.loads(request.body) == {"name": "Анна", "n": 1}
    assert len(ids) == 1  # the same on every retry: the receiver de-duplicates on it
    # Dated when each attempt went out (the retries were 2 s and 4 s apart).
    assert timestamps[1] - timestamps[0] == 2
    assert timestamps[2] - timestamps[1] == 4
    # The secrets are masked wherever relay shows text (logs, errors, dashboard).
    assert NEW_SECRET.removeprefix("whsec_") in config.secrets
    assert OLD_SECRET.removeprefix("whsec_") in config.secrets


async def test_a_wrong_secret_fails_and_unsigned_targets_send_no_headers(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
) -> None:
    sink, url = await start_sink([200])
    config = make_config(
        {
            "signed": {"type": "http", "url": url, "sign": NEW_SECRET},
            "plain": {"type": "http", "url": url},
        },
        {"lead": {"path": "/hooks/lead", "targets": ["signed", "plain"]}},
    )
    relay = await start_relay(config, background=False, clock=FakeClock())
    async with http.post(relay.ingress_url + "/hooks/lead", data=b"a=1") as answer:
        assert answer.status == 200
    await relay.scheduler.drain()
    signed = [r for r in sink.requests if "webhook-signature" in r.headers]
    plain = [r for r in sink.requests if "webhook-signature" not in r.headers]
    assert len(signed) == len(plain) == 1
    headers = {name.lower(): value for name, value in signed[0].headers.items()}
    now = int(headers["webhook-timestamp"])
    assert spec_verifies(NEW_SECRET, headers, signed[0].body, now)
    assert not spec_verifies(OLD_SECRET, headers, signed[0].body, now)
    assert "webhook-id" not in plain[0].headers


def test_standardwebhooks_library_accepts_our_signature() -> None:
    standardwebhooks = pytest.importorskip("standardwebhooks")
    key = base64.b64decode(NEW_SECRET.removeprefix("whsec_"))
    body = b'{"OrderId": "42", "Status": "CONFIRMED"}'
    headers = signature_headers([key], "msg_relay_7_0123456789abcdef", time.time(), body)
    verified = standardwebhooks.Webhook(NEW_SECRET).verify(body, headers)
    assert verified == {"OrderId": "42", "Status": "CONFIRMED"}


@pytest.mark.parametrize("value", ["whsec_", "whsec_not base64!", "plain text"])
def test_a_bad_secret_names_the_key_and_hides_the_value(
    make_config: ConfigFactory, value: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        make_config({"crm": {"type": "http", "url": "http://127.0.0.1:1/", "sign": value}}, ROUTES)
    message = str(raised.value)
    assert "targets.crm.sign" in message
    assert "whsec_" in message
    if value != "whsec_":
        assert value not in message


async def test_webhook_ids_never_repeat_across_databases(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
) -> None:
    # The spec ("Idempotency"): receivers should use webhook-id to avoid
    # processing a message twice. Two databases (a reinstall, a second relay,
    # a restored backup) each number deliveries from 1: the id must still
    # name one message only, or the receiver drops the second database's.
    sink, url = await start_sink([503, 200])
    target = {"type": "http", "url": url, "sign": NEW_SECRET}
    ids = []
    for database in ("first.db", "second.db"):
        config = make_config({"crm": target}, ROUTES, storage={"path": database})
        relay = await start_relay(config, background=False, clock=FakeClock())
        async with http.post(relay.ingress_url + "/hooks/lead", data=b"a=1") as answer:
            assert answer.status == 200
        await relay.scheduler.drain()
        [event] = await relay.store.list_events(EventQuery())
        assert event.deliveries[0].id == 1
        ids.append([r.headers["webhook-id"] for r in sink.requests])
        sink.requests.clear()
    first, second = ids
    assert len(first) == len(second) == 2  # each sink.script starts again with a 503
    assert first[0] == first[1]
    assert second[0] == second[1]
    assert second[0] != first[0]
    assert first[0].startswith("msg_relay_1_")
    assert second[0].startswith("msg_relay_1_")
