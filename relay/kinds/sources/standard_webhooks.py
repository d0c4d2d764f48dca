"""`source = "standard-webhooks"`: Standard Webhooks senders (Svix and others),
v1 (HMAC) and v1a (ed25519) signatures."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from relay.config.reader import ConfigError, Section
from relay.config.sources import secret_list, whpk, whsec
from relay.kinds.base import SenderRetry, SourceKind

if TYPE_CHECKING:
    from relay.sources.base import Source


# The signatures' header in the Standard Webhooks spec (standard-webhooks/spec,
# spec/standard-webhooks.md), or Svix's own name for it.
SIGNATURE_HEADERS = ("webhook-signature", "svix-signature")


@dataclass(frozen=True)
class StandardWebhooksSource:
    secrets: tuple[bytes, ...]  # decoded from "whsec_<base64>": v1 (HMAC-SHA256)
    tolerance: float = 300.0
    public_keys: tuple[bytes, ...] = ()  # decoded from "whpk_<base64>": v1a (ed25519)


def parse(section: Section) -> StandardWebhooksSource:
    secrets = tuple(
        whsec(section, "secret", value) for value in secret_list(section, "secret", required=False)
    )
    public_keys = tuple(
        whpk(section, "public_key", value)
        for value in secret_list(section, "public_key", required=False)
    )
    if not secrets and not public_keys:
        raise ConfigError(
            section.key("secret"),
            'expected a secret like "whsec_<base64>" (v1 signatures), or public_key'
            ' = "whpk_<base64>" (v1a, ed25519), or both',
        )
    return StandardWebhooksSource(
        secrets=secrets,
        public_keys=public_keys,
        tolerance=section.duration("tolerance", 300.0),
    )


def build(settings: StandardWebhooksSource) -> Source:
    from relay.sources.profiles import StandardWebhooks

    return StandardWebhooks(settings)


KIND = SourceKind(
    name="standard-webhooks",
    parse=parse,
    build=build,
    secret_keys=("secret",),
    secret_headers=SIGNATURE_HEADERS,
    retry_window=SenderRetry("a Standard Webhooks sender", 27 * 3600.0),
)
