"""Masking: configured secret values never leave relay in logs, errors or answers."""

from __future__ import annotations

import re
from collections.abc import Iterable

MASK = "***"

# Headers whose values are credentials whatever the config says.
SENSITIVE_HEADERS = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "cookie",
        "set-cookie",
        "x-api-key",
        "x-tilda-api-key",
        "x-telegram-bot-api-secret-token",
        "x-wc-webhook-signature",
        "webhook-signature",
        "x-hub-signature",
        "x-hub-signature-256",
        "x-signature",
    }
)

# user:password@ in a URL, whatever the config says.
_URL_CREDENTIALS = re.compile(r"(\w+://)[^/\s:@]+(?::[^/\s@]*)?@")

# Shorter values would mask innocent text ("1", "yes") everywhere.
_MIN_SECRET_LENGTH = 4


def is_sensitive_header(name: str) -> bool:
    """A header whose value is a credential: masked in views, never indexed."""
    lowered = name.lower()
    return lowered in SENSITIVE_HEADERS or "secret" in lowered or "token" in lowered


class Masker:
    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self.secrets = frozenset(s for s in secrets if len(s) >= _MIN_SECRET_LENGTH)
        # Longest first, so a secret containing another is masked whole.
        values = sorted(self.secrets, key=len, reverse=True)
        self._pattern = re.compile("|".join(re.escape(v) for v in values)) if values else None

    def merged(self, other: Masker) -> Masker:
        return Masker(self.secrets | other.secrets)

    def text(self, value: str) -> str:
        if value and "://" in value and "@" in value:
            value = _URL_CREDENTIALS.sub(r"\1***@", value)
        if self._pattern is None or not value:
            return value
        return self._pattern.sub(MASK, value)

    def optional(self, value: str | None) -> str | None:
        return None if value is None else self.text(value)

    def data(self, value: bytes) -> bytes:
        if self._pattern is None or not value:
            return value
        text = value.decode("utf-8", errors="surrogateescape")
        masked = self._pattern.sub(MASK, text)
        return value if masked == text else masked.encode("utf-8", errors="surrogateescape")

    def header(self, name: str, value: str) -> str:
        if is_sensitive_header(name):
            return MASK
        return self.text(value)

    def headers(self, headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
        return [(name, self.header(name, value)) for name, value in headers]
