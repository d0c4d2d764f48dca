"""What the source kinds share: signatures, constant-time comparison, fields
of a body, a plain answer. (What a source decides: relay.kinds.source.)"""

from __future__ import annotations

import base64
import hmac
from collections.abc import Iterable
from typing import Any

from relay.config.model import Answer


def hmac_signatures(
    secrets: Iterable[str | bytes], message: bytes, algorithm: str, encoding: str
) -> list[str]:
    """The signature each accepted secret gives `message`, hex or base64."""
    signatures = []
    for secret in secrets:
        key = secret.encode() if isinstance(secret, str) else secret
        digest = hmac.digest(key, message, algorithm)
        signatures.append(digest.hex() if encoding == "hex" else base64.b64encode(digest).decode())
    return signatures


def matches_any(given: str | bytes | None, expected: Iterable[str | bytes]) -> bool:
    """Constant-time comparison against each accepted secret (rotation: old and new)."""
    if given is None:
        return False
    given_bytes = given.encode() if isinstance(given, str) else given
    found = False
    for candidate in expected:
        candidate_bytes = candidate.encode() if isinstance(candidate, str) else candidate
        # No early exit: the time taken does not say which secret matched.
        found |= hmac.compare_digest(given_bytes, candidate_bytes)
    return found


def text_answer(body: str, status: int = 200) -> Answer:
    return Answer(status=status, body=body.encode(), content_type="text/plain")


def joined_key(*parts: object) -> str | None:
    """A key from several fields, or None when any is missing."""
    if any(part is None or part == "" for part in parts):
        return None
    return ":".join(str(part) for part in parts)


def json_field(data: Any, *path: str) -> Any:
    """The value at `path` in a parsed JSON body, or None where it stops."""
    for name in path:
        if not isinstance(data, dict):
            return None
        data = data.get(name)
    return data
