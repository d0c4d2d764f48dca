"""Masking: configured secret values never leave relay in logs, errors or answers."""

from __future__ import annotations

import base64
import functools
import json
import re
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, quote, quote_plus, unquote, unquote_plus, urlsplit

import orjson

from relay.core.payload import media_type, parse_form, parse_json

MASK = "***"

# HTTP's own headers whose values are credentials, whatever the config says.
# Each sender's (Telegram's secret token, WooCommerce's signature...) are
# declared by its source kind (SourceKind.secret_headers); any name with
# "token", "signature", "api-key"... in it is one too (sensitive_name).
SENSITIVE_HEADERS = frozenset(
    {"authorization", "proxy-authorization", "cookie", "set-cookie", "x-api-key"}
)

# Parts of a header or field name that make its value a credential.
_SENSITIVE_PARTS = ("token", "secret", "password", "passwd", "signature", "api_key", "apikey")
# The same, found in one pass (a name's "-" read as "_").
_SENSITIVE = re.compile("|".join(_SENSITIVE_PARTS))
# In a text that holds none of them (read in lower case), and no JSON escape
# that could spell one, no field can be named like a credential: most bodies.
_MAYBE_SENSITIVE = re.compile("|".join((*_SENSITIVE_PARTS, "api-key", "\\\\")))

# user:password@ in a URL, whatever the config says. Linear on any text: a
# scheme is tried only where a run of word characters starts (the lookbehind),
# and possessive repeats never give back what they took, so each character is
# read by at most one scheme and one authority ("@a…a://b…b" was quadratic).
_URL_CREDENTIALS = re.compile(r"(?<!\w)(\w++://)[^/\s:@]++(?::[^/\s@]*+)?+@")

# Shorter values would mask innocent text ("1", "yes") everywhere.
_MIN_SECRET_LENGTH = 4


@functools.lru_cache(maxsize=4096)
def sensitive_name(name: str) -> bool:
    """Whether a header, query or body field of this name carries a credential
    (Tilda's api_key, a ?token=, T-Bank's Token, a signature header...).
    Asked for every field of every body shown or kept: names repeat, so the
    answers are kept (a bounded number of them)."""
    return _has_sensitive_part(name.lower())


def _has_sensitive_part(lowered: str) -> bool:
    return _SENSITIVE.search(lowered.replace("-", "_")) is not None


def _may_name_a_credential(text: str) -> bool:
    return _MAYBE_SENSITIVE.search(text.lower()) is not None


# The headers each known sender puts a credential in (lower case), as the
# source kinds declare them (SourceKind.secret_headers): the registry, which
# sits above this module, says so when it loads and when a source registers.
_source_headers: frozenset[str] = frozenset()


def declare_secret_headers(headers: frozenset[str]) -> None:
    global _source_headers
    _source_headers = headers


def is_sensitive_header(name: str) -> bool:
    """A header whose value is a credential: masked in views, never indexed.
    (Asked for every header of every request indexed: one lower(), set lookups.)"""
    lowered = name.lower()
    return (
        lowered in SENSITIVE_HEADERS or lowered in _source_headers or _has_sensitive_part(lowered)
    )


# Credential values found by field name that are also masked wherever else
# they show (the query, headers, a rendered preview). A body may name any
# number of fields "token…": past this many, a field is masked by its name
# alone, so the work a view does stays linear in the body, whatever it holds.
MAX_VALUE_SECRETS = 16


def inbound_secrets(query: str, content_type: str | None, body: bytes) -> set[str]:
    """The decoded values of a request's credential fields, in its query and body
    (the first MAX_VALUE_SECRETS of them).

    Found by name, not from the config: a stored request shows no key even
    when the command runs without the service's environment.
    """
    found: set[str] = set()
    for name, value in parse_qsl(query):
        if value and sensitive_name(name):
            found.add(value)
            if len(found) >= MAX_VALUE_SECRETS:
                return found
    kind = media_type(content_type)
    if kind in ("application/x-www-form-urlencoded", "multipart/form-data"):
        for name, value in (parse_form(content_type, body) or {}).items():
            if value and sensitive_name(name):
                found.add(value)
                if len(found) >= MAX_VALUE_SECRETS:
                    break
    elif ("json" in kind or body.lstrip()[:1] in (b"{", b"[")) and _may_name_a_credential(
        body.decode("latin-1")
    ):
        _json_secrets(parse_json(body), found)
    return found


def request_masker(masker: Masker, query: str, content_type: str | None, body: bytes) -> Masker:
    """`masker`, plus the request's own credentials (found by name): what every
    view of a stored request masks, with or without the config's secrets."""
    return masker.merged(Masker(inbound_secrets(query, content_type, body)))


@dataclass(frozen=True)
class Hidden:
    """A piece of a text that a view shows masked: what it was, what is shown."""

    original: str
    shown: str = MASK


# A text as a view shows it: plain pieces, and the pieces it masks.
Segments = list["str | Hidden"]


def shown_body(text: str, content_type: str | None, masker: Masker) -> str:
    """A stored body's text as every view shows it: credential fields of a form
    or a JSON document masked by name, then every secret `masker` knows (see
    `request_masker`)."""
    return shown(body_segments(text, content_type, masker))


