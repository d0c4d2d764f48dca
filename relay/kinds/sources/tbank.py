"""`source = "tbank"`: T-Bank payment notifications, signed with the terminal password."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from relay.config.reader import Section
from relay.config.sources import secret_list
from relay.kinds.base import SenderRetry, SourceKind

if TYPE_CHECKING:
    from relay.sources.base import Source


@dataclass(frozen=True)
class TbankSource:
    passwords: tuple[str, ...]


# T-Bank resends a notification for up to a month: its duplicates must be
# recognised that long, whatever the storage retention.
TBANK_DEDUP_WINDOW = 30 * 86400.0


def parse(section: Section) -> TbankSource:
    return TbankSource(passwords=secret_list(section, "password"))


def build(settings: TbankSource) -> Source:
    from relay.sources.profiles import Tbank

    return Tbank(settings)


def secrets(settings: TbankSource) -> Iterable[str]:
    return settings.passwords


KIND = SourceKind(
    name="tbank",
    parse=parse,
    build=build,
    secrets=secrets,
    secret_keys=("password",),
    retry_window=SenderRetry("T-Bank", TBANK_DEDUP_WINDOW),
    dedup_window=TBANK_DEDUP_WINDOW,
)
