"""Dashboard sessions and CSRF tokens, signed, with nothing stored server-side.

The signing key is derived from the admin token: rotating the token (and
reloading) signs everyone out. Without a token (loopback only) a random key
per process still gives every form a CSRF token.
"""

from __future__ import annotations

import base64
import hmac
import secrets
from collections.abc import Callable

SESSION_COOKIE = "relay_session"
LOGIN_COOKIE = "relay_login"
SESSION_SECONDS = 12 * 3600


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class Sessions:
    def __init__(self, token: Callable[[], str | None]) -> None:
        self._token = token
        self._fallback = secrets.token_bytes(32)

    def _key(self) -> bytes:
        token = self._token()
        if token is None:
            return self._fallback
        return hmac.digest(token.encode(), b"relay dashboard sessions", "sha256")

    def _sign(self, payload: str) -> str:
        return _b64(hmac.digest(self._key(), payload.encode(), "sha256"))

    def issue(self, now: float) -> str:
        payload = f"{int(now) + SESSION_SECONDS}.{_b64(secrets.token_bytes(16))}"
        return f"{payload}.{self._sign(payload)}"

    def valid(self, cookie: str | None, now: float) -> str | None:
        """The session's id when the cookie is ours and not expired, else None."""
        if not cookie or cookie.count(".") != 2:
            return None
        expires, nonce, signature = cookie.split(".")
        payload = f"{expires}.{nonce}"
        if not hmac.compare_digest(signature, self._sign(payload)):
            return None
        if not expires.isdigit() or int(expires) < now:
            return None
        return nonce

    def csrf(self, session: str) -> str:
        return self._sign(f"csrf.{session}")

    def csrf_matches(self, session: str, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given, self.csrf(session))

    def token_matches(self, given: str) -> bool:
        token = self._token()
        return token is not None and hmac.compare_digest(given.encode(), token.encode())
