"""`source = "standard-webhooks"`: Standard Webhooks senders (Svix and others),
v1 (HMAC) and v1a (ed25519) signatures."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from relay.config.model import Answer
from relay.config.reader import ConfigError, Section
from relay.config.shared import secret_list, whpk, whsec
from relay.kinds.base import SenderRetry, SourceKind
from relay.kinds.source import Accept, Check, Reject, Source
from relay.sources.base import hmac_signatures, matches_any

if TYPE_CHECKING:
    from relay.core.incoming import Incoming


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
    return StandardWebhooks(settings)


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


# Ed25519 (v1a) with `cryptography` (PyCA), imported only when a route names a
# `public_key`: the package most Python installs already carry (pip, Debian's
# python3-cryptography), binding OpenSSL's ed25519 rather than shipping a crypto
# library of its own. The config refuses a `public_key` without it installed.


def ed25519_keys(raw_keys: Sequence[bytes]) -> tuple[Any, ...]:
    """Public key objects for the 32-byte keys (none: no import at all)."""
    if not raw_keys:
        return ()
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    return tuple(Ed25519PublicKey.from_public_bytes(key) for key in raw_keys)


def ed25519_valid(public_keys: Sequence[Any], signature: str, message: bytes) -> bool:
    """True when `signature` (base64) is one of these keys' signature of `message`."""
    if not public_keys:
        return False
    from cryptography.exceptions import InvalidSignature

    try:
        raw = base64.b64decode(signature, validate=True)
    except (binascii.Error, ValueError):
        return False
    for key in public_keys:
        try:
            key.verify(raw, message)
        except InvalidSignature:
            continue
        return True
    return False


KIND = SourceKind(
    name="standard-webhooks",
    parse=parse,
    build=build,
    secret_keys=("secret",),
    secret_headers=SIGNATURE_HEADERS,
    retry_window=SenderRetry("a Standard Webhooks sender", 27 * 3600.0),
)
