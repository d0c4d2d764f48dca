"""`source = "woocommerce"`: WooCommerce webhooks, HMAC-SHA256 in base64."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from relay.config.model import Answer
from relay.config.reader import Section
from relay.config.shared import secret_list
from relay.kinds.base import SourceKind
from relay.kinds.source import Accept, Check, Ping, Reject, Source
from relay.sources.base import hmac_signatures, json_field, matches_any, text_answer

if TYPE_CHECKING:
    from relay.core.incoming import Incoming


# Where WooCommerce puts its base64 HMAC-SHA256 of the body
# (woocommerce/includes/class-wc-webhook.php, get_delivery_headers... 'X-WC-Webhook-Signature').
SIGNATURE_HEADER = "X-WC-Webhook-Signature"


@dataclass(frozen=True)
class WooCommerceSource:
    secrets: tuple[str, ...]


def parse(section: Section) -> WooCommerceSource:
    return WooCommerceSource(secrets=secret_list(section, "secret"))


def build(settings: WooCommerceSource) -> Source:
    return WooCommerce(settings)


def secrets(settings: WooCommerceSource) -> Iterable[str]:
    return settings.secrets


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
    resource = json_field(data, "id")
    modified = json_field(data, "date_modified_gmt") or json_field(data, "date_modified")
    if resource is not None and modified:
        return f"wc:{webhook}:{topic}:{resource}:{modified}"
    delivery = incoming.headers.get("X-WC-Webhook-Delivery-ID", "")
    return f"wc:{webhook}:{topic}:delivery:{delivery}:body:{incoming.digest.hex()}"


KIND = SourceKind(
    name="woocommerce",
    parse=parse,
    build=build,
    secrets=secrets,
    secret_keys=("secret",),
    secret_headers=(SIGNATURE_HEADER,),
)
