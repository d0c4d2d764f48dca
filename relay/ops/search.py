"""Search by content: what an event says, as text a trigram index can find.

Two halves that must agree, both pure:

- `document()` turns a stored event (headers, query, body) into the text
  indexed for it: the *values* a person would search for — JSON strings and
  numbers, form and multipart fields, query parameters, header values —
  folded to one case, plus every run of digits with its punctuation removed.
- `parse_search()` turns what a person typed into the same form.

Case folding happens here, in Python (`str.casefold`), not in SQLite: SQLite's
`lower()` and `LIKE` fold ASCII only, so "ИВАН" would never find "Иван".
"ё" is written "е" as often as not, so both sides fold it to "е".

Phone numbers are written many ways: `+7 (999) 123-45-67`, `8 999 123 45 67`,
`89991234567`. Each run of digits (with the spaces, dashes, dots and brackets
people put inside numbers) is also indexed as digits alone. The Russian trunk
prefix: an 11-digit number starting with 8 is the same subscriber as the one
starting with 7 (8 is the domestic prefix, +7 the country code), and a 10-digit
number starting with 9 is a mobile number written without either. Both are
indexed with a leading 7 as well, and a query of digits is rewritten the same
way, so any of the three spellings finds the others. An 8 is never invented
from a 7: the 7 form is the one canonical spelling both sides meet on.
"""

from __future__ import annotations

import logging
import re
import unicodedata
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from relay.core.exact import as_text, exact_text
from relay.core.payload import declared_charset, media_type, parse_form, parse_json, parse_query
from relay.core.secrets import (
    Masker,
    inbound_secrets,
    is_sensitive_header,
    sensitive_name,
    shown_body,
)
from relay.store import IndexSource, SearchDocument, TextSearch

log = logging.getLogger("relay.search")

# The trigram index matches substrings of three characters or more.
MIN_TERM = 3
# Indexed text per event, at most: a huge body costs bounded work and space,
# and what people search for (a phone, an e-mail, a name) is near the start.
MAX_TEXT_CHARS = 32 * 1024
# Bytes of body decoded per event, at most (a multipart upload of megabytes
# is not parsed to find a phone number in its first field).
MAX_BODY_BYTES = 64 * 1024
# JSON values visited per event, at most: a body of a million tiny values
# stops here instead of holding the indexer's thread.
MAX_VALUES = 5_000

_DIGIT_RUN = re.compile(r"\d(?:[\d\u00a0 ().\-]*\d)?")
_NOT_DIGIT = re.compile(r"\D")
_PHONE_QUERY = re.compile(r"^\+?[\d\u00a0 ().\-]+$")
_SPACES = re.compile(r"\s+")


class SearchError(ValueError):
    """A query that cannot be searched (too short); the message says why."""


def fold(text: str) -> str:
    """One spelling for every case and compatibility form: NFKC, casefold, ё→е."""
    return unicodedata.normalize("NFKC", text).casefold().replace("ё", "е")


def phone_forms(digits: str) -> list[str]:
    """The digits, plus their 7-prefixed spelling when they look like a Russian number."""
    forms = [digits]
    if len(digits) == 11 and digits[0] == "8":
        forms.append("7" + digits[1:])
    elif len(digits) == 10 and digits[0] == "9":
        forms.append("7" + digits)
    return forms


def canonical_digits(digits: str) -> str:
    """A query's digits in the one spelling the index holds for every form."""
    if len(digits) == 11 and digits[0] == "8":
        return "7" + digits[1:]
    return digits


# What one search may ask for: a name, a phone, an e-mail or an order id is
# far shorter; each term costs a pass over the index, and a long one costs
# more per pass (a 7,000-digit search held a reader for 17-26 s).
MAX_SEARCH_CHARS = 200
MAX_SEARCH_WORDS = 8
MAX_SEARCH_DIGITS = 32


def refuse_controls(text: str) -> None:
    """A search box's text holds no control character (no event's text does,
    as indexed; PostgreSQL cannot even take a NUL as text): SearchError."""
    control = next((c for c in text if not c.isprintable() and not c.isspace()), None)
    if control is not None:
        raise SearchError(f"search text holds the control character U+{ord(control):04X}")


