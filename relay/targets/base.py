"""What a target is: something that sends one delivery and says how it went.

A target knows nothing of SQLite, schedules or routes. It gets an `Envelope`,
renders its templates, sends, and returns an `Outcome`; the scheduler decides
what happens next. A template that fails for an event is an Outcome too (a
permanent failure: retrying would render the same thing).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from relay.core.outcome import Outcome
from relay.core.payload import Payload, event_fields, template_context

if TYPE_CHECKING:
    # A target is given the store's record of a delivery, never the store.
    from relay.store.base import ClaimedDelivery
    from relay.templates import Template  # Jinja2: loaded by a config's first template

_Built = TypeVar("_Built")


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
    def idempotency_key(self) -> str:
        """The event's idempotency key, or its id: sent so a target can de-duplicate."""
        return self.delivery.idempotency_key or str(self.delivery.event_id)


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


def relay_headers(envelope: Envelope) -> dict[str, str]:
    """The headers every outgoing request carries, so receivers can de-duplicate."""
    return {
        "Idempotency-Key": envelope.idempotency_key,
        "X-Relay-Event-Id": str(envelope.delivery.event_id),
        "X-Relay-Attempt": str(envelope.attempt),
    }


# A preview renders an event not stored yet (`relay render`, the resend
# preview) with the placeholder id 0, and its delivery with id 0 and no tag
# (a signed request's webhook-id), which no receiver ever sees.
_UNSTORED_EVENT_ID = re.compile(r"^(X-Relay-Event-Id:) 0$", re.MULTILINE | re.IGNORECASE)
_UNSTORED_WEBHOOK_ID = re.compile(r"^(webhook-id:) msg_relay_0$", re.MULTILINE | re.IGNORECASE)


def unstored_event_id(preview: str, said: str) -> str:
    """A preview's `X-Relay-Event-Id: 0` said as what it will be (`said`), and
    its webhook-id as made once its delivery is stored."""
    preview = _UNSTORED_EVENT_ID.sub(lambda match: f"{match.group(1)} {said}", preview)
    return _UNSTORED_WEBHOOK_ID.sub(
        lambda match: f"{match.group(1)} (the delivery's own, once stored)", preview
    )


def variables(templates: Iterable[Template | None]) -> frozenset[str]:
    """Every context name these templates read: only those are built per send."""
    names: set[str] = set()
    for template in templates:
        if template is not None:
            names |= template.variables
    return frozenset(names)


def envelope_event(envelope: Envelope) -> dict[str, Any]:
    """The event as every target shows it (templates' `event`, the file
    target's record): its key, or its id when it has none."""
    delivery = envelope.delivery
    return event_fields(
        delivery.event_id, delivery.route, delivery.received_at, envelope.idempotency_key
    )


def context(envelope: Envelope, wanted: Iterable[str]) -> dict[str, Any]:
    return template_context(wanted, envelope.payload, event=envelope_event(envelope))


def render_map(templates: Mapping[str, Template], values: Mapping[str, Any]) -> dict[str, str]:
    return {key: template.render(values) for key, template in templates.items()}


# One thread renders every target's templates: rendering is CPU work that
# holds the GIL, so more threads would only contend with the event loop (a
# burst of retries through a pool of six slowed ingest several-fold).
_RENDERER = ThreadPoolExecutor(1, thread_name_prefix="relay-render")


async def rendered(
    build: Callable[[Envelope], _Built], envelope: Envelope, wanted: Iterable[str]
) -> _Built:
    """`build(envelope)` (which renders templates) in the render thread when a
    template reads the payload (its cost then depends on what was sent), so a
    heavy render does not hold the event loop; inline when none does."""
    if not wanted:
        return build(envelope)
    return await asyncio.get_running_loop().run_in_executor(_RENDERER, build, envelope)
