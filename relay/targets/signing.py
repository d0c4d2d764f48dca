"""Standard Webhooks signatures on outgoing requests (https://www.standardwebhooks.com).

The receiver checks `webhook-signature` against HMAC-SHA256 of
"{webhook-id}.{webhook-timestamp}.{body}" keyed with its `whsec_` secret, so
the signature covers exactly the bytes sent. One signature per secret: while
a secret is being rotated the receiver accepts either, and so do we send both.
"""

from __future__ import annotations

import base64
import hmac
from collections.abc import Sequence

# What relay writes when a target signs: the signature covers these values.
SIGNATURE_HEADERS = frozenset({"webhook-id", "webhook-timestamp", "webhook-signature"})


def sign(secrets: Sequence[bytes], message_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` value: "v1,<base64>" per secret, space-separated."""
    signed = f"{message_id}.{timestamp}.".encode() + body
    return " ".join(
        "v1," + base64.b64encode(hmac.digest(secret, signed, "sha256")).decode()
        for secret in secrets
    )


def signature_headers(
    secrets: Sequence[bytes], message_id: str, timestamp: float, body: bytes
) -> dict[str, str]:
    seconds = int(timestamp)
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(seconds),
        "webhook-signature": sign(secrets, message_id, seconds, body),
    }
