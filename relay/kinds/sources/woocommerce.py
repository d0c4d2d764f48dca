"""`source = "woocommerce"`: WooCommerce webhooks, HMAC-SHA256 in base64."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from relay.config.reader import Section
from relay.config.sources import secret_list
from relay.kinds.base import SourceKind

if TYPE_CHECKING:
    from relay.sources.base import Source


# Where WooCommerce puts its base64 HMAC-SHA256 of the body
# (woocommerce/includes/class-wc-webhook.php, get_delivery_headers... 'X-WC-Webhook-Signature').
SIGNATURE_HEADER = "X-WC-Webhook-Signature"


@dataclass(frozen=True)
class WooCommerceSource:
    secrets: tuple[str, ...]


def parse(section: Section) -> WooCommerceSource:
    return WooCommerceSource(secrets=secret_list(section, "secret"))


def build(settings: WooCommerceSource) -> Source:
    from relay.sources.profiles import WooCommerce

    return WooCommerce(settings)


def secrets(settings: WooCommerceSource) -> Iterable[str]:
    return settings.secrets


KIND = SourceKind(
    name="woocommerce",
    parse=parse,
    build=build,
    secrets=secrets,
    secret_keys=("secret",),
    secret_headers=(SIGNATURE_HEADER,),
)
