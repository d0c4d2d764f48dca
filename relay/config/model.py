"""The config as plain frozen objects: what every other module reads."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from ipaddress import IPv4Network, IPv6Network
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from relay.core.localtime import Zone, zone_named
from relay.core.pgurl import masked_url
from relay.core.secrets import Masker

if TYPE_CHECKING:
    # Compiled by the reader; the database commands read no template and start
    # without Jinja2.
    from relay.templates import Template

Backoff = Literal["exponential", "list"]
Synchronous = Literal["full", "normal"]


@dataclass(frozen=True)
class Listen:
    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def is_loopback(self) -> bool:
        return self.host in ("127.0.0.1", "::1", "localhost") or self.host.startswith("127.")


@dataclass(frozen=True)
class ServerConfig:
    listen: Listen = Listen("127.0.0.1", 8080)
    max_body_size: int = 1024 * 1024
    # How long a stop (SIGTERM) may take, all of it: relay.app.Relay.stop.
    shutdown_timeout: float = 30.0
    # Peers whose X-Forwarded-For is believed (nginx, Caddy in front of relay).
    trusted_proxies: tuple[IPv4Network | IPv6Network, ...] = ()
    # A sender has this long to deliver its body: a client trickling bytes
    # (slow-loris) must not hold a connection and its memory for ever.
    read_timeout: float = 10.0


@dataclass(frozen=True)
class StorageConfig:
    path: Path = Path("relay.db")
    synchronous: Synchronous = "full"
    # A write waiting longer than this for a lock held by another process
    # fails, and the sender gets 503 instead of waiting on us.
    busy_timeout: float = 5.0
    # Finished events (every delivery delivered or skipped) older than this
    # are removed; pending and dead ones never are.
    retention: float = 30 * 86400.0
    # postgresql://... : PostgreSQL instead of the SQLite file at `path`, for
    # several relay instances sharing one database. None: SQLite.
    url: str | None = None
    # PostgreSQL: this instance's name in the cluster (leases, heartbeats);
    # None: host, process id and a random part.
    instance_id: str | None = None
    # PostgreSQL: an instance silent this long is dead: its leases are taken
    # over, and, if it led, its session (and the lead) is ended by the server.
    dead_after: float = 10.0
    # PostgreSQL: the most connections an instance's pool opens; it opens
    # CONNECTIONS_BESIDES_POOL (relay.store.postgres.cluster) more of its own.
    pool_size: int = 10

    def location(self) -> str:
        """Where the data is, for logs and messages (a URL without its password)."""
        if self.url is None:
            return str(self.path)
        return masked_url(self.url)


@dataclass(frozen=True)
class AdminConfig:
    enabled: bool = True
    listen: Listen = Listen("127.0.0.1", 8081)
    token: str | None = None
    # Names besides IP addresses and localhost that may appear in Host (a proxy's).
    allowed_hosts: frozenset[str] = frozenset()
    # Where the token is kept; relay writes a random one there at start if missing.
    token_file: Path | None = None
    # The IANA zone times are shown and typed in (CLI, dashboard); None: the system's.
    timezone: str | None = None


@dataclass(frozen=True)
class LogConfig:
    format: Literal["text", "json"] = "text"
    level: Literal["debug", "info", "warning", "error"] = "info"


@dataclass(frozen=True)
class AlertsConfig:
    target: str | None = None  # None: alerts are off
    # Alert when a target has failed this many attempts in a row, and again
    # when it next succeeds.
    failing_after: int = 10
    # A delivery keeps failing once this many attempts of its current cycle
    # failed (it is still pending): listed, counted, and alerted once.
    delivery_failing_after: int = 5
    # A route is silent when nothing arrived for this many times its usual
    # longest silence at that hour of the week (relay.background.silence).
    silence_factor: float = 3.0
    # Dead deliveries within this window make one alert, not one each.
    group_window: float = 60.0


@dataclass(frozen=True)
class RetryPolicy:
    """When to try again. Delay before retry n (1-based) comes from `relay.delivery.retry`."""

    backoff: Backoff = "exponential"
    base: float = 2.0
    unit: float = 1.0
    retries: int = 15
    jitter: float = 0.1
    max_delay: float | None = None
    delays: tuple[float, ...] = ()
    timeout: float = 10.0
    retry_on_error: bool = True


@dataclass(frozen=True)
class Rate:
    """At most `count` per `per` seconds, evenly spaced (no bursts), so that a
    receiver counting requests in any sliding window never sees too many."""

    count: int
    per: float

    @property
    def per_second(self) -> float:
        return self.count / self.per

    def __str__(self) -> str:
        unit = {1.0: "s", 60.0: "m", 3600.0: "h"}.get(self.per, f"{self.per:g}s")
        return f"{self.count}/{unit}"


@dataclass(frozen=True)
class TargetConfig:
    name: str
    retry: RetryPolicy
    # The settings its kind read (relay/targets/<type>.py: HttpSettings,
    # SmtpSettings... or a kind registered later), and the kind's name: the table's `type`.
    settings: object
    type: str
    concurrency: int = 4
    rate: Rate | None = None
    # Limits shared with other targets, by a key naming what is limited: one
    # Telegram bot behind several targets, one chat, one Bitrix24 portal.
    shared_rates: tuple[tuple[str, Rate], ...] = ()
    # The keys of shared_rates a receiver's wait (a 429) holds besides the
    # target itself; None: all of them (a rate group is one receiver).
    held_by_a_wait: frozenset[str] | None = None
    # After `down_after` "target down" failures in a row (network, timeout,
    # 5xx) the target is down: its deliveries wait without spending retries
    # while one probe at a time goes out on the target's backoff schedule.
    hold_when_down: bool = False
    down_after: int = 5


@dataclass(frozen=True)
class RouteTarget:
    """One target of a route, with the policy its deliveries follow."""

    target: str
    retry: RetryPolicy
    when: Template | None = None
    # Deliveries whose key renders the same go one at a time, in order of
    # receipt (a payment's AUTHORIZED before its CONFIRMED).
    order_by: Template | None = None


@dataclass(frozen=True)
class Answer:
    """What a sender is told when its webhook is taken (or pinged)."""

    status: int
    body: bytes
    content_type: str


@dataclass(frozen=True)
class RouteConfig:
    name: str
    path: str
    targets: tuple[RouteTarget, ...]
    # The settings its source kind read (relay.sources: GenericSource,
    # TbankSource... or a kind registered later), and the kind's name.
    source: object
    source_kind: str
    idempotency_key: Template | None = None
    require_idempotency_key: bool = False
    max_body_size: int = 1024 * 1024
    # Keep this route's events (and so refuse their duplicates) at least this
    # long, even past the storage retention.
    dedup_window: float | None = None
    allow_ips: tuple[IPv4Network | IPv6Network, ...] = ()
    response: Answer | None = None  # overrides the source's own answer
    # A stored key arriving with other content: "store" it as a new event
    # flagged as a key conflict, or "reject" it with 422.
    key_conflict: Literal["store", "reject"] = "store"
    # Fields removed from an urlencoded form body before it goes to any target
    # (Tilda's api_key): stored as received, forwarded without them.
    strip_fields: tuple[str, ...] = ()
    # Silent after this long without an event, whatever it learnt (inf:
    # never watched; None: what it learnt alone, relay.background.silence).
    silent_after: float | None = None

    @property
    def templated(self) -> bool:
        """Whether a request on this route renders templates (its key, a `when`, an `order_by`)."""
        return self.idempotency_key is not None or any(
            target.when is not None or target.order_by is not None for target in self.targets
        )

    def policy_for(self, target: str) -> RetryPolicy | None:
        for route_target in self.targets:
            if route_target.target == target:
                return route_target.retry
        return None


@dataclass(frozen=True)
class Config:
    server: ServerConfig
    storage: StorageConfig
    retry: RetryPolicy
    targets: Mapping[str, TargetConfig]
    routes: Mapping[str, RouteConfig]
    admin: AdminConfig = AdminConfig()
    log: LogConfig = LogConfig()
    alerts: AlertsConfig = AlertsConfig()
    # Every value that came from ${VAR} or ${file:...}: masked wherever shown.
    secrets: frozenset[str] = frozenset()
    source: Path | None = None

    @cached_property
    def masker(self) -> Masker:
        """The masker of these secrets: built once per config, shared by every
        component that shows or logs what a request or a target said."""
        return Masker(self.secrets)

    @cached_property
    def zone(self) -> Zone:
        """The zone people read and type times in (admin.timezone; checked on load)."""
        return zone_named(self.admin.timezone)
