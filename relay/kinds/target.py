"""What a target is: something that sends one delivery and says how it went.

A target knows nothing of the store, schedules or routes. It gets an
`Envelope`, renders its templates, sends, and returns an `Outcome`; the
scheduler decides what happens next. A template that fails for an event is
an Outcome too (a permanent failure: retrying would render the same thing).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from relay.core.identity import event_key, receiver_key
from relay.core.outcome import Outcome
from relay.core.payload import Payload
from relay.core.records import ClaimedDelivery


@dataclass(frozen=True)
class Envelope:
    """One attempt of a delivery, as its target gets it."""

    # The delivery as the store leased it: its event's id, route, key, arrival
    # and payload (the payload as targets get it: the route's strip_fields
    # left out of a form), declared once, in the store's record.
    delivery: ClaimedDelivery
    attempt: int  # 1 for the first attempt; repeats after a crash mid-attempt
    # When this attempt starts (the scheduler's clock): what a signature is dated.
    sent_at: float
    # Awaited by the target right before its request is written: waits for
    # the target's pace, spaced from when the previous request really went
    # out (relay.delivery.ratelimit). None: the target is not paced.
    paced: Callable[[], Awaitable[None]] | None = field(default=None, compare=False, repr=False)
    # The event loop's time by which an answer whose status came is taken as
    # it is, its body no longer waited for (before the attempt's time limit),
    # asked when the request has been written (a paced turn moves it).
    answer_by: Callable[[], float] | None = field(default=None, compare=False, repr=False)

    @property
    def payload(self) -> Payload:
        return self.delivery.payload

    @property
    def event_key(self) -> str:
        """The event's key, or its id: what templates see (relay.core.identity)."""
        return event_key(self.delivery)

    @property
    def receiver_key(self) -> str:
        """This delivery's identity: what a receiver de-duplicates on."""
        return receiver_key(self.delivery)


class Target(Protocol):
    name: str

    async def start(self) -> None: ...

    async def send(self, envelope: Envelope) -> Outcome:
        """Deliver once. Never raises for a delivery problem: that is an Outcome.

        The caller bounds the time (a timeout is an Outcome it makes itself).
        """
        ...

    def preview(self, envelope: Envelope, *, wire: bool = False) -> str:
        """What `send` would send, without sending it: as a person reads it
        (form fields and mail headers decoded), or with `wire` the exact bytes.

        Raises TemplateError when a template fails for this payload.
        """
        ...

    async def close(self) -> None: ...
