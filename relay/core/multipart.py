"""multipart/form-data fields in one linear pass, with hard limits.

`email.parser` (what relay used before) is super-linear on RFC 2231
continuation parameters and on many tiny parts: a 263 KiB body held the event
loop for 5.5 s. This parser only ever moves forward through the body with
`bytes.find`, parses at most MAX_PARTS parts, MAX_HEADER_BYTES of headers per
part and MAX_PARAMETERS parameters per header, so its cost is linear in the
body (itself bounded by the route's max_body_size): a 1 MiB body of hostile
parts parses in milliseconds.

A body beyond a limit, or not shaped like multipart, gives None (no fields),
never an exception: the caller treats it like any other unparseable body.
"""

from __future__ import annotations

import binascii
import codecs
import re
from urllib.parse import unquote_to_bytes

MAX_PARTS = 1000
MAX_HEADER_BYTES = 8 * 1024  # one part's header block
MAX_HEADERS = 16  # header lines in one part
MAX_PARAMETERS = 32  # parameters in one header value
MAX_BOUNDARY = 70  # RFC 2046 section 5.1.1

# name=value or name="quoted value"; one step per parameter, never backtracking
# over more than that parameter.
_PARAMETER = re.compile(rb';\s*([^\s=;]+)\s*=\s*("(?:[^"\\]|\\.)*"|[^;]*)', re.S)


class _Malformed(Exception):
    pass


def parse_multipart(
    content_type: str, body: bytes, errors: str = "replace"
) -> dict[str, str] | None:
    """Fields of a multipart/form-data body (first value of a repeated name;
    uploaded files are not fields), or None when it is malformed or too big.
    Bytes that are not text in the part's charset are decoded with `errors`."""
    try:
        boundary = _parameters(content_type.encode("latin-1", "replace")).get(b"boundary")
        if not boundary or len(boundary) > MAX_BOUNDARY:
            return None
        return _fields(body, boundary, errors)
    except _Malformed:
        return None


def _fields(body: bytes, boundary: bytes, errors: str) -> dict[str, str]:
    delimiter = b"\r\n--" + boundary
    # The first delimiter may open the body (no preamble, no CRLF before it).
    start = 0 if body.startswith(delimiter[2:]) else body.find(delimiter)
    if start < 0:
        raise _Malformed
    position = start + (len(delimiter) - 2 if start == 0 else len(delimiter))
    fields: dict[str, str] = {}
    for _ in range(MAX_PARTS + 1):
        if body.startswith(b"--", position):
            return fields  # the close delimiter; the epilogue is ignored
        line_end = body.find(b"\n", position, position + 1024)
        if line_end < 0 or body[position:line_end].strip(b" \t\r"):
            raise _Malformed  # a delimiter must end its line (padding allowed)
        head_start = line_end + 1
        if body.startswith(b"\r\n", head_start):
            head_end, content_start = head_start, head_start + 2  # no headers at all
        else:
            head_end = body.find(b"\r\n\r\n", head_start, head_start + MAX_HEADER_BYTES)
            if head_end < 0:
                raise _Malformed
            content_start = head_end + 4
        end = body.find(delimiter, content_start)
        if end < 0:
            raise _Malformed  # no close delimiter: truncated
        _add_field(fields, body[head_start:head_end], body[content_start:end], errors)
        position = end + len(delimiter)
    raise _Malformed  # more than MAX_PARTS parts


def _add_field(fields: dict[str, str], head: bytes, content: bytes, errors: str) -> None:
    headers = _headers(head)
    disposition = _parameters(headers.get(b"content-disposition", b""))
    if b"filename" in disposition or b"filename*" in disposition:
        return  # an uploaded file, not a field
    name = disposition.get(b"name")
    if name is None:
        return
    field_name = name.decode("utf-8", errors)
    if field_name in fields:
        return
    encoding = headers.get(b"content-transfer-encoding", b"").strip().lower()
    try:
        if encoding == b"base64":
            content = binascii.a2b_base64(content)
        elif encoding == b"quoted-printable":
            content = binascii.a2b_qp(content)
    except binascii.Error:
        pass  # keep the bytes as sent
    charset = _parameters(headers.get(b"content-type", b"")).get(b"charset", b"utf-8")
    fields[field_name] = content.decode(_codec(charset), errors)