def shown(segments: Segments) -> str:
    return "".join(piece if isinstance(piece, str) else piece.shown for piece in segments)


def body_segments(text: str, content_type: str | None, masker: Masker) -> Segments:
    """`shown_body`, as pieces: each masked piece with the text it hides (what
    an edited copy puts back where it was, relay.ops.resend)."""
    kind = media_type(content_type)
    if kind == "application/x-www-form-urlencoded":
        pieces = _form_segments(text)
    elif ("json" in kind or text.lstrip()[:1] in ("{", "[")) and _may_name_a_credential(text):
        pieces = _json_segments(text)
    else:
        pieces = [text]
    out: Segments = []
    for piece in pieces:
        if isinstance(piece, str):
            out += masker.segments(piece)
        else:
            out.append(piece)
    return out


def mask_fields(urlencoded: str) -> str:
    """A query string or form body with each credential field's value masked,
    whatever its encoding (the name is decoded to decide; the rest is kept
    byte for byte)."""
    return shown(_form_segments(urlencoded))


def _form_segments(urlencoded: str) -> Segments:
    if "=" not in urlencoded:
        return [urlencoded]
    out: Segments = []
    plain: list[str] = []
    for index, piece in enumerate(urlencoded.split("&")):
        if index:
            plain.append("&")
        name, sep, value = piece.partition("=")
        if sep and value and sensitive_name(unquote_plus(name)):
            plain.append(f"{name}=")
            out += ["".join(plain), Hidden(value)]
            plain = []
        else:
            plain.append(piece)
    out.append("".join(plain))
    return out


# A JSON string, and when it is a key, its value: a string, a number, or the
# opening of an object or array (true, false and null hide nothing). A string cut short by the end
# of the text (a body cut to a size) runs to the end. Possessive repeats: the
# scan only moves forward, one step per character, whatever the text.
_JSON_STRING = r'"([^"\\]*+(?:\\.[^"\\]*+)*+)(?:"|\Z)'
_JSON_PAIR = re.compile(
    _JSON_STRING + r"(?:\s*+:\s*+(?:" + _JSON_STRING + r"|(-?[0-9][0-9.eE+-]*+)|([\[{])))?",
    re.S,
)
# What moves an object's or array's depth: its brackets, and strings (skipped whole).
_JSON_NESTING = re.compile(r'"[^"\\]*+(?:\\.[^"\\]*+)*+(?:"|\Z)|[\[\]{}]')


def _json_segments(text: str) -> Segments:
    """JSON text with the value of every credential-named key masked, whatever
    its shape (a string's letters; a number, an object or an array whole), in
    one forward pass. Text that is not valid JSON (a body cut to a
    size) is masked as far as it reads like JSON: a value cut short is masked
    to the end."""
    out: Segments = []
    position = 0
    for match in _JSON_PAIR.finditer(text):
        if match.start() < position:  # inside a value already masked
            continue
        group = next((g for g in (2, 3, 4) if match.start(g) >= 0), None)
        if group is None or not sensitive_name(_json_text(match.group(1))):
            continue
        start, end = match.span(group)
        if group == 4:
            end = _container_end(text, start)
        if start == end:
            continue
        out += [text[position:start], Hidden(text[start:end])]
        position = end
    out.append(text[position:])
    return out


def _container_end(text: str, start: int) -> int:
    """Where the object or array opened at `start` ends (the end of the text
    when it is cut short)."""
    depth = 0
    for match in _JSON_NESTING.finditer(text, start):
        token = match.group()
        if token in "[{":
            depth += 1
        elif token in "]}":
            depth -= 1
            if depth == 0:
                return match.end()
    return len(text)


def _json_text(raw: str) -> str:
    if "\\" not in raw:
        return raw
    try:
        value = orjson.loads(f'"{raw}"')
    except orjson.JSONDecodeError:
        return raw
    return value if isinstance(value, str) else raw


def _json_secrets(document: Any, found: set[str]) -> None:
    """Credential values of a parsed JSON document, breadth-first, iteratively
    (no recursion limit to reach), until MAX_VALUE_SECRETS are found: the
    value of a credential-named key, or every scalar inside it when it is an
    object or an array."""
    if not isinstance(document, dict | list):
        return
    queue: deque[tuple[Any, bool]] = deque([(document, False)])
    while queue and len(found) < MAX_VALUE_SECRETS:
        value, secret = queue.popleft()
        items = value.items() if isinstance(value, dict) else ((None, v) for v in value)
        for key, item in items:
            inside = secret or (key is not None and sensitive_name(str(key)))
            if isinstance(item, dict | list):
                queue.append((item, inside))
            elif inside and _scalar(item) and item != "":
                found.add(str(item))
                if len(found) >= MAX_VALUE_SECRETS:
                    return


