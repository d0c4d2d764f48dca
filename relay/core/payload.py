"""A webhook's raw parts turned into what templates read: json, form, headers, query.

Parsing is lazy in the only way that matters: a caller passes the names a
template reads, and only those are built. The raw body is never changed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any, Protocol
from urllib.parse import parse_qsl, unquote_plus

import orjson
from multidict import CIMultiDict, CIMultiDictProxy

from relay.core.exact import exact_fields, exact_text
from relay.core.fields import FormFields
from relay.core.multipart import MAX_PARTS, parse_multipart, text_codec
from relay.core.units import format_instant


def storable(text: str) -> str:
    """Text safe to store: bytes that were not valid UTF-8 (which aiohttp hands
    over as lone surrogates) become U+FFFD instead of failing the insert."""
    if text.isascii():  # nearly always, and much cheaper to ask
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        try:  # bytes smuggled in as surrogates: each one bad byte, one U+FFFD
            raw = text.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            raw = text.encode("utf-8", "surrogatepass")
        return raw.decode("utf-8", "replace")
    return text


def media_type(content_type: str | None) -> str:
    return (content_type or "").split(";", 1)[0].strip().lower()


def parse_json(body: bytes) -> Any:
    """The parsed body, or None when it is not JSON."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None


# Fields a urlencoded body may have to be read as a form, as many as a
# multipart one may have parts (relay.core.multipart.MAX_PARTS): parsing a body of
# hundreds of thousands of tiny fields would hold the event loop.
MAX_FORM_FIELDS = MAX_PARTS


def declared_charset(content_type: str | None) -> str | None:
    """The charset a Content-Type declares, as Python names it (`cp1251`);
    None when it declares none, or one that is not a plain text encoding."""
    for parameter in (content_type or "").split(";")[1:]:
        name, _, value = parameter.partition("=")
        if name.strip().lower() == "charset":
            return text_codec(value)
    return None


def parse_form(
    content_type: str | None, body: bytes, *, exact: bool = False
) -> dict[str, str] | None:
    """Form fields of a urlencoded or multipart body (first value of a repeated
    field; uploaded files are not fields), else None; None too for a body of
    more than MAX_FORM_FIELDS fields (no sender's form has that many).

    As people read them: in the charset the Content-Type declares (UTF-8 when
    it declares none), each byte that cannot be decoded a U+FFFD. `exact`:
    the exact reading instead (relay.core.exact), for what decides identity:
    two orders must not become one key."""
    kind = media_type(content_type)
    if kind == "multipart/form-data":
        errors = "surrogateescape" if exact else "replace"
        parsed = parse_multipart(content_type or "", body, errors)
        return FormFields(parsed) if parsed is not None else None
    if kind != "application/x-www-form-urlencoded":
        return None
    charset = "utf-8" if exact else declared_charset(content_type) or "utf-8"
    try:
        text = exact_text(body) if exact else body.decode(charset)
        # parse_qsl counts the separators before it parses anything.
        if exact:
            pairs = exact_fields(text, MAX_FORM_FIELDS)
        else:
            pairs = parse_qsl(
                text,
                keep_blank_values=True,
                max_num_fields=MAX_FORM_FIELDS,
                encoding=charset,
                errors="replace",
            )
    except (UnicodeDecodeError, ValueError):
        return None
    fields = FormFields()
    for name, value in pairs:
        fields.setdefault(name, value)
    return fields


def strip_form_fields(content_type: str | None, body: bytes, names: Iterable[str]) -> bytes:
    """An urlencoded body without the named fields; every other byte as it was.
    Other bodies are returned unchanged."""
    drop = frozenset(names)
    if not drop or media_type(content_type) != "application/x-www-form-urlencoded":
        return body
    kept = [
        piece
        for piece in body.split(b"&")
        if unquote_plus(piece.partition(b"=")[0].decode("utf-8", "replace")) not in drop
    ]
    return b"&".join(kept)


def parse_query(query: str, *, exact: bool = False) -> dict[str, str]:
    """A query string's fields (the first value of a repeated one), as people
    read them (U+FFFD for bytes that are not UTF-8) or `exact`ly."""
    pairs = exact_fields(query) if exact else parse_qsl(query, keep_blank_values=True)
    fields: dict[str, str] = {}
    for name, value in pairs:
        fields.setdefault(name, value)
    return fields


