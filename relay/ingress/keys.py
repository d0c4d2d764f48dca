"""Idempotency keys as stored: as distinct as the bytes they came from.

aiohttp hands header bytes that are not UTF-8 over as lone surrogates (a
cp1251 sender's `Idempotency-Key: заказ-1`). Replacing each with U+FFFD
would make `заказ-1` and `товар-1` one key, and the second order a
"duplicate". Instead such a key is stored with each byte that is not UTF-8
written `\\xNN` and each backslash doubled, which reads back to the exact
bytes. A key that is valid UTF-8 is stored as it is.
"""

from __future__ import annotations


def stored_key(key: str) -> str:
    if key.isascii():
        return key
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        pass
    else:
        return key
    escaped = key.replace("\\", "\\\\")
    try:
        raw = escaped.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate not from a byte (a JSON "\ud800")
        raw = escaped.encode("utf-8", "surrogatepass")
    return raw.decode("utf-8", "backslashreplace")


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
