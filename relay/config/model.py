"""The config as plain frozen objects: what every other module reads."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Literal

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
    # How long SIGTERM waits for attempts in flight before releasing them.
    shutdown_timeout: float = 30.0


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


@dataclass(frozen=True)
class AdminConfig:
    enabled: bool = True
    listen: Listen = Listen("127.0.0.1", 8081)
    token: str | None = None


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
    # Dead deliveries within this window make one alert, not one each.
    group_window: float = 60.0


@dataclass(frozen=True)
class RetryPolicy:
    """When to try again. Delay before retry n (1-based) comes from `relay.retry`."""

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
class HttpTarget:
    url: str
    method: str = "POST"
    headers: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class FileTarget:
    path: Path


TargetSettings = HttpTarget | FileTarget


@dataclass(frozen=True)
class TargetConfig:
    name: str
    retry: RetryPolicy
    settings: TargetSettings
    concurrency: int = 4

    @property
    def type(self) -> str:
        return _TARGET_TYPES[type(self.settings)]


_TARGET_TYPES: dict[type, str] = {HttpTarget: "http", FileTarget: "file"}


@dataclass(frozen=True)
class RouteTarget:
    """One target of a route, with the policy its deliveries follow."""

    target: str
    retry: RetryPolicy
    when: Template | None = None


@dataclass(frozen=True)
class RouteConfig:
    name: str
    path: str
    targets: tuple[RouteTarget, ...]
    idempotency_key: Template | None = None
    require_idempotency_key: bool = False
    max_body_size: int = 1024 * 1024
    # Keep this route's events (and so refuse their duplicates) at least this
    # long, even past the storage retention.
    dedup_window: float | None = None

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