def header_map(headers: Iterable[tuple[str, str]]) -> CIMultiDictProxy[str]:
    return CIMultiDictProxy(CIMultiDict(headers))


# What a template can read, by where it is written. A route's `when`,
# `idempotency_key` and `order_by` are decided before the request is stored,
# when it has no id: they read the request; a target's templates also `event`.
# The config refuses any other name at load (relay.templates.compile_template).
REQUEST_VARIABLES = frozenset({"headers", "json", "form", "query", "body"})
EVENT_VARIABLES = REQUEST_VARIABLES | {"event"}


def event_fields(
    event_id: int, route: str, received_at: float, idempotency_key: str | None
) -> dict[str, Any]:
    """An event as every reader is shown it: templates' `event`, the file
    target's record, the API and the CLI (`relay.ops.views`). Its id as a
    string, as every id relay shows, and its time as `format_instant` writes
    every time ("2026-12-01T10:00:00.123Z"): one shape, declared here only."""
    return {
        "id": str(event_id),
        "route": route,
        "received_at": format_instant(received_at),
        "idempotency_key": idempotency_key,
    }


class RequestParts(Protocol):
    """A request as templates read it; each view parsed at most once by its holder."""

    @property
    def header_map(self) -> Mapping[str, str]: ...

    @property
    def body(self) -> bytes: ...

    @property
    def json(self) -> Any: ...

    @property
    def form(self) -> dict[str, str] | None: ...

    @property
    def query_fields(self) -> dict[str, str]: ...


@dataclass
class Payload:
    """A webhook's request as received and as stored: the one value every record
    of it carries (the new event, a claimed delivery, an event's detail, a
    target's envelope). Its parsed views are built on first use, once, however
    many templates or pages read them.

    Never changed once made (its views would no longer match it): `replace`
    makes another. Not a frozen dataclass only because one is made for every
    webhook, and a frozen one sets each field through object.__setattr__."""

    method: str
    path: str
    query: str
    headers: Sequence[tuple[str, str]]  # as received, in order, repeats kept
    content_type: str | None
    body: bytes

    @classmethod
    def received(
        cls, method: str, path: str, query: str, headers: Sequence[tuple[str, str]], body: bytes
    ) -> Payload:
        """A request as it came: its content type is its first Content-Type header."""
        content_type = next((v for n, v in headers if n.lower() == "content-type"), None)
        return cls(method, path, query, headers, content_type, body)

    def as_stored(self) -> Payload:
        """This payload as it can be stored: in its query and content type, bytes
        that were not UTF-8 become U+FFFD (see `storable`). Most need no change."""
        query = storable(self.query)
        content_type = None if self.content_type is None else storable(self.content_type)
        if query is self.query and content_type is self.content_type:
            return self
        return replace(self, query=query, content_type=content_type)

    @cached_property
    def header_map(self) -> CIMultiDictProxy[str]:
        """The headers by name, case-insensitive (a repeated name: its first value)."""
        return header_map(self.headers)

    @cached_property
    def json(self) -> Any:
        return parse_json(self.body)

    @cached_property
    def form(self) -> dict[str, str] | None:
        return parse_form(self.content_type, self.body)

    @cached_property
    def query_fields(self) -> dict[str, str]:
        return parse_query(self.query)


def template_context(
    wanted: Iterable[str], parts: RequestParts, event: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The variables named in `wanted` (and only those) for a template render:
    the one builder for ingress (`when`, keys, ordering) and targets alike."""
    names = set(wanted)
    context: dict[str, Any] = {"headers": parts.header_map}
    if "json" in names:
        context["json"] = parts.json
    if "form" in names:
        context["form"] = parts.form
    if "body" in names:
        context["body"] = parts.body.decode("utf-8", errors="replace")
    if "query" in names:
        context["query"] = parts.query_fields
    if event is not None:
        context["event"] = event
    return context


def first_header(headers: Mapping[str, str], names: Sequence[str]) -> str | None:
    for name in names:
        value = headers.get(name)
        if value:
            return value
    return None
