"""`source = "tbank"`: T-Bank payment notifications, signed with the terminal password."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from relay.config.model import Answer
from relay.config.reader import Section
from relay.config.shared import secret_list
from relay.kinds.base import SenderRetry, SourceKind
from relay.kinds.source import Accept, Check, Reject, Source
from relay.sources.base import joined_key, matches_any, text_answer

if TYPE_CHECKING:
    from relay.core.incoming import Incoming


@dataclass(frozen=True)
class TbankSource:
    passwords: tuple[str, ...]


# T-Bank resends a notification for up to a month: its duplicates must be
# recognised that long, whatever the storage retention.
TBANK_DEDUP_WINDOW = 30 * 86400.0


def parse(section: Section) -> TbankSource:
    return TbankSource(passwords=secret_list(section, "password"))


def build(settings: TbankSource) -> Source:
    return Tbank(settings)


def secrets(settings: TbankSource) -> Iterable[str]:
    return settings.passwords


class Tbank:
    """T-Bank acquiring notifications, signed with a Token over the root fields."""

    answer: Answer | None = text_answer("OK")  # anything else makes T-Bank send it again

    def __init__(self, settings: TbankSource) -> None:
        self.settings = settings

    def check(self, incoming: Incoming, now: float) -> Check:
        data = incoming.json
        if not isinstance(data, dict):
            return Reject("not_json", "a T-Bank notification is a JSON object")
        given = data.get("Token")
        if not isinstance(given, str):
            return Reject("missing_signature", "no Token field")
        expected = [tbank_token(data, password) for password in self.settings.passwords]
        if not matches_any(given.lower(), expected):
            return Reject("bad_signature")
        return Accept(self.key(incoming))

    def key(self, incoming: Incoming) -> str | None:
        # T-Bank re-sends a notification until it gets OK, with the same fields
        # and so the same Token; any other notification (a second partial
        # refund of one payment: same PaymentId and Status, another Amount)
        # has another Token. PaymentId and Status are there to be read. A
        # notification of a linked account or card (NotificationQr,
        # NotificationAddCard) has no PaymentId: its RequestKey, the request
        # it answers, names it instead (T-Bank's API description).
        data = incoming.json
        token = data.get("Token") if isinstance(data, dict) else None
        if not isinstance(token, str):
            return None
        named = data.get("PaymentId")
        if named in (None, ""):
            named = data.get("RequestKey")
        return joined_key(named, data.get("Status"), token.lower())


def tbank_token(data: dict[str, Any], password: str) -> str:
    """T-Bank's Token: root fields but Token and nested objects, plus Password,
    sorted by name, values concatenated (booleans as true/false), SHA-256 hex."""
    fields = {
        name: value
        for name, value in data.items()
        if name != "Token" and not isinstance(value, dict | list)
    }
    fields["Password"] = password
    joined = "".join(_tbank_value(fields[name]) for name in sorted(fields))
    return hashlib.sha256(joined.encode()).hexdigest()


def _tbank_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    return str(value)


KIND = SourceKind(
    name="tbank",
    parse=parse,
    build=build,
    secrets=secrets,
    secret_keys=("password",),
    retry_window=SenderRetry("T-Bank", TBANK_DEDUP_WINDOW),
    dedup_window=TBANK_DEDUP_WINDOW,
)
