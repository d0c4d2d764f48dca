"""`source = "hmac"`: any sender that signs the body with a shared secret."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from relay.config.model import Answer
from relay.config.reader import Section
from relay.config.shared import secret_list
from relay.kinds.base import SourceKind
from relay.kinds.source import ACCEPT, Check, Reject, Source
from relay.sources.base import hmac_signatures, matches_any

if TYPE_CHECKING:
    from relay.core.incoming import Incoming


HmacAlgorithm = Literal["sha1", "sha256", "sha512"]


@dataclass(frozen=True)
class HmacSource:
    header: str
    secrets: tuple[str, ...]
    algorithm: HmacAlgorithm = "sha256"
    encoding: Literal["hex", "base64"] = "hex"
    prefix: str = ""


def parse(section: Section) -> HmacSource:
    return HmacSource(
        header=section.string("header"),
        secrets=secret_list(section, "secret"),
        algorithm=section.choice("algorithm", ("sha1", "sha256", "sha512"), "sha256"),
        encoding=section.choice("encoding", ("hex", "base64"), "hex"),
        prefix=section.string("prefix", "", nonempty=False),
    )


def build(settings: HmacSource) -> Source:
    return Hmac(settings)


def secrets(settings: HmacSource) -> Iterable[str]:
    return settings.secrets


class Hmac:
    """Any sender signing the raw body with an HMAC in one header."""

    answer: Answer | None = None

    def __init__(self, settings: HmacSource) -> None:
        self.settings = settings

    def check(self, incoming: Incoming, now: float) -> Check:
        settings = self.settings
        given = incoming.headers.get(settings.header)
        if not given:
            return Reject("missing_signature", f"no {settings.header} header")
        if settings.prefix:
            if not given.startswith(settings.prefix):
                return Reject("bad_signature", f"signature does not start with {settings.prefix}")
            given = given[len(settings.prefix) :]
        expected = hmac_signatures(
            settings.secrets, incoming.body, settings.algorithm, settings.encoding
        )
        given = given.strip()
        if settings.encoding == "hex":
            given = given.lower()
        if not matches_any(given, expected):
            return Reject("bad_signature")
        return ACCEPT

    def key(self, incoming: Incoming) -> str | None:
        return None


KIND = SourceKind(name="hmac", parse=parse, build=build, secrets=secrets, secret_keys=("secret",))
