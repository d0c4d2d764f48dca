"""Source profiles: verify a sender, name its event, answer it the way it expects."""

from __future__ import annotations

from relay.config import (
    CdekSource,
    GenericSource,
    HmacSource,
    SourceSettings,
    StandardWebhooksSource,
    TbankSource,
    TelegramSource,
    TildaSource,
    WooCommerceSource,
)
from relay.sources.base import Accept, Check, Ping, Reject, Source
from relay.sources.profiles import (
    Cdek,
    Generic,
    Hmac,
    StandardWebhooks,
    Tbank,
    Telegram,
    Tilda,
    WooCommerce,
)


def build_source(settings: SourceSettings) -> Source:
    if isinstance(settings, GenericSource):
        return Generic(settings)
    if isinstance(settings, TildaSource):
        return Tilda(settings)
    if isinstance(settings, TbankSource):
        return Tbank(settings)
    if isinstance(settings, WooCommerceSource):
        return WooCommerce(settings)
    if isinstance(settings, TelegramSource):
        return Telegram(settings)
    if isinstance(settings, CdekSource):
        return Cdek(settings)
    if isinstance(settings, StandardWebhooksSource):
        return StandardWebhooks(settings)
    if isinstance(settings, HmacSource):
        return Hmac(settings)
    raise TypeError(f"no source profile for {type(settings).__name__}")


__all__ = ["Accept", "Check", "Ping", "Reject", "Source", "build_source"]
