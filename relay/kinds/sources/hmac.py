"""`source = "hmac"`: any sender that signs the body with a shared secret."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from relay.config.reader import Section
from relay.config.sources import secret_list
from relay.kinds.base import SourceKind

if TYPE_CHECKING:
    from relay.sources.base import Source


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
    from relay.sources.profiles import Hmac

    return Hmac(settings)


def secrets(settings: HmacSource) -> Iterable[str]:
    return settings.secrets


KIND = SourceKind(name="hmac", parse=parse, build=build, secrets=secrets, secret_keys=("secret",))
