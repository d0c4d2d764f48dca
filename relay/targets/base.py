"""What every target kind shares: the headers each request carries, its
templates' context, and rendering off the event loop. (What a target is:
relay.kinds.target.)"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from relay.core.identity import as_sf_string
from relay.core.payload import event_fields, template_context
from relay.kinds.target import Envelope
from relay.targets.outbound.policy import sendable

if TYPE_CHECKING:
    from relay.templates import Template  # Jinja2: loaded by a config's first template

_Built = TypeVar("_Built")


# How Idempotency-Key is written: a bare token, or the draft's quoted String
# (draft-ietf-httpapi-idempotency-key-header section 2: "Its value MUST be a String").
KeyForm = Literal["token", "string"]
KEY_FORMS: tuple[KeyForm, ...] = ("token", "string")


def relay_headers(envelope: Envelope, key_form: KeyForm = "token") -> dict[str, str]:
    """The headers every outgoing HTTP request carries: the delivery's identity
    as `Idempotency-Key`, what a receiver de-duplicates on (relay.core.
    identity), in `key_form`: a bare token, as receivers' own documentation
    shows it (Stripe: `Idempotency-Key: KG5LxwFBepaKHyUD`), or the IETF
    draft's quoted String. `X-Relay-Event-Id` names the event in this relay
    (`relay show`), unique only within its database; `X-Relay-Attempt` counts."""
    key = sendable(envelope.receiver_key)  # an older delivery's event key may need it
    return {
        "Idempotency-Key": as_sf_string(key) if key_form == "string" else key,
        "X-Relay-Event-Id": str(envelope.delivery.event_id),
        "X-Relay-Attempt": str(envelope.attempt),
    }


# A preview renders an event not stored yet (`relay render`, the resend
# preview) with the placeholder id 0, and its delivery with id 0 and no tag
# (its identity: Idempotency-Key, a signed request's webhook-id), which no
# receiver ever sees.
_UNSTORED_EVENT_ID = re.compile(r"^(X-Relay-Event-Id:) 0$", re.MULTILINE | re.IGNORECASE)
_UNSTORED_IDENTITY = re.compile(
    r'^(webhook-id:|Idempotency-Key:) "?msg_relay_0"?$', re.MULTILINE | re.IGNORECASE
)


def unstored_event_id(preview: str, said: str) -> str:
    """A preview's `X-Relay-Event-Id: 0` said as what it will be (`said`), and
    its delivery's identity as made once it is stored."""
    preview = _UNSTORED_EVENT_ID.sub(lambda match: f"{match.group(1)} {said}", preview)
    return _UNSTORED_IDENTITY.sub(
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
    return event_fields(delivery.event_id, delivery.route, delivery.received_at, envelope.event_key)


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
