"""multipart/form-data fields: what real clients send, and hard limits on what attackers send."""

from __future__ import annotations

import time

import aiohttp
from multidict import CIMultiDict

from relay.core.multipart import MAX_PARAMETERS, MAX_PARTS, parse_multipart


async def _aiohttp_form(form: aiohttp.FormData) -> tuple[str, bytes]:
    """The exact bytes aiohttp's client sends for `form` (a real sender's encoder)."""
    payload = form()

    class Collect:
        def __init__(self) -> None:
            self.chunks: list[bytes] = []

        async def write(self, chunk: bytes) -> None:
            self.chunks.append(bytes(chunk))

    sink = Collect()
    await payload.write(sink)  # type: ignore[arg-type]
    return CIMultiDict(payload.headers)["Content-Type"], b"".join(sink.chunks)


async def test_fields_of_a_form_encoded_by_aiohttp_client() -> None:
    form = aiohttp.FormData()
    form.add_field("name", "Анна")
    form.add_field("phone", "+7 900 000-00-00")
    form.add_field("name", "second value is ignored")
    form.add_field("file", b"\x00binary", filename="cv.pdf", content_type="application/pdf")
    content_type, body = await _aiohttp_form(form)
    assert parse_multipart(content_type, body) == {"name": "Анна", "phone": "+7 900 000-00-00"}


def test_rfc_7578_example_with_quoted_printable() -> None:
    # RFC 7578 section 4.5 (a field with a charset and quoted-printable encoding).
    body = (
        b"--AaB03x\r\n"
        b'content-disposition: form-data; name="field1"\r\n'
        b"content-type: text/plain;charset=UTF-8\r\n"
        b"content-transfer-encoding: quoted-printable\r\n\r\n"
        b"Joe owes =E2=82=AC100.\r\n"
        b"--AaB03x--\r\n"
    )
    assert parse_multipart("multipart/form-data; boundary=AaB03x", body) == {
        "field1": "Joe owes €100."
    }


def test_rfc_2231_names_preamble_and_quoted_boundary() -> None:
    body = (
        b"preamble\r\n--b 1\r\n"
        b"Content-Disposition: form-data; name*=utf-8''%D0%98%D0%BC%D1%8F\r\n\r\n"
        b"v1\r\n--b 1\r\n"
        b'Content-Disposition: form-data; name*0="lo"; name*1="ng"\r\n\r\n'
        b"v2\r\n--b 1--\r\nepilogue"
    )
    assert parse_multipart('multipart/form-data; boundary="b 1"', body) == {
        "Имя": "v1",
        "long": "v2",
    }


def test_malformed_bodies_have_no_fields() -> None:
    good = b'--B\r\nContent-Disposition: form-data; name="a"\r\n\r\nx\r\n--B--\r\n'
    assert parse_multipart("multipart/form-data; boundary=B", good) == {"a": "x"}
    assert parse_multipart("multipart/form-data", good) is None  # no boundary
    assert parse_multipart("multipart/form-data; boundary=B", good[:-9]) is None  # truncated
    assert parse_multipart("multipart/form-data; boundary=C", good) is None


def test_limits_on_parts_and_parameters() -> None:
    part = b'--B\r\nContent-Disposition: form-data; name="f"\r\n\r\nx\r\n'
    at_limit = part * MAX_PARTS + b"--B--"
    assert parse_multipart("multipart/form-data; boundary=B", at_limit) == {"f": "x"}
    assert parse_multipart("multipart/form-data; boundary=B", part + at_limit) is None
    params = b"".join(b'; p%d="x"' % i for i in range(MAX_PARAMETERS + 1))
    many = b'--B\r\nContent-Disposition: form-data; name="f"' + params + b"\r\n\r\nx\r\n--B--"
    assert parse_multipart("multipart/form-data; boundary=B", many) is None


def test_hostile_megabyte_parses_in_milliseconds() -> None:
    # email.parser took 2.6 s (tiny parts) and 17.9 s (continuations) on these.
    part = b'--B\r\nContent-Disposition: form-data; name="f"\r\n\r\nx\r\n'
    tiny_parts = part * (1024 * 1024 // len(part))
    continuations = b'--B\r\nContent-Disposition: form-data; name="f"' + b"".join(
        b'; name*%d="xxxxx"' % i for i in range(50_000)
    )
    for body in (tiny_parts, continuations):
        started = time.perf_counter()
        parse_multipart("multipart/form-data; boundary=B", body + b"\r\n\r\nx\r\n--B--")
        # Milliseconds when the machine is quiet; the bound leaves room for a busy CI.
        assert time.perf_counter() - started < 0.5


def test_a_part_is_decoded_only_by_a_plain_text_charset() -> None:
    # A sender names the charset: `punycode` is pure Python and quadratic (a
    # 400 KiB part took 7 s of CPU on the event loop). Declared charsets that
    # are not plain text encodings are read as UTF-8.
    def part(charset: str, content: bytes) -> bytes:
        return (
            b'--B\r\nContent-Disposition: form-data; name="f"\r\nContent-Type: text/plain; '
            + f"charset={charset}".encode()
            + b"\r\n\r\n"
            + content
            + b"\r\n--B--\r\n"
        )

    kind = "multipart/form-data; boundary=B"
    assert parse_multipart(kind, part("windows-1251", "Иван".encode("cp1251"))) == {"f": "Иван"}
    assert parse_multipart(kind, part("punycode", b"-" + b"ba" * 20)) == {"f": "-" + "ba" * 20}
    for name in ("idna", "unicode_escape", "rot13", "base64"):
        assert parse_multipart(kind, part(name, b"\\x41")) == {"f": "\\x41"}
    hostile = part("punycode", b"-" + b"ba" * 200_000)
    started = time.process_time()
    parse_multipart(kind, hostile)
    assert time.process_time() - started < 0.5