def userinfo_secrets(url: str) -> list[str]:
    """The credentials of a URL's `user:password@`, in every form relay sends
    them: the password, and base64 of `user:password` (Basic authorization:
    a target's url, a proxy's Proxy-Authorization), which a peer that quotes
    the request back would otherwise show in clear. Nothing without userinfo."""
    if "@" not in url:
        return []
    try:
        parts = urlsplit(url)
        user, password = parts.username, parts.password
    except ValueError:
        return []
    if user is None:
        return []
    # The header carries them decoded (yarl and urllib alike: %40 is "@").
    user, password = unquote(user), unquote(password or "")
    pair = base64.b64encode(f"{user}:{password}".encode()).decode()
    return [pair, password] if password else [pair]


def _scalar(value: Any) -> bool:
    """A value that can be a credential: a string or a number (not a boolean)."""
    return isinstance(value, str | int | float) and not isinstance(value, bool)


def _encodings(secret: str) -> set[str]:
    """The secret in every form it may be stored or quoted back in: as is,
    percent-encoded (a query string or a form body keeps it encoded; `+` or
    `%20` for a space), and JSON-escaped (a receiver echoing the request in a
    JSON answer: `"` and `\\` escaped, letters as `\\uXXXX` by an encoder that
    writes ASCII, `/` as `\\/` by PHP's)."""
    forms = {secret, quote_plus(secret), quote(secret, safe=""), quote(secret)}
    for escaped in (orjson.dumps(secret).decode()[1:-1], json.dumps(secret)[1:-1]):
        forms |= {escaped, escaped.replace("/", "\\/")}
    return forms


def _shown_url(secret: str) -> str | None:
    """`https://host/***` for a secret that is a whole http(s) URL: the host is
    no secret, the path and query (where such URLs keep their key) are. The
    one `***` stands for all of them, however many segments; a trailing `/`
    stays, so what the config adds after the reference reads as written
    (`${CRM_URL}crm.lead.add` as `https://host/***/crm.lead.add`)."""
    if not secret.startswith(("http://", "https://")):
        return None
    try:
        parts = urlsplit(secret)
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return None
    if not parts.hostname:
        return None
    slash = "/" if secret.endswith("/") else ""
    return f"{parts.scheme}://{parts.hostname}{port}/{MASK}{slash}"


# Placeholders for masked pieces while a text is being masked: characters of
# Unicode's private use area that neither the text nor any secret holds.
_PRIVATE_USE = range(0xE000, 0xF900)


class Masker:
    """Masks known secret values in any text, in every form they may be stored
    in (see `_encodings`), longest first so a secret holding another is
    masked whole. Each form is looked for with `str.replace` (linear, in C):
    a request's own secrets are few (MAX_VALUE_SECRETS), so a view of a body
    of any size costs a bounded number of passes over it."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self.secrets = frozenset(s for s in secrets if len(s) >= _MIN_SECRET_LENGTH)
        # A secret URL (a Bitrix24 inbound webhook) still says where it goes.
        variants: dict[str, str] = {}
        for secret in self.secrets:
            shown_as = _shown_url(secret) or MASK
            for variant in _encodings(secret):
                variants.setdefault(variant, shown_as)
        self._variants = sorted(variants.items(), key=lambda item: len(item[0]), reverse=True)

    def merged(self, other: Masker) -> Masker:
        return Masker(self.secrets | other.secrets)

    def text(self, value: str) -> str:
        if value and "://" in value and "@" in value:
            value = _URL_CREDENTIALS.sub(r"\1***@", value)
        return self.secrets_only(value)

    def secrets_only(self, value: str) -> str:
        """`value` with the secrets masked and nothing else: a URL's user shown
        on purpose (a config error's example) stays."""
        return shown(self.segments(value))

    def segments(self, value: str) -> Segments:
        """`value` as pieces: the text between secrets, and each secret hidden."""
        present = [(v, shown_as) for v, shown_as in self._variants if v in value]
        if not present:
            return [value]
        # Each secret in turn becomes one placeholder character that neither
        # the text nor any secret holds, so a later (shorter) secret can never
        # match inside or across one already masked.
        taken = set(value)
        for variant, _ in present:
            taken.update(variant)
        free = (chr(code) for code in _PRIVATE_USE if chr(code) not in taken)
        hidden: dict[str, Hidden] = {}
        for (variant, shown_as), placeholder in zip(present, free, strict=False):
            replaced = value.replace(variant, placeholder)
            if replaced is not value:
                value = replaced
                hidden[placeholder] = Hidden(variant, shown_as)
        if not hidden:
            return [value]
        out: Segments = []
        position = 0
        for match in re.finditer("[" + "".join(hidden) + "]", value):
            out += [value[position : match.start()], hidden[match.group()]]
            position = match.end()
        out.append(value[position:])
        return out

    def optional(self, value: str | None) -> str | None:
        return None if value is None else self.text(value)

    def data(self, value: bytes) -> bytes:
        if not self._variants or not value:
            return value
        text = value.decode("utf-8", errors="surrogateescape")
        masked = self.secrets_only(text)
        return value if masked == text else masked.encode("utf-8", errors="surrogateescape")

    def header(self, name: str, value: str) -> str:
        if is_sensitive_header(name):
            return MASK
        return self.text(value)

    def headers(self, headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
        return [(name, self.header(name, value)) for name, value in headers]
