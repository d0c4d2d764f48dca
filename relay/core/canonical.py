"""What a payload says, as a short digest: equal for re-sends, different for different content.

A key only names an event; the digest says whether two events with one key
carry the same notification. Formatting is not content, so the digest is
taken over a canonical form:

- a JSON body (whatever its Content-Type says): the parsed value with object
  keys sorted, so whitespace, key order and escapes do not count;
- a urlencoded form: its fields in order, every value, percent-decoding
  undone (`a+b` and `a%20b` are one value), read exactly (relay.core.exact):
  a cp1251 form's `status=оплачен` and `status=отменен` stay two payloads
  (a form of more fields than any sender's is compared as raw bytes);
- anything else (multipart, XML, text, broken JSON): the raw bytes. A
  multipart body is not parsed here: its boundary changes from one send to
  the next, so a re-send may look different (stored, flagged), but two
  different uploads can never look the same.

The kind of form is part of the digest, so a JSON body and raw bytes that
happen to print alike never compare equal.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

from relay.core.exact import exact_bytes, exact_fields
from relay.core.payload import MAX_FORM_FIELDS

DIGEST_SIZE = 16  # bytes: 128 bits, a collision is not a practical concern
_FORM = "application/x-www-form-urlencoded"


def payload_digest(body: bytes, content_type: str | None, parsed_json: Any = None) -> bytes:
    """The digest of `body`'s canonical form; `parsed_json` saves a second parse
    when the caller already holds the body's JSON value (None: parse here)."""
    canonical = canonical_form(body, content_type, parsed_json)
    return hashlib.blake2b(canonical, digest_size=DIGEST_SIZE).digest()


def canonical_form(body: bytes, content_type: str | None, parsed_json: Any = None) -> bytes:
    value = parsed_json if parsed_json is not None else _json(body)
    if value is not None:
        try:
            return b"json\0" + orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
        except TypeError:  # an integer past 64 bits: orjson keeps it, cannot dump it
            pass
    if (content_type or "").split(";", 1)[0].strip().lower() == _FORM:
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            return b"raw\0" + body
        try:
            fields = exact_fields(text, MAX_FORM_FIELDS)
        except ValueError:  # no sender's form has so many: its bytes, read in one pass
            return b"raw\0" + body
        try:
            return b"form\0" + orjson.dumps(fields)
        except orjson.JSONEncodeError:  # a value is not UTF-8 once percent-decoded
            return b"form-bytes\0" + b"".join(
                _sized(exact_bytes(part)) for f in fields for part in f
            )
    return b"raw\0" + body


def _sized(part: bytes) -> bytes:
    return len(part).to_bytes(8, "big") + part


def _json(body: bytes) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
