"""What one attempt came to, as a value the scheduler branches on."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from relay.core.printable import printable

# What is kept of a target's answer: enough to read an error message, never
# so much that a huge response can fill the database.
RESPONSE_EXCERPT_BYTES = 2048


@dataclass(frozen=True)
class SentRequest:
    """The request an attempt sent, as a person may see it: kept with the
    attempt beside the answer. The scheduler masks secrets and cuts the body
    to RESPONSE_EXCERPT_BYTES before it is stored."""

    method: str
    url: str
    headers: tuple[tuple[str, str], ...]
    body: bytes
    # How large the body was (None: as kept); what is kept may be cut
    # (relay.delivery.kept).
    size: int | None = None


class Verdict(StrEnum):
    SUCCESS = "success"
    RETRY = "retry"  # worth trying again later: 5xx, 429, network trouble
    FAIL = "fail"  # trying again will not help: 4xx, redirects, a broken template


@dataclass(frozen=True)
class Outcome:
    verdict: Verdict
    status: int | None = None
    error: str | None = None
    response: bytes = b""
    # Seconds the target asked us to wait (Retry-After, Telegram retry_after).
    retry_after: float | None = None
    # The receiver asks the sender to slow down (a 429, or a status the
    # target declares temporary: amoCRM's 403 while it blocks an address):
    # about the pace, not this message nor the target being down
    # (relay.delivery.step, rule 4).
    throttle: bool = False
    # False when the event, not the target, is why it failed (a template whose
    # output cannot be sent): the target's failure streak and alerts ignore it.
    target_at_fault: bool = True
    # What was sent, when the target says (the http target does).
    request: SentRequest | None = None

    def __post_init__(self) -> None:
        if self.error is not None:
            # The error quotes what a target said (its message, a Location, a
            # status line): it goes to log lines, `last_error` and alerts, so a
            # control character in it (ESC: a terminal's escape sequences, a
            # line break: a forged log line) is written as an escape instead.
            object.__setattr__(self, "error", printable(self.error))

    @classmethod
    def success(cls, status: int | None = None, response: bytes = b"") -> Outcome:
        return cls(Verdict.SUCCESS, status=status, response=response)

    @classmethod
    def retry(
        cls,
        error: str,
        status: int | None = None,
        response: bytes = b"",
        retry_after: float | None = None,
        *,
        throttle: bool = False,
    ) -> Outcome:
        return cls(Verdict.RETRY, status, error, response, retry_after, throttle)

    @classmethod
    def fail(cls, error: str, status: int | None = None, response: bytes = b"") -> Outcome:
        return cls(Verdict.FAIL, status, error, response)

    @classmethod
    def unsendable(cls, error: str) -> Outcome:
        """This event cannot be sent as rendered: dead at once, the target not blamed."""
        return cls(Verdict.FAIL, error=error, target_at_fault=False)
