"""Who an event is about, at a glance: the fields a person recognises (a name,
a phone, an e-mail, an order, an amount) and, for a search, the words around
the match — for the lists of the CLI, the API and the dashboard, so that a
hit says whom it is about without opening it.

Read from the first HEAD_BYTES of the body (the store hands only those to a
listing): a page of 500 events reads at most a few MiB, whatever was sent.
Every value is masked as the event's page masks it, and cut to VALUE_CHARS.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator, Sequence
from typing import Any

from relay.core.payload import media_type, parse_form, parse_json
from relay.core.secrets import Masker, request_masker
from relay.ops.search import canonical_digits, fold, phone_forms
from relay.store import EventView, Queries, TextSearch

# Bytes of each listed event's body read for its glance.
HEAD_BYTES = 16 * 1024
VALUE_CHARS = 60
SNIPPET_CHARS = 40  # on each side of the match
MAX_VALUES = 500  # values visited per body

# Each role, and the field names (lower case, letters and digits only) that
# fill it in the senders' payloads: Tilda's form (Name, Phone, Email),
# WooCommerce's order (billing.first_name/last_name/phone/email, number,
# total), T-Bank's notification (OrderId, Amount), CDEK's status
# (attributes.cdek_number), a Telegram update (message.from.first_name), a
# money object's value (YooKassa's object.amount.value, see `_key`).
ROLES: tuple[tuple[str, frozenset[str]], ...] = (
    ("name", frozenset({"name", "fio", "fullname", "customername", "clientname", "firstname"})),
    ("phone", frozenset({"phone", "tel", "telephone", "mobile", "phonenumber"})),
    ("email", frozenset({"email", "mail", "emailaddress"})),
    ("order", frozenset({"orderid", "ordernumber", "order", "number", "cdeknumber"})),
    ("amount", frozenset({"amount", "total", "sum", "totalprice", "orderamount"})),
)
_NOT_ALNUM = re.compile(r"[\W_]+")


def shortened(text: str, limit: int = VALUE_CHARS) -> str:
    """`text` on one line (its whitespace runs a space), `limit` characters at
    most, an ellipsis where it was cut: a listing's cell."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _values(data: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], str]]:
    """(key path, value) of every scalar, depth first, at most three levels down."""
    if isinstance(data, dict):
        if len(path) < 3:
            for key, value in data.items():
                yield from _values(value, (*path, str(key)))
    elif isinstance(data, list):
        if len(path) < 3:
            for value in data[:20]:
                yield from _values(value, path)
    elif data is not None and not isinstance(data, bool):
        yield path, str(data)


def _fields(
    content_type: str | None, head: bytes, complete: bool
) -> list[tuple[tuple[str, ...], str]]:
    parsed = parse_json(head) if complete else None
    if parsed is None and media_type(content_type) == "application/x-www-form-urlencoded":
        if not complete:  # the last field may be cut short: left out
            head = head.rsplit(b"&", 1)[0]
        parsed = parse_form(content_type, head)
    if parsed is None:
        return []
    found = []
    for item in _values(parsed):
        found.append(item)
        if len(found) >= MAX_VALUES:
            break
    return found


def _key(path: tuple[str, ...]) -> str:
    """A field's name as ROLES read it. A money object's `value` (YooKassa's
    `"amount": {"value": "2.00", "currency": "RUB"}`, Adyen's) goes by the
    object's name: "value" alone says nothing of its role."""
    if not path:
        return ""
    key = _NOT_ALNUM.sub("", path[-1].lower())
    if key == "value" and len(path) > 1:
        return _NOT_ALNUM.sub("", path[-2].lower())
    return key


def who(fields: list[tuple[tuple[str, ...], str]]) -> list[tuple[str, str]]:
    """The roles found, in ROLES' order, each from the first field that fills it."""
    named = [(_key(path), path, v) for path, v in fields]
    result = []
    for role, names in ROLES:
        for key, path, value in named:
            if key in names and value.strip():
                if key == "firstname":  # "first_name" and its "last_name" beside it
                    last = next(
                        (v for k, p, v in named if k == "lastname" and p[:-1] == path[:-1]), ""
                    )
                    value = f"{value} {last}".strip()
                elif path[-1].lower() == "value":  # a money object: its currency beside
                    currency = next((v for _, p, v in named if p == (*path[:-1], "currency")), "")
                    value = f"{value} {currency}".strip()
                result.append((role, value))
                break
    return result


def snippet(fields: list[tuple[tuple[str, ...], str]], search: TextSearch) -> str | None:
    """The words around the first match of `search` in the decoded values."""
    for _, value in fields:
        text = " ".join(value.split())
        if search.digits is not None:
            digits = re.sub(r"\D", "", text)
            if any(canonical_digits(search.digits) in form for form in phone_forms(digits)):
                return shortened(text, 2 * SNIPPET_CHARS)
            continue
        folded = fold(text)
        if len(folded) != len(text):
            continue  # a fold that changed lengths: positions would not match
        for word in search.words:
            at = folded.find(word)
            if at >= 0:
                start, end = max(0, at - SNIPPET_CHARS), at + len(word) + SNIPPET_CHARS
                return ("…" if start else "") + text[start:end] + ("…" if end < len(text) else "")
    return None


def glance(
    content_type: str | None,
    head: bytes,
    size: int,
    query: str,
    masker: Masker,
    search: TextSearch | None = None,
) -> dict[str, Any]:
    """`who` (role, value) pairs and a search `snippet`, masked and cut short.

    `head` is the body's first bytes, `size` the whole body's length."""
    complete = len(head) >= size
    own = request_masker(masker, query, content_type, head)
    fields = [(path, own.text(value)) for path, value in _fields(content_type, head, complete)]
    return {
        "who": [[role, shortened(value)] for role, value in who(fields)],
        "snippet": snippet(fields, search) if search is not None else None,
    }


async def glances(
    store: Queries, events: Sequence[EventView], masker: Masker, search: TextSearch | None
) -> dict[int, dict[str, Any]]:
    """Each listed event's glance, by id: the bodies' heads in one read, parsed
    off the event loop (a page of 500 is a few MiB of JSON and forms)."""
    heads = await store.body_heads([event.id for event in events], HEAD_BYTES)

    def work() -> dict[int, dict[str, Any]]:
        return {
            event_id: glance(h.content_type, h.head, h.size, h.query, masker, search)
            for event_id, h in heads.items()
        }

    return await asyncio.to_thread(work)


def with_glance(view: dict[str, Any], found: dict[str, Any] | None) -> dict[str, Any]:
    """An event's summary with `who` and `snippet` (empty when its body is gone)."""
    view["who"] = found["who"] if found else []
    view["snippet"] = found["snippet"] if found else None
    return view


def who_text(view: dict[str, Any]) -> str:
    """ "Анна Петрова, +7 (999) 000-00-01, anna@example.com": the values alone."""
    return ", ".join(value for _, value in view.get("who", ()))
