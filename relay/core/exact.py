"""The exact reading of untrusted bytes: the one every decision of identity uses.

What decides that two webhooks are one (the idempotency key, the comparison
of payloads under one key), which line an ordered delivery joins (`order_by`)
and what the search index holds all read a sender's bytes here, and only
here: as UTF-8, each byte that is not UTF-8 kept as a lone surrogate
(`surrogateescape`), never folded into U+FFFD. Folding would make a cp1251
site's `заказ-1` and `товар-1` one key, one payload and one line, and the
second order a "duplicate" or a hostage of the first.

Text that people or a CRM read is another reading (relay.core.payload:
decoded by the declared charset, U+FFFD for what cannot be decoded).

Stored, a key keeps its bytes: one that is not UTF-8 is written with each
byte that is not UTF-8 as `\\xNN` and each backslash doubled, which reads back
to the exact bytes (`key_bytes`). A key that is valid UTF-8 is stored as it is.
"""

from __future__ import annotations

from urllib.parse import parse_qsl


def exact_text(raw: bytes) -> str:
    """`raw` as text with every byte kept: what is not UTF-8 becomes a lone surrogate."""
    return raw.decode("utf-8", "surrogateescape")


def exact_fields(urlencoded: str, max_fields: int | None = None) -> list[tuple[str, str]]:
    """A query string's or urlencoded body's fields in order, percent-decoding
    undone with every byte kept (see `exact_text`). Raises ValueError past
    `max_fields`."""
    return parse_qsl(
        urlencoded, keep_blank_values=True, errors="surrogateescape", max_num_fields=max_fields
    )


def exact_bytes(text: str) -> bytes:
    """The bytes an exact reading came from (a surrogate that was not a byte,
    as a JSON "\\ud800" makes, is written as UTF-8 would write it)."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")


def as_text(text: str, charset: str | None = None) -> str:
    """An exact reading as text that can be stored and shown: the bytes that
    were not UTF-8 decoded by `charset` when it decodes them all, else each
    written `\\xNN` (two such readings stay two texts either way)."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raw = exact_bytes(text)
        if charset is not None:
            try:
                return raw.decode(charset)
            except UnicodeDecodeError:
                pass
        return raw.decode("utf-8", "backslashreplace")
    return text


def stored_key(key: str) -> str:
    """A key (or an ordering key) as stored: as it is when it is valid UTF-8."""
    if key.isascii():
        return key
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        pass
    else:
        return key
    return exact_bytes(key.replace("\\", "\\\\")).decode("utf-8", "backslashreplace")


def key_bytes(stored: str) -> bytes:
    """The bytes of a key written by `stored_key` (for one that needed escaping)."""
    out = bytearray()
    index = 0
    while index < len(stored):
        char = stored[index]
        if char == "\\" and stored[index + 1 : index + 2] == "\\":
            out += b"\\"
            index += 2
        elif char == "\\" and stored[index + 1 : index + 2] == "x":
            out.append(int(stored[index + 2 : index + 4], 16))
            index += 4
        else:
            out += char.encode("utf-8")
            index += 1
    return bytes(out)
