"""What a source profile decides about one request, as values.

Accept(key)    verified; `key` is the provider's own event id, if it has one
Ping(answer)   a test request sent when the webhook was connected: answer, store nothing
Reject(reason) not from who it claims to be: 401, nothing stored
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from relay.config.model import Answer
from relay.core.incoming import Incoming


@dataclass(frozen=True)
class Accept:
    key: str | None = None


# What most checks answer, made once (frozen: one is as good as another).
ACCEPT = Accept()


@dataclass(frozen=True)
class Ping:
    answer: Answer


# Why a request is refused, in the one vocabulary of the rejection log and
# relay_rejected_total's `reason` (exported at 0 for every route from the
# start): a source kind says one of these (tests/integration/test_kinds.py).
REJECT_REASONS = (
    "ip_not_allowed",
    "missing_token",
    "bad_token",
    "missing_api_key",
    "bad_api_key",
    "missing_signature",
    "bad_signature",
    "bad_timestamp",
    "stale_timestamp",
    "not_json",
)


@dataclass(frozen=True)
class Reject:
    reason: str  # one of REJECT_REASONS: a metrics label and the rejection log's reason
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