def _headers(head: bytes) -> dict[bytes, bytes]:
    headers: dict[bytes, bytes] = {}
    lines = head.split(b"\r\n", MAX_HEADERS)
    if len(lines) > MAX_HEADERS:
        raise _Malformed
    for line in lines:
        name, colon, value = line.partition(b":")
        if colon:
            headers.setdefault(name.strip().lower(), value.strip())
    return headers


def _parameters(value: bytes) -> dict[bytes, bytes]:
    """A header value's parameters by lower-cased name (first one wins).

    RFC 2231 extended values (`name*=utf-8''%D0%98`) and continuations
    (`name*0=…; name*1=…`) are decoded; at most MAX_PARAMETERS are read.
    """
    _, _, rest = value.partition(b";")
    plain: dict[bytes, bytes] = {}
    pieces: dict[bytes, dict[int, tuple[bool, bytes]]] = {}
    for count, match in enumerate(_PARAMETER.finditer(b";" + rest)):
        if count >= MAX_PARAMETERS:
            raise _Malformed
        name, raw = match.group(1).lower(), match.group(2).strip()
        if raw.startswith(b'"') and raw.endswith(b'"') and len(raw) >= 2:
            raw = re.sub(rb"\\(.)", rb"\1", raw[1:-1])
        base, star, index = name.partition(b"*")
        if not star:
            plain.setdefault(name, raw)
            continue
        # name*=ext, name*0=…, name*1*=ext…: the trailing star marks percent-encoding
        encoded = name.endswith(b"*")
        number = index.rstrip(b"*")
        order = int(number) if number.isdigit() and len(number) < 4 else 0
        pieces.setdefault(base, {}).setdefault(order, (encoded, raw))
    for base, parts in pieces.items():
        if base not in plain:
            plain[base] = _rfc2231([parts[i] for i in sorted(parts)])
    return plain


def _rfc2231(parts: list[tuple[bool, bytes]]) -> bytes:
    charset = b"utf-8"
    decoded = bytearray()
    for number, (encoded, raw) in enumerate(parts):
        if encoded and number == 0:
            charset, _, rest = raw.partition(b"'")
            _, _, raw = rest.partition(b"'")  # skip the language
        decoded += unquote_to_bytes(raw) if encoded else raw
    return bytes(decoded).decode(_codec(charset or b"utf-8"), "replace").encode()


def _codec(charset: bytes) -> str:
    return text_codec(charset.decode("ascii", "replace")) or "utf-8"


# Codecs whose decoding is linear C code: the Unicode forms, ASCII and the
# code pages, ISO 8859, KOI8 and Mac families (and the CJK ones). A sender
# names the charset: `punycode` and `idna` are pure Python and quadratic (a
# 400 KiB part held the event loop for 7 s), the escape codecs read their
# input as code, and the rest are not text.
_TEXT_CODEC_PREFIXES = ("utf-", "cp", "iso8859-", "koi8-", "mac-", "latin-", "euc", "shift", "gb")
_TEXT_CODECS = frozenset({"ascii", "big5", "hz", "johab", "tis-620", "kz1048", "ptcp154"})


def text_codec(charset: str) -> str | None:
    """Python's name for a declared charset (`"windows-1251"` -> `cp1251`), or
    None when Python does not know it or it is not a plain text encoding."""
    try:
        name = codecs.lookup(charset.strip().strip('"')).name
    except (LookupError, ValueError):
        return None
    return name if name in _TEXT_CODECS or name.startswith(_TEXT_CODEC_PREFIXES) else None
