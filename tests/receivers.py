"""Receivers that de-duplicate on `Idempotency-Key`, written from what
receivers document, not from relay's code: what they do with a key they
have seen is what decides whether a distinct event is lost at their end.

- `Remembering`: the common receiver. Stripe ("Idempotent requests",
  docs.stripe.com/idempotency: "Subsequent requests with the same key return
  the same result"), Easyship and GrailPay (their "Idempotent requests"
  pages) answer a key they have processed with the saved answer, and do not
  process the request again, whatever its body.
- `IetfReceiver`: draft-ietf-httpapi-idempotency-key-header-06. Section 2:
  the field is an Item Structured Header whose value MUST be a String (RFC
  9651 section 3.3.3: in double quotes, `\\` escaping `"` and `\\`); a
  client MUST NOT send it twice. Section 2.6: a repeated key whose payload
  matches gets the result of the completed operation. Section 2.7: a missing
  key is answered 400, a key reused "with a different request payload" 422,
  a retry while the first is still processed 409.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from aiohttp import web


@dataclass
class Processed:
    key: str
    path: str
    body: bytes
    event_id: str  # X-Relay-Event-Id: which event, for the test's own accounting


@dataclass
class Remembering:
    """Processes a key once; a key seen again is acknowledged unprocessed.

    `drop_after` names keys whose first request is processed and then left
    without an answer (the connection closed): the sender cannot tell it was.
    """

    processed: list[Processed] = field(default_factory=list)
    acknowledged_again: list[Processed] = field(default_factory=list)
    drop_after: set[str] = field(default_factory=set)

    def seen(self, key: str) -> bool:
        return any(item.key == key for item in self.processed)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        keys = request.headers.getall("Idempotency-Key", [])
        if len(keys) != 1:
            return web.Response(status=400, text=f"expected one Idempotency-Key, got {keys}")
        item = Processed(keys[0], request.path, body, request.headers.get("X-Relay-Event-Id", ""))
        if self.seen(item.key):
            self.acknowledged_again.append(item)
            return web.json_response({"status": "already processed"})
        self.processed.append(item)
        if item.key in self.drop_after:
            self.drop_after.discard(item.key)
            assert request.transport is not None
            request.transport.close()  # processed; the answer never comes
        return web.json_response({"status": "created"})


class IetfReceiver:
    """The draft's receiver: a String key, 400 without one, 422 for a key
    reused with another payload, the saved answer for a repeat."""

    def __init__(self) -> None:
        self.processed: list[Processed] = []
        self.refused: list[tuple[int, str]] = []
        self._fingerprints: dict[str, str] = {}

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        fields = request.headers.getall("Idempotency-Key", [])
        if len(fields) != 1:
            return self._refuse(400, f"Idempotency-Key sent {len(fields)} times")
        key = sf_string(fields[0])
        if key is None:
            return self._refuse(400, f"Idempotency-Key {fields[0]!r} is not a String")
        fingerprint = hashlib.sha256(request.path.encode() + b"\n" + body).hexdigest()
        known = self._fingerprints.get(key)
        if known is not None and known != fingerprint:
            return self._refuse(422, f"Idempotency-Key {key} was used for another payload")
        if known is None:
            self._fingerprints[key] = fingerprint
            event_id = request.headers.get("X-Relay-Event-Id", "")
            self.processed.append(Processed(key, request.path, body, event_id))
        return web.json_response({"status": "created"}, status=201)

    def _refuse(self, status: int, why: str) -> web.Response:
        self.refused.append((status, why))
        return web.json_response({"title": why}, status=status)


def sf_string(value: str) -> str | None:
    """An sf-string's content (RFC 9651 section 4.2.5), or None when `value`
    is not one (a bare token among them)."""
    value = value.strip(" ")
    if len(value) < 2 or value[0] != '"' or value[-1] != '"':
        return None
    out = []
    chars = iter(value[1:-1])
    for char in chars:
        if char == "\\":
            escaped = next(chars, "")
            if escaped not in ('"', "\\"):
                return None
            out.append(escaped)
        elif char == '"' or not " " <= char <= "~":
            return None
        else:
            out.append(char)
    return "".join(out)


def app(**routes: Remembering | IetfReceiver) -> web.Application:
    """One server, a receiver at each `/<name>`."""
    application = web.Application()
    for name, receiver in routes.items():
        application.router.add_post(f"/{name}", receiver.handle)
    return application
