"""Masking: configured secret values never leave relay in logs, errors or answers."""

from __future__ import annotations

import re
from collections.abc import Iterable
from types import ModuleType
from typing import Any
from urllib.parse import parse_qsl, quote, quote_plus, unquote_plus, urlsplit

from relay.payload import media_type, parse_form, parse_json

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

# user:password@ in a URL, whatever the config says.
_URL_CREDENTIALS = re.compile(r"(\w+://)[^/\s:@]+(?::[^/\s@]*)?@")

# Shorter values would mask innocent text ("1", "yes") everywhere.
_MIN_SECRET_LENGTH = 4


def sensitive_name(name: str) -> bool:
    """Whether a header, query or body field of this name carries a credential
    (Tilda's api_key, a ?token=, T-Bank's Token, a signature header...)."""
    return _has_sensitive_part(name.lower())


def _has_sensitive_part(lowered: str) -> bool:
    normal = lowered.replace("-", "_")
    return any(part in normal for part in _SENSITIVE_PARTS)


_kinds: ModuleType | None = None


def _load_kinds() -> ModuleType:
    # Not imported at the top: the kinds read the config, whose model imports this module.
    global _kinds
    import relay.kinds

    _kinds = relay.kinds
    return _kinds


def is_sensitive_header(name: str) -> bool:
    """A header whose value is a credential: masked in views, never indexed.
    (Asked for every header of every request indexed: one lower(), set lookups.)"""
    lowered = name.lower()
    return (
        lowered in SENSITIVE_HEADERS
        or lowered in (_kinds or _load_kinds()).SECRET_HEADERS
        or _has_sensitive_part(lowered)
    )


def inbound_secrets(query: str, content_type: str | None, body: bytes) -> set[str]:
    """The decoded values of a request's credential fields, in its query and body.

    Found by name, not from the config: a stored request shows no key even
    when the command runs without the service's environment.
    """
    found = {value for name, value in parse_qsl(query) if sensitive_name(name) and value}
    kind = media_type(content_type)
    if kind in ("application/x-www-form-urlencoded", "multipart/form-data"):
        fields = parse_form(content_type, body) or {}
        found |= {value for name, value in fields.items() if sensitive_name(name) and value}
    elif "json" in kind or body.lstrip()[:1] in (b"{", b"["):
        _json_secrets(parse_json(body), found, depth=0)
    return found


def request_masker(masker: Masker, query: str, content_type: str | None, body: bytes) -> Masker:
    """`masker`, plus the request's own credentials (found by name): what every
    view of a stored request masks, with or without the config's secrets."""
    return masker.merged(Masker(inbound_secrets(query, content_type, body)))


def shown_body(text: str, content_type: str | None, masker: Masker) -> str:
    """A stored body's text as every view shows it: credential fields of a form
    masked by name, then every secret `masker` knows (see `request_masker`)."""
    if media_type(content_type) == "application/x-www-form-urlencoded":
        text = mask_fields(text)
    return masker.text(text)


def mask_fields(urlencoded: str) -> str:
    """A query string or form body with each credential field's value masked,
    whatever its encoding (the name is decoded to decide; the rest is kept
    byte for byte)."""
    if "=" not in urlencoded:
        return urlencoded
    pieces = []
    for piece in urlencoded.split("&"):
        name, sep, _ = piece.partition("=")
        if sep and sensitive_name(unquote_plus(name)):
            piece = f"{name}={MASK}"
        pieces.append(piece)
    return "&".join(pieces)


def _json_secrets(value: Any, found: set[str], depth: int) -> None:
    if depth > 32:
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, str | int) and sensitive_name(str(key)) and item != "":
                found.add(str(item))
            else:
                _json_secrets(item, found, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _json_secrets(item, found, depth + 1)


def _encodings(secret: str) -> set[str]:
    """The secret as it may be stored: as is, and percent-encoded (a query
    string or a form body keeps it encoded; `+` or `%20` for a space)."""
    return {secret, quote_plus(secret), quote(secret, safe=""), quote(secret)}


def _shown_url(secret: str) -> str | None:
    """`https://host/***` for a secret that is a whole http(s) URL: the host is
    no secret, the path and query (where such URLs keep their key) are."""
    if not secret.startswith(("http://", "https://")):
        return None
    try:
        parts = urlsplit(secret)
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return None
    if not parts.hostname:
        return None
    return f"{parts.scheme}://{parts.hostname}{port}/{MASK}"


class Masker:
    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self.secrets = frozenset(s for s in secrets if len(s) >= _MIN_SECRET_LENGTH)
        # Each secret also in its encoded forms: masked after decoding in
        # effect, whatever form a text shows it in. Longest first, so a secret
        # containing another is masked whole.
        values = sorted(
            {variant for secret in self.secrets for variant in _encodings(secret)},
            key=len,
            reverse=True,
        )
        self._pattern = re.compile("|".join(re.escape(v) for v in values)) if values else None
        # A secret URL (a Bitrix24 inbound webhook) still says where it goes.
        self._shown = {secret: _shown_url(secret) for secret in self.secrets}

    def _replace(self, match: re.Match[str]) -> str:
        return self._shown.get(match.group(0)) or MASK

    def merged(self, other: Masker) -> Masker:
        return Masker(self.secrets | other.secrets)

    def text(self, value: str) -> str:
        if value and "://" in value and "@" in value:
            value = _URL_CREDENTIALS.sub(r"\1***@", value)
        return self.secrets_only(value)

    def secrets_only(self, value: str) -> str:
        """`value` with the secrets masked and nothing else: a URL's user shown
        on purpose (a config error's example) stays."""
        if self._pattern is None or not value:
            return value
        return self._pattern.sub(self._replace, value)

    def optional(self, value: str | None) -> str | None:
        return None if value is None else self.text(value)

    def data(self, value: bytes) -> bytes:
        if self._pattern is None or not value:
            return value
        text = value.decode("utf-8", errors="surrogateescape")
        masked = self._pattern.sub(self._replace, text)
        return value if masked == text else masked.encode("utf-8", errors="surrogateescape")

    def header(self, name: str, value: str) -> str:
        if is_sensitive_header(name):
            return MASK
        return self.text(value)

    def headers(self, headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
        return [(name, self.header(name, value)) for name, value in headers]
