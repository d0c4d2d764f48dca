"""From a TOML file (and an environment) to a `Config`, or one `ConfigError`."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yarl

from relay.config.model import (
    AdminConfig,
    AlertsConfig,
    Config,
    FileTarget,
    HttpTarget,
    Listen,
    LogConfig,
    RetryPolicy,
    RouteConfig,
    RouteTarget,
    ServerConfig,
    StorageConfig,
    TargetConfig,
    TargetSettings,
)
from relay.config.reader import ConfigError, Section, describe, substitute
from relay.templates import Template, compile_expression, compile_template

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_\-]*")
_HTTP_METHODS = ("POST", "PUT", "PATCH", "DELETE", "GET")


def load_config(path: Path, environ: Mapping[str, str]) -> Config:
    """Read and check the file at `path`; `environ` resolves ${VAR} references."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("", f"{path}: no such file") from None
    except OSError as error:
        raise ConfigError("", f"{path}: cannot read: {error.strerror}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError("", f"{path}: invalid TOML: {error}") from None
    return parse_config(data, environ, base=path.resolve().parent, source=path.resolve())


def parse_config(
    data: Mapping[str, Any], environ: Mapping[str, str], *, base: Path, source: Path | None = None
) -> Config:
    secrets: set[str] = set()
    root = Section(substitute(dict(data), environ, "", secrets), "")
    server = _server(root.section("server"))
    storage = _storage(root.section("storage"), base)
    admin = _admin(root.section("admin"))
    log = _log(root.section("log"))
    default_retry = _retry(root.section("retry"), RetryPolicy())
    targets = {
        name: _target(name, section, default_retry, base)
        for name, section in root.subsections("targets").items()
    }
    routes: dict[str, RouteConfig] = {}
    paths: dict[str, str] = {}
    for name, section in root.subsections("routes").items():
        route = _route(name, section, targets, server)
        if route.path in paths:
            raise ConfigError(
                section.key("path"),
                f'"{route.path}" is already the path of routes.{paths[route.path]}',
            )
        paths[route.path] = name
        routes[name] = route
    alerts = _alerts(root.section("alerts"), targets)
    root.done()
    return Config(
        server=server,
        storage=storage,
        retry=default_retry,
        targets=MappingProxyType(targets),
        routes=MappingProxyType(routes),
        admin=admin,
        log=log,
        alerts=alerts,
        secrets=frozenset(secrets),
        source=source,
    )


def _server(section: Section) -> ServerConfig:
    defaults = ServerConfig()
    server = ServerConfig(
        listen=_listen(section, "listen", defaults.listen),
        max_body_size=section.size("max_body_size", defaults.max_body_size),
        shutdown_timeout=section.duration("shutdown_timeout", defaults.shutdown_timeout),
    )
    section.done()
    return server


def _listen(section: Section, name: str, default: Listen) -> Listen:
    value = section.string(name, None)
    if value is None:
        return default
    host, _, port = value.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not host or not port.isdigit() or int(port) > 65535:
        raise section.error(name, 'an address like "127.0.0.1:8080"', value)
    return Listen(host, int(port))


def _storage(section: Section, base: Path) -> StorageConfig:
    defaults = StorageConfig()
    storage = StorageConfig(
        path=section.path("path", base, base / defaults.path),
        synchronous=section.choice("synchronous", ("full", "normal"), defaults.synchronous),
        busy_timeout=section.duration("busy_timeout", defaults.busy_timeout),
        retention=section.duration("retention", defaults.retention),
    )
    section.done()
    return storage


def _admin(section: Section) -> AdminConfig:
    defaults = AdminConfig()
    enabled = section.boolean("enabled", defaults.enabled)
    listen = _listen(section, "listen", defaults.listen)
    token = section.string("token", None, nonempty=False) or None
    if enabled and token is None and not listen.is_loopback:
        raise ConfigError(
            section.key("token"),
            f"is required when the admin listener ({listen}) is not on loopback",
        )
    if token is not None and len(token) < 16:
        raise ConfigError(section.key("token"), "expected at least 16 characters")
    section.done()
    return AdminConfig(enabled=enabled, listen=listen, token=token)


def _log(section: Section) -> LogConfig:
    defaults = LogConfig()
    log = LogConfig(
        format=section.choice("format", ("text", "json"), defaults.format),
        level=section.choice("level", ("debug", "info", "warning", "error"), defaults.level),
    )
    section.done()
    return log


def _alerts(section: Section, targets: Mapping[str, TargetConfig]) -> AlertsConfig:
    defaults = AlertsConfig()
    target = section.string("target", None)
    if target is not None and target not in targets:
        known = ", ".join(sorted(targets)) or "none"
        raise ConfigError(section.key("target"), f'unknown target "{target}" (configured: {known})')
    alerts = AlertsConfig(
        target=target,
        failing_after=section.integer("failing_after", defaults.failing_after, minimum=1),
        group_window=section.duration("group_window", defaults.group_window),
    )
    section.done()
    return alerts


def _retry(section: Section, inherited: RetryPolicy) -> RetryPolicy:
    """Read a retry table; keys it leaves out keep the `inherited` values.

    A list of delays replaces the inherited schedule as a whole: its length
    is the number of retries unless `retries` is set beside it, in which case
    the last delay repeats.
    """
    raw_delays = section.take("delays", None)
    backoff = section.choice("backoff", ("exponential", "list"), None)
    if backoff is None:
        backoff = "list" if raw_delays is not None else inherited.backoff
    base = section.number("base", inherited.base, minimum=1.0, maximum=100.0)
    unit = section.duration("unit", inherited.unit)
    retries = section.integer("retries", None, minimum=0, maximum=1000)
    jitter = section.number("jitter", inherited.jitter, minimum=0.0, maximum=1.0)
    max_delay = section.duration("max_delay", inherited.max_delay)
    timeout = section.duration("timeout", inherited.timeout)
    retry_on_error = section.boolean("retry_on_error", inherited.retry_on_error)
    delays: tuple[float, ...] = ()
    if backoff == "list":
        if raw_delays is None:
            delays = inherited.delays
            if not delays:
                raise ConfigError(
                    section.key("delays"), 'is required with backoff = "list" (e.g. ["30s", "2m"])'
                )
            if retries is None:
                retries = inherited.retries
        elif not isinstance(raw_delays, list) or not raw_delays:
            raise section.error(
                "delays", 'a non-empty list of durations like ["30s", "2m"]', raw_delays
            )
        else:
            delays = tuple(
                section.parse_duration_value(f"delays[{index}]", item)
                for index, item in enumerate(raw_delays)
            )
    if retries is None:
        if backoff == "list":
            retries = len(delays)
        elif inherited.backoff == "exponential":
            retries = inherited.retries
        else:
            retries = RetryPolicy().retries
    section.done()
    return RetryPolicy(
        backoff=backoff,
        base=base,
        unit=unit,
        retries=retries,
        jitter=jitter,
        max_delay=max_delay,
        delays=delays,
        timeout=timeout,
        retry_on_error=retry_on_error,
    )


def _target(name: str, section: Section, default_retry: RetryPolicy, base: Path) -> TargetConfig:
    if not _NAME.fullmatch(name):
        raise ConfigError(section.where, "expected a name of letters, digits, _ and -")
    kind = section.choice("type", ("http", "file"))
    retry = _retry(section.section("retry"), default_retry)
    concurrency = section.integer("concurrency", 4, minimum=1, maximum=1000)
    settings: TargetSettings
    if kind == "http":
        settings = _http_target(section)
    else:
        settings = FileTarget(path=section.path("path", base))
    section.done()
    return TargetConfig(name=name, retry=retry, settings=settings, concurrency=concurrency)


def _http_target(section: Section) -> HttpTarget:
    url = section.string("url")
    try:
        parsed = yarl.URL(url)
    except (ValueError, TypeError):
        parsed = None
    if parsed is None or parsed.scheme not in ("http", "https") or not parsed.host:
        raise section.error("url", "an http:// or https:// URL", url)
    method = section.string("method", "POST").upper()
    if method not in _HTTP_METHODS:
        raise section.error("method", "one of " + ", ".join(_HTTP_METHODS), method)
    headers = section.string_map("headers", {})
    return HttpTarget(url=url, method=method, headers=MappingProxyType(headers))


def _route(
    name: str, section: Section, targets: Mapping[str, TargetConfig], server: ServerConfig
) -> RouteConfig:
    if not _NAME.fullmatch(name):
        raise ConfigError(section.where, "expected a name of letters, digits, _ and -")
    path = section.string("path")
    if not path.startswith("/"):
        raise section.error("path", 'a path starting with "/"', path)
    raw_targets = section.take("targets")
    if not isinstance(raw_targets, list) or not raw_targets:
        raise section.error("targets", "a non-empty list of target names", raw_targets)
    route_targets = tuple(
        _route_target(section, f"targets[{index}]", item, targets)
        for index, item in enumerate(raw_targets)
    )
    seen: set[str] = set()
    for index, route_target in enumerate(route_targets):
        if route_target.target in seen:
            raise ConfigError(
                section.key(f"targets[{index}]"), f'target "{route_target.target}" is listed twice'
            )
        seen.add(route_target.target)
    key_source = section.string("idempotency_key", None)
    route = RouteConfig(
        name=name,
        path=path,
        targets=route_targets,
        idempotency_key=_template(section, "idempotency_key", key_source),
        require_idempotency_key=section.boolean("require_idempotency_key", False),
        max_body_size=section.size("max_body_size", server.max_body_size),
        dedup_window=section.duration("dedup_window", None),
    )
    section.done()
    return route


def _route_target(
    route: Section, where: str, item: object, targets: Mapping[str, TargetConfig]
) -> RouteTarget:
    if isinstance(item, str):
        table = Section({"target": item}, route.key(where))
    elif isinstance(item, dict):
        table = Section(item, route.key(where))
    else:
        raise route.error(where, 'a target name or a table like { target = "crm" }', item)
    name = table.string("target")
    if name not in targets:
        known = ", ".join(sorted(targets)) or "none"
        key = table.key("target") if isinstance(item, dict) else table.where
        raise ConfigError(key, f'unknown target "{name}" (configured: {known})')
    # A route-level override starts from the target's own schedule.
    policy = _retry(table.section("retry"), targets[name].retry)
    when_source = table.string("when", None)
    when = _expression(table, "when", when_source)
    table.done()
    return RouteTarget(target=name, retry=policy, when=when)


def _template(section: Section, name: str, source: str | None) -> Template | None:
    if source is None:
        return None
    try:
        return compile_template(source)
    except ValueError as error:
        raise ConfigError(section.key(name), str(error)) from None


def _expression(section: Section, name: str, source: str | None) -> Template | None:
    if source is None:
        return None
    try:
        return compile_expression(source)
    except ValueError as error:
        raise ConfigError(section.key(name), f"{error} in {describe(source)}") from None
