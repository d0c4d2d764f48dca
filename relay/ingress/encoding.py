"""Request bodies sent with Content-Encoding: inflated in full, within a bound.

aiohttp inflates request bodies on its own, while relay read Content-Length
bytes of the inflated stream: a gzipped body was stored cut to the length of
its compressed form and acknowledged. Ingress now turns aiohttp's inflation
off and inflates here, so that

- what is stored (and verified, and templated) is the whole payload the sender
  compressed, never a prefix of it;
- the route's max_body_size bounds the inflated size: inflation stops one byte
  past it (a 1 MiB "bomb" inflating to 1 GiB costs ~1 MiB of work, then 413);
- a coding relay cannot inflate is refused with 415 before the body is read
  (RFC 7694 section 3), never stored compressed as if it were the payload.

The headers are stored as received: `Content-Encoding: gzip` beside the body
says it came compressed; the body itself is the decoded payload.
"""

from __future__ import annotations

import zlib

SUPPORTED = ("gzip", "x-gzip", "deflate")
ACCEPT_ENCODING = "gzip, deflate"


class BodyTooLarge(Exception):
    """The inflated body exceeds the limit."""


class BadEncoding(Exception):
    """The body is not valid data in its declared coding (corrupt or truncated)."""


def coding_of(header: str | None) -> str | None:
    """The one content coding to undo, "" for none; None when relay cannot undo it
    (an unknown coding, or several stacked)."""
    if not header:
        return ""
    codings = [part.strip().lower() for part in (header or "").split(",") if part.strip()]
    codings = [coding for coding in codings if coding != "identity"]
    if not codings:
        return ""
    if len(codings) == 1 and codings[0] in SUPPORTED:
        return codings[0]
    return None


def inflate(coding: str, body: bytes, limit: int) -> bytes:
    """`body` decoded from `coding` (one of SUPPORTED), at most `limit` bytes."""
    if coding == "deflate":
        # RFC 9110 says zlib format; some senders send raw deflate (aiohttp's fallback too).
        try:
            return _inflate(body, zlib.MAX_WBITS, limit)
        except BadEncoding:
            return _inflate(body, -zlib.MAX_WBITS, limit)
    return _inflate(body, 16 + zlib.MAX_WBITS, limit)


def _inflate(data: bytes, wbits: int, limit: int) -> bytes:
    pieces: list[bytes] = []
    size = 0
    while True:  # once per gzip member: a stream may hold several
        decompressor = zlib.decompressobj(wbits)
        try:
            piece = decompressor.decompress(data, limit + 1 - size)
        except zlib.error as error:
            raise BadEncoding(str(error)) from None
        size += len(piece)
        if size > limit:
            raise BodyTooLarge
        pieces.append(piece)
        if not decompressor.eof:
            if decompressor.unconsumed_tail:
                raise BodyTooLarge  # stopped at the limit with input left
            raise BadEncoding("compressed body is truncated")
        data = decompressor.unused_data
        if wbits <= 0 or not data.strip(b"\x00"):
            return b"".join(pieces)