def parse_search(text: str) -> TextSearch:
    """What to look for. Raises SearchError when nothing searchable is left,
    or when it asks for more than one search may."""
    refuse_controls(text)
    stripped = text.strip()
    if len(stripped) > MAX_SEARCH_CHARS:
        raise SearchError(
            f"search text of {len(stripped)} characters: at most {MAX_SEARCH_CHARS}"
            " (a name, a phone, an e-mail or an id is shorter)"
        )
    if _PHONE_QUERY.match(stripped):
        digits = _NOT_DIGIT.sub("", stripped)
        if len(digits) > MAX_SEARCH_DIGITS:
            raise SearchError(
                f"a number of {len(digits)} digits: at most {MAX_SEARCH_DIGITS} are searched"
            )
        if len(digits) >= MIN_TERM:
            return TextSearch(digits=canonical_digits(digits))
    words = tuple(dict.fromkeys(word for word in fold(stripped).split() if len(word) >= MIN_TERM))
    if len(words) > MAX_SEARCH_WORDS:
        raise SearchError(f"{len(words)} words: at most {MAX_SEARCH_WORDS} are searched at once")
    if not words:
        raise SearchError(
            f"search text needs a word of at least {MIN_TERM} characters"
            " (shorter ones would match nearly everything)"
        )
    return TextSearch(words=words)


def document(
    event_id: int,
    *,
    headers: Sequence[tuple[str, str]],
    query: str,
    content_type: str | None,
    body: bytes,
    masker: Masker,
) -> SearchDocument:
    """The indexed text of one event; bounded work whatever the body holds.

    Read exactly (relay.core.exact): bytes that are not UTF-8 are not folded
    into U+FFFD, so two orders stay two texts; each such value is indexed in
    the charset the request declares, or with those bytes written `\\xNN`.

    Credentials never enter the index: sensitive headers and fields named like
    credentials are left out, and configured secrets and the request's own
    credential values (wherever else they show) are masked, so a search for a
    token finds nothing.
    """
    inbound = inbound_secrets(query, content_type, body[:MAX_BODY_BYTES])
    if inbound:  # the request's own credentials (an api_key field, a ?token=)
        masker = masker.merged(Masker(inbound))
    values: list[str] = [
        as_text(value) for name, value in headers if value and not is_sensitive_header(name)
    ]
    values += map(as_text, _field_values(parse_query(query, exact=True).items()))
    charset = declared_charset(content_type)
    values += (
        as_text(value, charset) for value in body_values(content_type, body[:MAX_BODY_BYTES])
    )
    # One value per line: a run of digits never joins two values ("8999…67" and a
    # quantity "100" beside it are two numbers, not one).
    joined = masker.text("\n".join(values))[:MAX_TEXT_CHARS]
    digits: dict[str, None] = {}
    for match in _DIGIT_RUN.finditer(joined):
        run = _NOT_DIGIT.sub("", match.group())
        if len(run) >= MIN_TERM:
            digits.update(dict.fromkeys(phone_forms(run)))
    return SearchDocument(event_id, fold(_SPACES.sub(" ", joined).strip()), " ".join(digits))


def body_values(content_type: str | None, body: bytes) -> list[str]:
    """The values a body carries, read exactly: decoded JSON, form or multipart
    fields (not those named like credentials), else its text."""
    kind = media_type(content_type)
    if kind == "application/json" or kind.endswith("+json") or body.lstrip()[:1] in (b"{", b"["):
        parsed = parse_json(body)
        if parsed is not None:
            return list(_json_values(parsed))
        # Cut to MAX_BODY_BYTES, or broken: its text, its credentials masked by
        # name as far as it reads like JSON (a search must find no password).
        return [shown_body(exact_text(body), content_type, Masker())]
    form = parse_form(content_type, body, exact=True)
    if form is not None:
        return _field_values(form.items())
    return [exact_text(body)]


def _field_values(fields: Iterable[tuple[str, str]]) -> list[str]:
    return [value for name, value in fields if value and not sensitive_name(name)]


def _json_values(value: Any) -> Iterator[str]:
    """Scalar values of a JSON document, depth-first, at most MAX_VALUES of
    them; nothing under a key named like a credential."""
    stack: list[Any] = [value]
    seen = 0
    while stack and seen < MAX_VALUES:
        item = stack.pop()
        seen += 1
        if isinstance(item, dict):
            stack.extend(reversed([v for k, v in item.items() if not sensitive_name(str(k))]))
        elif isinstance(item, list):
            stack.extend(reversed(item))
        elif isinstance(item, str):
            if item:
                yield item
        elif isinstance(item, bool) or item is None:
            continue
        else:
            yield str(item)


def documents(events: Iterable[IndexSource], masker: Masker) -> list[SearchDocument]:
    found = []
    for event in events:
        try:
            found.append(
                document(
                    event.event_id,
                    headers=event.headers,
                    query=event.query,
                    content_type=event.content_type,
                    body=event.body,
                    masker=masker,
                )
            )
        except Exception:  # one body relay cannot read must not stop the indexer
            log.exception("event %d: cannot make its search text; indexed empty", event.event_id)
            found.append(SearchDocument(event.event_id, "", ""))
    return found


def searched_for(search: TextSearch) -> str:
    """The query as it was searched, for "searched for ..." lines."""
    if search.digits is not None:
        return f"the number {search.digits}"
    return " and ".join(f"“{word}”" for word in search.words)
