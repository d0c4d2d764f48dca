"""What a kind of target is: one value that every part of relay asks.

A kind declares its `type` name, how its settings are read and checked, how
it is built, which of its settings are credentials, and how it is shown. The
config reader, the daemon, `relay check`, the admin API and the masker read
these, and know no kind by name (datasette loads its own built-ins through
the same hook as plugins; huey picks its storage with one attribute).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from relay.config.model import Rate
    from relay.config.reader import Section
    from relay.secrets import Masker
    from relay.targets.base import Target

S = TypeVar("S")


def _no_secrets(settings: Any) -> Iterable[str]:
    return ()


def _no_shared_rates(settings: Any) -> tuple[tuple[str, Rate], ...]:
    return ()


@dataclass(frozen=True)
class TargetKind(Generic[S]):
    # The `type` of a [targets.NAME] table.
    name: str
    # Reads this kind's own keys of the table (the common ones, such as
    # `retry` and `concurrency`, are read by relay.config.targets); a bad
    # value is a ConfigError naming the key. `base` resolves relative paths.
    parse: Callable[[Section, Path], S]
    # The target that sends: (its name, settings, concurrency). Its module is
    # imported when built, so reading a config loads no sender's client.
    build: Callable[[str, S, int], Target]
    # One line for `relay check`: where it sends.
    describe: Callable[[S, Masker], str]
    # Fields for the admin API and dashboard (`name` and `type` are added).
    view: Callable[[S, Masker], dict[str, Any]]
    # The credential values in its settings, masked wherever they show.
    secrets: Callable[[S], Iterable[str]] = _no_secrets
    # The keys holding credentials as written in the file: the operator
    # commands, which read targets by name only, mask them all the same.
    secret_keys: tuple[str, ...] = ()
    default_concurrency: int = 4
    # Limits shared with other targets sending to the same place.
    shared_rates: Callable[[S], tuple[tuple[str, Rate], ...]] = _no_shared_rates
