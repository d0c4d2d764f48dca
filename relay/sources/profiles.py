"""The source profiles: how each provider proves itself, names its events, wants its answer."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

from relay.config import Answer
from relay.incoming import Incoming
from relay.kinds.sources.cdek import CdekSource
from relay.kinds.sources.generic import GenericSource
from relay.kinds.sources.hmac import HmacSource
from relay.kinds.sources.standard_webhooks import StandardWebhooksSource
from relay.kinds.sources.tbank import TbankSource
from relay.kinds.sources.telegram import SECRET_TOKEN_HEADER, TelegramSource
from relay.kinds.sources.tilda import TildaSource
from relay.kinds.sources.woocommerce import SIGNATURE_HEADER, WooCommerceSource
from relay.sources.base import (
    Accept,
    Check,
    Ping,
    Reject,
    hmac_signatures,
    joined_key,
    matches_any,
    text_answer,
)
from relay.sources.ed25519 import ed25519_keys, ed25519_valid


def _field(data: Any, *path: str) -> Any:
    for name in path:
        if not isinstance(data, dict):
            return None
        data = data.get(name)
    return data


class Generic:
    """Any sender; optionally a shared token in a header or the query string."""

    answer: Answer | None = None

    def __init__(self, settings: GenericSource) -> None:
        self.settings = settings

    def check(self, incoming: Incoming, now: float) -> Check:
        settings = self.settings
        if settings.tokens:
            given = incoming.headers.get(settings.token_header)
            if given is None:
                given = incoming.query_fields.get(settings.token_query)
            if given is None:
                return Reject(
                    "missing_token",
                    f"no {settings.token_header} header or ?{settings.token_query}=",
                )
            if not matches_any(given, settings.tokens):
                return Reject("bad_token")
        return Accept()

    def key(self, incoming: Incoming) -> str | None:
        return None


class Tilda:
    """Tilda forms: urlencoded fields, or a JSON object when the webhook is set to
    send JSON; `test=test` (or {"test": "test"}) when the webhook is connected.

    Tilda waits 5 s for an answer, then retries twice a minute apart with the
    same `tranid`: that is the key.
    """

    answer: Answer | None = text_answer("ok")

    def __init__(self, settings: TildaSource) -> None:
        self.settings = settings

    def check(self, incoming: Incoming, now: float) -> Check:
        settings = self.settings
        if settings.api_keys:
            # A key in the header is checked before the body is parsed at all:
            # a forged request then costs no parsing.
            header_key = incoming.headers.get(settings.api_key_header)
            if header_key is not None and not matches_any(header_key, settings.api_keys):
                return Reject("bad_api_key")
        fields = _tilda_fields(incoming)
        if fields.get("test") == "test":
            return Ping(text_answer("ok"))
        if settings.api_keys:
            given = incoming.headers.get(settings.api_key_header) or fields.get(
                settings.api_key_field
            )
            if not given or not isinstance(given, str):
                return Reject("missing_api_key")
            if not matches_any(given, settings.api_keys):
                return Reject("bad_api_key")
        return Accept(self.key(incoming))

    def key(self, incoming: Incoming) -> str | None:
        tranid = _tilda_fields(incoming, keyed=True).get("tranid")
        return str(tranid) if tranid not in (None, "") else None


def _tilda_fields(incoming: Incoming, *, keyed: bool = False) -> dict[str, Any]:
    """The lead's fields: the form, or the JSON object Tilda sends instead
    (`keyed`: with bytes that are not UTF-8 kept, for its key)."""
    form = incoming.key_form if keyed else incoming.form
    if form is not None:
        return dict(form)
    data = incoming.json
    return data if isinstance(data, dict) else {}


class Tbank:
    """T-Bank acquiring notifications, signed with a Token over the root fields."""

    answer: Answer | None = text_answer("OK")  # anything else makes T-Bank send it again

    def __init__(self, settings: TbankSource) -> None:
        self.settings = settings

    def check(self, incoming: Incoming, now: float) -> Check:
        data = incoming.json
        if not isinstance(data, dict):
            return Reject("not_json", "a T-Bank notification is a JSON object")
        given = data.get("Token")
        if not isinstance(given, str):
            return Reject("missing_signature", "no Token field")
        expected = [tbank_token(data, password) for password in self.settings.passwords]
        if not matches_any(given.lower(), expected):
            return Reject("bad_signature")
        return Accept(self.key(incoming))

    def key(self, incoming: Incoming) -> str | None:
        # T-Bank re-sends a notification until it gets OK, with the same fields
        # and so the same Token; any other notification (a second partial
        # refund of one payment: same PaymentId and Status, another Amount)
        # has another Token. PaymentId and Status are there to be read.
        data = incoming.json
        token = data.get("Token") if isinstance(data, dict) else None
        if not isinstance(token, str):
            return None
        return joined_key(data.get("PaymentId"), data.get("Status"), token.lower())


def tbank_token(data: dict[str, Any], password: str) -> str:
    """T-Bank's Token: root fields but Token and nested objects, plus Password,
    sorted by name, values concatenated (booleans as true/false), SHA-256 hex."""
    fields = {
        name: value
        for name, value in data.items()
        if name != "Token" and not isinstance(value, dict | list)
    }
    fields["Password"] = password
    joined = "".join(_tbank_value(fields[name]) for name in sorted(fields))
    return hashlib.sha256(joined.encode()).hexdigest()


def _tbank_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    return str(value)


_WOO_PING = re.compile(rb"webhook_id=\d+")


class WooCommerce:
    """WooCommerce: base64 HMAC-SHA256 of the body in X-WC-Webhook-Signature."""

    answer: Answer | None = None

    def __init__(self, settings: WooCommerceSource) -> None:
        self.settings = settings

    def check(self, incoming: Incoming, now: float) -> Check:
        if _WOO_PING.fullmatch(incoming.body.strip()):
            # Sent unsigned when the webhook is created or saved.
            return Ping(text_answer("ok"))
        given = incoming.headers.get(SIGNATURE_HEADER)
        if not given:
            return Reject("missing_signature", f"no {SIGNATURE_HEADER} header")
        expected = hmac_signatures(self.settings.secrets, incoming.body, "sha256", "base64")
        if not matches_any(given.strip(), expected):
            return Reject("bad_signature")
        return Accept(self.key(incoming))

    def key(self, incoming: Incoming) -> str | None:
        return woocommerce_key(incoming)


def woocommerce_key(incoming: Incoming) -> str:
    """What names one WooCommerce notification: webhook, topic, resource id and
    its modification time.

    Not X-WC-Webhook-Delivery-ID: WooCommerce computes it as
    wp_hash(webhook_id . strtotime('now')) (WC_Webhook::get_new_delivery_id),
    the same for every delivery of one webhook within a second, so two orders
    saved in one second (a bulk edit, a queue flush) would share it. An update
    that changes an order without moving date_modified keeps the key but not
    the content: the key-conflict rule then stores it as its own event.

    A payload without an id and a modification time (`action.*` topics'
    {"action", "arg"}, a deleted resource's {"id": N}) repeats its bytes for
    every real event: an order deleted, restored and deleted again. WooCommerce
    never re-sends a delivery (`deliver()` sends once, `failed_delivery()` only
    counts), so such a payload is named by its delivery id and its content:
    two deliveries are two events, and only the very same request again (a
    replay) is a duplicate. Two such deliveries of one webhook with one body
    within one second carry nothing that tells them apart and stay one event.
    """
    data = incoming.json
    topic = incoming.headers.get("X-WC-Webhook-Topic", "")
    webhook = incoming.headers.get("X-WC-Webhook-ID", "")
    resource = _field(data, "id")
    modified = _field(data, "date_modified_gmt") or _field(data, "date_modified")
    if resource is not None and modified:
        return f"wc:{webhook}:{topic}:{resource}:{modified}"
    delivery = incoming.headers.get("X-WC-Webhook-Delivery-ID", "")
    return f"wc:{webhook}:{topic}:delivery:{delivery}:body:{incoming.digest.hex()}"


class Telegram:
    """Telegram bot updates: the secret token set with setWebhook, in a header."""

    answer: Answer | None = text_answer("")  # a JSON body could be read as a Bot API call

    def __init__(self, settings: TelegramSource) -> None:
        self.settings = settings

    def check(self, incoming: Incoming, now: float) -> Check:
        given = incoming.headers.get(SECRET_TOKEN_HEADER)
        if given is None:
            return Reject("missing_token", f"no {SECRET_TOKEN_HEADER} header")
        if not matches_any(given, self.settings.secret_tokens):
            return Reject("bad_token")
        return Accept(self.key(incoming))

    def key(self, incoming: Incoming) -> str | None:
        update_id = _field(incoming.json, "update_id")
        return str(update_id) if update_id is not None else None


class Cdek:
    """CDEK v2 webhooks: unsigned (use a secret path and allow_ips); CDEK never retries."""

    answer: Answer | None = None

    def __init__(self, settings: CdekSource) -> None:
        self.settings = settings

    def check(self, incoming: Incoming, now: float) -> Check:
        return Accept(self.key(incoming))

    def key(self, incoming: Incoming) -> str | None:
        data = incoming.json
        # Older payloads carry the status as attributes.status_code instead.
        code = _field(data, "attributes", "code")
        if code is None or code == "":
            code = _field(data, "attributes", "status_code")
        changed_at = _field(data, "attributes", "status_date_time")
        return joined_key(_field(data, "uuid"), code, changed_at)


class StandardWebhooks:
    """Standard Webhooks: v1 HMAC-SHA256 and v1a ed25519 signatures of
    id.timestamp.body, with a replay window.

    As the reference libraries do: the header may carry several signatures
    separated by spaces (any one valid is enough), and the headers may be
    Svix's `svix-id`, `svix-timestamp`, `svix-signature` (Svix's library reads
    those first, then `webhook-*`).
    """

    answer: Answer | None = None

    def __init__(self, settings: StandardWebhooksSource) -> None:
        self.settings = settings
        self._public_keys = ed25519_keys(settings.public_keys)

    def check(self, incoming: Incoming, now: float) -> Check:
        headers = incoming.headers
        webhook_id = _svix_or_standard(headers, "id")
        timestamp = _svix_or_standard(headers, "timestamp")
        signatures = _svix_or_standard(headers, "signature")
        if not webhook_id or not timestamp or not signatures:
            return Reject(
                "missing_signature",
                "webhook-id, -timestamp and -signature (or svix-id, -timestamp, -signature) needed",
            )
        try:
            sent_at = int(timestamp)
        except ValueError:
            return Reject("bad_timestamp")
        if abs(now - sent_at) > self.settings.tolerance:
            return Reject("stale_timestamp", f"timestamp {sent_at} is outside the tolerance")
        signed = f"{webhook_id}.{timestamp}.".encode() + incoming.body
        by_version: dict[str, list[str]] = {}
        for candidate in signatures.split():
            version, _, signature = candidate.partition(",")
            by_version.setdefault(version, []).append(signature)
        if by_version.get("v1") and self.settings.secrets:
            expected = hmac_signatures(self.settings.secrets, signed, "sha256", "base64")
            if any(matches_any(signature, expected) for signature in by_version["v1"]):
                return Accept(self.key(incoming))
        v1a = by_version.get("v1a", [])
        if any(ed25519_valid(self._public_keys, signature, signed) for signature in v1a):
            return Accept(self.key(incoming))
        return Reject("bad_signature")

    def key(self, incoming: Incoming) -> str | None:
        return _svix_or_standard(incoming.headers, "id") or None


def _svix_or_standard(headers: Mapping[str, str], name: str) -> str | None:
    return headers.get(f"svix-{name}") or headers.get(f"webhook-{name}")


class Hmac:
    """Any sender signing the raw body with an HMAC in one header."""

    answer: Answer | None = None

    def __init__(self, settings: HmacSource) -> None:
        self.settings = settings

    def check(self, incoming: Incoming, now: float) -> Check:
        settings = self.settings
        given = incoming.headers.get(settings.header)
        if not given:
            return Reject("missing_signature", f"no {settings.header} header")
        if settings.prefix:
            if not given.startswith(settings.prefix):
                return Reject("bad_signature", f"signature does not start with {settings.prefix}")
            given = given[len(settings.prefix) :]
        expected = hmac_signatures(
            settings.secrets, incoming.body, settings.algorithm, settings.encoding
        )
        given = given.strip()
        if settings.encoding == "hex":
            given = given.lower()
        if not matches_any(given, expected):
            return Reject("bad_signature")
        return Accept()

    def key(self, incoming: Incoming) -> str | None:
        return None
