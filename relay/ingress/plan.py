"""What becomes of a webhook once its sender is known: its idempotency key,
and one delivery per target (pending, skipped by a `when`, or ordered).

Ingress and `relay render` both decide here.
"""

from __future__ import annotations

import functools
import hashlib
from typing import TYPE_CHECKING

from relay.config import RouteConfig, RouteTarget
from relay.core.budget import TemplateError
from relay.core.exact import exact_text, stored_key
from relay.core.incoming import Incoming
from relay.core.payload import first_header, parse_query, storable
from relay.store import NewDelivery, Status

if TYPE_CHECKING:  # Jinja2 is loaded by the first template a config holds
    from relay.templates import Template

KEY_HEADERS = ("Idempotency-Key", "X-Idempotency-Key", "webhook-id")


def render_exact(incoming: Incoming, template: Template) -> str:
    """What a key or an ordering key renders to, with every byte kept
    (relay.core.exact), as `stored_key` stores it: the raw body and the
    query and form values keep each byte that is not UTF-8, where other
    templates see U+FFFD. Headers keep theirs already (relay.ingress.http1);
    JSON holds only valid UTF-8."""
    values = incoming.context(template.variables)
    if "body" in values:
        values["body"] = exact_text(incoming.body)
    if "query" in values:
        values["query"] = parse_query(incoming.query, exact=True)
    if "form" in values:
        values["form"] = incoming.exact_form
    return stored_key(template.render(values).strip())


def idempotency_key(
    route: RouteConfig, incoming: Incoming, source_key: str | None = None
) -> str | None:
    """The key as stored: the route's key template if it has one; else the key
    its source profile found (the provider's own event id); else the first of
    the usual key headers. Ingress and `relay render` both ask here."""
    if route.idempotency_key is not None:
        try:
            key = render_exact(incoming, route.idempotency_key)
        except TemplateError:
            return None
    else:
        key = stored_key(source_key or first_header(incoming.headers, KEY_HEADERS) or "")
    return key or None


def plan_deliveries(route: RouteConfig, incoming: Incoming) -> list[NewDelivery]:
    """One delivery per target: pending, or skipped by its `when`, or dead when
    the condition itself cannot be evaluated for this payload."""
    deliveries = []
    for route_target in route.targets:
        condition = route_target.when
        if condition is None and route_target.order_by is None:
            deliveries.append(_plain(route_target.target))
            continue
        if condition is not None:
            try:
                matched = condition.holds(incoming.context(condition.variables))
            except TemplateError as error:
                reason = storable(f"when: {error}")
                deliveries.append(NewDelivery(route_target.target, Status.DEAD, reason))
                continue
            if not matched:
                reason = f"when: {condition.source} is false"
                deliveries.append(NewDelivery(route_target.target, Status.SKIPPED, reason))
                continue
        deliveries.append(_ordered(route_target, incoming))
    return deliveries


@functools.lru_cache(maxsize=256)
def _plain(target: str) -> NewDelivery:
    """A pending delivery with nothing of its own: one value a target, shared
    by every event (it is frozen), not built for each."""
    return NewDelivery(target)


# Longer keys are kept as their digest: the ordering index stays small.
MAX_ORDER_KEY = 200


def _ordered(route_target: RouteTarget, incoming: Incoming) -> NewDelivery:
    """A pending delivery with its ordering key, read exactly (two orders whose
    ids differ only in bytes that are not UTF-8 are two lines); dead when the
    key cannot be worked out (never sent out of order). An empty key orders nothing."""
    if route_target.order_by is None:
        return NewDelivery(route_target.target)
    try:
        key = render_exact(incoming, route_target.order_by)
    except TemplateError as error:
        return NewDelivery(route_target.target, Status.DEAD, storable(f"order_by: {error}"))
    if len(key) > MAX_ORDER_KEY:
        key = "sha256:" + hashlib.sha256(key.encode()).hexdigest()
    return NewDelivery(route_target.target, order_key=key or None)
