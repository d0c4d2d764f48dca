"""One webhook as relay sees it before storing: its parts, parsed once, on demand.

Ingress and `relay render` share this: the source profile, the idempotency
key, the `when` filters and the ordering key read the same parsed body.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from multidict import CIMultiDictProxy

from relay.config import RouteConfig, RouteTarget
from relay.core.budget import TemplateError
from relay.core.canonical import payload_digest
from relay.core.exact import exact_text, stored_key
from relay.core.payload import (
    Payload,
    first_header,
    parse_form,
    parse_query,
    storable,
    template_context,
)
from relay.store import NewDelivery, Status

if TYPE_CHECKING:  # Jinja2 is loaded by the first template a config holds
    from relay.templates import Template

KEY_HEADERS = ("Idempotency-Key", "X-Idempotency-Key", "webhook-id")


class Incoming:
    """A request on its way in: its payload, who sent it, and the server's own
    case-insensitive view of its headers when it has one. (A plain class, one
    made for every webhook: mypyc compiles its __init__.)"""

    def __init__(
        self,
        payload: Payload,
        remote: str | None = None,
        header_view: CIMultiDictProxy[str] | None = None,
    ) -> None:
        self.payload = payload
        self.remote = remote
        self.header_view = header_view

    @property
    def headers(self) -> CIMultiDictProxy[str]:
        if self.header_view is not None:
            return self.header_view
        return self.payload.header_map

    # What templates read (RequestParts): the payload's views, parsed once.
    @property
    def header_map(self) -> CIMultiDictProxy[str]:
        return self.headers

    @property
    def body(self) -> bytes:
        return self.payload.body

    @property
    def query(self) -> str:
        return self.payload.query

    @property
    def content_type(self) -> str | None:
        return self.headers.get("Content-Type")

    @property
    def json(self) -> Any:
        return self.payload.json

    @property
    def form(self) -> dict[str, str] | None:
        return self.payload.form

    @property
    def query_fields(self) -> dict[str, str]:
        return self.payload.query_fields

    @functools.cached_property
    def exact_form(self) -> dict[str, str] | None:
        """The form as identity reads it (relay.core.exact): bytes that are not
        UTF-8 kept (as surrogates, which `stored_key` escapes), not folded into U+FFFD."""
        return parse_form(self.content_type, self.body, exact=True)

    @property
    def digest(self) -> bytes:
        """The payload's digest (relay.core.canonical), reusing the JSON already parsed."""
        return payload_digest(self.body, self.content_type, self.json)

    def context(self, wanted: Iterable[str]) -> dict[str, Any]:
        return template_context(wanted, self)

    def render(self, template: Template) -> str:
        return template.render(self.context(template.variables))

    def render_exact(self, template: Template) -> str:
        """What a key or an ordering key renders to, with every byte kept
        (relay.core.exact), as `stored_key` stores it: the raw body and the
        query and form values keep each byte that is not UTF-8, where other
        templates see U+FFFD. Headers keep theirs already (relay.ingress.http1);
        JSON holds only valid UTF-8."""
        values = self.context(template.variables)
        if "body" in values:
            values["body"] = exact_text(self.body)
        if "query" in values:
            values["query"] = parse_query(self.query, exact=True)
        if "form" in values:
            values["form"] = self.exact_form
        return stored_key(template.render(values).strip())


def idempotency_key(
    route: RouteConfig, incoming: Incoming, source_key: str | None = None
) -> str | None:
    """The key as stored: the route's key template if it has one; else the key
    its source profile found (the provider's own event id); else the first of
    the usual key headers. Ingress and `relay render` both ask here."""
    if route.idempotency_key is not None:
        try:
            key = incoming.render_exact(route.idempotency_key)
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
        key = incoming.render_exact(route_target.order_by)
    except TemplateError as error:
        return NewDelivery(route_target.target, Status.DEAD, storable(f"order_by: {error}"))
    if len(key) > MAX_ORDER_KEY:
        key = "sha256:" + hashlib.sha256(key.encode()).hexdigest()
    return NewDelivery(route_target.target, order_key=key or None)
