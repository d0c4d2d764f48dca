"""What a source profile decides about one request, as values.

Accept(key)    verified; `key` is the provider's own event id, if it has one
Ping(answer)   a test request sent when the webhook was connected: answer, store nothing
Reject(reason) not from who it claims to be: 401, nothing stored
"""

from __future__ import annotations

import base64
import hmac
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from relay.config.model import Answer

if TYPE_CHECKING:
    from relay.ingress.incoming import Incoming


@dataclass(frozen=True)
class Accept:
    key: str | None = None


# What most checks answer, made once (frozen: one is as good as another).
ACCEPT = Accept()


@dataclass(frozen=True)
class Ping:
    answer: Answer


@dataclass(frozen=True)
class Reject:
    reason: str  # a short code: a metrics label and the rejection log's reason
    detail: str = ""


Check = Accept | Ping | Reject


class Source(Protocol):
    # The answer for accepted and duplicate events (None: relay's JSON answer).
    answer: Answer | None

    def check(self, incoming: Incoming, now: float) -> Check: ...

    def key(self, incoming: Incoming) -> str | None:
        """The provider's own event id, read without verifying anything: what
        `check` puts in Accept, and what `relay render` shows for an unsigned
        sample."""
        ...


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
