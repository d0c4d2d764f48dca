"""Dashboard sessions and CSRF tokens: signed cookies, revocable.

The signing key is derived from the admin token and a random value drawn when
relay starts: rotating the token (and reloading) or restarting relay signs
everyone out. Signing out revokes the session here, so a copy of the cookie
is worth nothing afterwards; the revoked ids are kept until the cookie would
have expired anyway, and lost with the process (whose restart voids them all).
Without a token (loopback only) the random key alone still gives every form a
CSRF token.
"""

from __future__ import annotations

import base64
import hmac
import secrets
import time
from collections.abc import Callable

SESSION_COOKIE = "relay_session"
LOGIN_COOKIE = "relay_login"
SESSION_SECONDS = 12 * 3600


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class Sessions:
    def __init__(self, token: Callable[[], str | None]) -> None:
        self._token = token
        self._process_key = secrets.token_bytes(32)
        self._revoked: dict[str, float] = {}

    def _key(self) -> bytes:
        token = self._token()
        if token is None:
            return self._process_key
        return hmac.digest(
            token.encode(), b"relay dashboard sessions" + self._process_key, "sha256"
        )

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
        if not expires.isascii() or not expires.isdigit() or int(expires) < now:
            return None
        if nonce in self._revoked:
            return None
        return nonce

    def revoke(self, session: str, now: float | None = None) -> None:
        """Sign `session` out for good; forget revocations older than any cookie."""
        now = time.time() if now is None else now
        self._revoked = {s: at for s, at in self._revoked.items() if at > now - SESSION_SECONDS}
        self._revoked[session] = now

    def csrf(self, session: str) -> str:
        return self._sign(f"csrf.{session}")

    def csrf_matches(self, session: str, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given, self.csrf(session))

    def token_matches(self, given: str) -> bool:
        token = self._token()
        return token is not None and hmac.compare_digest(given.encode(), token.encode())
