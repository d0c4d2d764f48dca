"""What a kind of target or source is: one value that every part of relay asks.

A kind declares its name, how its settings are read and checked, how it is
built, which of its settings are credentials, how it is shown (targets) and
how long its sender retries (sources). The config reader, the daemon,
`relay check`, the admin API and the masker read these, and know no kind by
name (datasette loads its own built-ins through
the same hook as plugins; huey picks its storage with one attribute).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

if TYPE_CHECKING:
    from relay.config.model import Listen, Rate, RouteConfig
    from relay.config.reader import Section
    from relay.core.secrets import Masker
    from relay.kinds.source import Source
    from relay.kinds.target import Target
    from relay.templates import Template

S = TypeVar("S")


def _no_secrets(settings: Any) -> Iterable[str]:
    return ()


def _no_shared_rates(settings: Any) -> tuple[tuple[str, Rate], ...]:
    return ()


class AlertTemplates(Protocol):
    """What an alert says (relay/background/alerts.py): its one-line summary and its text."""

    @property
    def summary(self) -> Template: ...

    @property
    def text(self) -> Template: ...


def _no_alert_twin(settings: Any, alert: AlertTemplates) -> None:
    return None


def _not_listening(settings: S, listening: tuple[Listen, ...]) -> S:
    return settings


@dataclass(frozen=True)
class TargetKind(Generic[S]):
    # The `type` of a [targets.NAME] table.
    name: str
    # Reads this kind's own keys of the table (the common ones, such as
    # `retry` and `concurrency`, are read by relay.loader.targets); a bad
    # value is a ConfigError naming the key. `base` resolves relative paths.
    parse: Callable[[Section, Path], S]
    # The target that sends: (its name, settings, concurrency). Its module is
    # imported when built, so reading a config loads no sender's client.
    build: Callable[[str, S, int], Target]
    # One line for `relay check`: where it sends.
    destination: Callable[[S, Masker], str]
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
    # Which of them a receiver's wait holds besides the target (None: all):
    # what the kind's receiver says its limits are about.
    held_by_a_wait: Callable[[S], frozenset[str]] | None = None
    # The settings alerts go out with when this target is `[alerts] target`:
    # its own templates (made for a lead, a payment) replaced by the alert's
    # (relay/targets/alerting.py). None: alerts go as everything else does.
    alert_settings: Callable[[S, AlertTemplates], S | None] = _no_alert_twin
    # The settings told where relay itself listens (`[server] listen`, `[admin]
    # listen`), for a kind that a peer could point back at relay (an http
    # target's redirects are never followed there). Most need not know.
    own_listeners: Callable[[S, tuple[Listen, ...]], S] = _not_listening


@dataclass(frozen=True)
class SenderRetry:
    """How long a sender keeps retrying on its own (from its documentation)."""

    sender: str  # as a warning names it: "T-Bank"
    seconds: float


def _no_advice(settings: Any, route: RouteConfig) -> list[str]:
    return []


def _no_settings(section: Section) -> Any:
    return None


@dataclass(frozen=True)
class SourceKind(Generic[S]):
    # The `source` of a [routes.NAME] table.
    name: str
    # The profile that checks and answers its requests.
    build: Callable[[S], Source]
    # Reads this source's own keys of the route table (a ConfigError names
    # the key); a source without settings of its own has none to read.
    parse: Callable[[Section], S] = _no_settings
    # The credential values in its settings, masked wherever they show.
    secrets: Callable[[S], Iterable[str]] = _no_secrets
    # The route keys holding credentials as written in the file (see TargetKind).
    secret_keys: tuple[str, ...] = ()
    # The headers in which this sender sends a credential (its token, its
    # signature), as its documentation names them: masked wherever a request
    # shows and never indexed for search, whatever the config says.
    secret_headers: tuple[str, ...] = ()
    # relay answers at once, so the sender stops retrying: `relay check` warns
    # when a target of the route gives up sooner than the sender would have.
    retry_window: SenderRetry | None = None
    # A sender that resends this long: its duplicates are recognised at least
    # as long (the route's dedup_window is raised to it), whatever the retention.
    dedup_window: float | None = None
    # `relay check`'s warnings for a risky but valid use of it on a route.
    advice: Callable[[S, RouteConfig], list[str]] = _no_advice
