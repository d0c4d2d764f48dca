"""From a TOML file (and an environment) to a `Config`, or one `ConfigError`."""

from __future__ import annotations

import dataclasses
import math
import re
import tomllib
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from relay.config.files import folder_problem, read_token_file
from relay.config.model import (
    AdminConfig,
    AlertsConfig,
    Config,
    Listen,
    LogConfig,
    Rate,
    RetryPolicy,
    RouteConfig,
    RouteTarget,
    ServerConfig,
    StorageConfig,
    TargetConfig,
)
from relay.config.policy import parse_retry
from relay.config.reader import ConfigError, Section, substitute
from relay.config.shared import parse_answer, parse_networks
from relay.core.localtime import UnknownZone, zone_named
from relay.core.payload import REQUEST_VARIABLES
from relay.core.pgurl import masked_url, url_problem
from relay.core.secrets import Masker, userinfo_secrets
from relay.loader.registry import source_kinds, target_kinds
from relay.loader.targets import NAME, parse_target


def load_config(path: Path, environ: Mapping[str, str], *, command: bool = False) -> Config:
    """Read and check the file at `path`; `environ` resolves ${VAR} references.

    A `command` (`relay resend`, `render`) neither listens nor leases: the
    listeners' addresses and the instance's name are serve's alone, and one
    relay.toml on several hosts takes them from each host's environment
    (`${RELAY_LISTEN}`, `${RELAY_INSTANCE}`), which a shell need not have."""
    data = read_toml(path)
    if command:
        data = _without_serve_only(data)
    return parse_config(data, environ, base=path.resolve().parent, source=path.resolve())


# The keys only `relay serve` uses: where it listens, its name in the cluster.
SERVE_ONLY = (("server", "listen"), ("admin", "listen"), ("storage", "instance_id"))


def _without_serve_only(data: dict[str, Any]) -> dict[str, Any]:
    data = dict(data)
    for section, key in SERVE_ONLY:
        table = data.get(section)
        if isinstance(table, dict) and key in table:
            data[section] = {k: v for k, v in table.items() if k != key}
    return data


# Far deeper than any relay config (routes.x.targets[0].retry is four levels), far
# shallower than the recursion that parsing, substituting and checking would need.
MAX_DEPTH = 32


def read_toml(path: Path) -> dict[str, Any]:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError("", f"{path}: no such file") from None
    except OSError as error:
        raise ConfigError("", f"{path}: cannot read: {error.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw[: error.start].count(b"\n") + 1
        raise ConfigError(
            "",
            f"{path}: line {line}: byte 0x{raw[error.start]:02x} is not UTF-8;"
            " save the file as UTF-8",
        ) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError("", f"{path}: invalid TOML: {error}") from None
    except RecursionError:
        data = None
    if data is None or _too_deep(data):
        raise ConfigError("", f"{path}: values nested more than {MAX_DEPTH} levels deep")
    return data


def _too_deep(data: object) -> bool:
    """Walked without recursion: the check itself must not overflow the stack."""
    stack: list[tuple[object, int]] = [(data, 0)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            return True
        if isinstance(value, dict):
            stack.extend((item, depth + 1) for item in value.values())
        elif isinstance(value, list):
            stack.extend((item, depth + 1) for item in value)
    return False


# What the outbound client reads for a proxy (relay.targets.outbound.client.environment_proxy).
PROXY_VARIABLES = ("https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY")


def parse_config(
    data: Mapping[str, Any],
    environ: Mapping[str, str],
    *,
    base: Path,
    source: Path | None = None,
    asked_keys: set[str] | None = None,
) -> Config:
    """The config in `data`; `asked_keys`, when given, gets every key read."""
    secrets: set[str] = set()
    substituted = substitute(dict(data), environ, "", secrets)
    # The proxies relay's environment names (HTTPS_PROXY, HTTP_PROXY): their
    # credentials go out with every request through them.
    for name in PROXY_VARIABLES:
        proxy = environ.get(name, "")
        # "user:password@proxy.corp:3128" without a scheme, as curl takes it.
        secrets.update(userinfo_secrets(proxy if "://" in proxy else f"http://{proxy}"))
    try:
        return _parse_config(substituted, secrets, base, source, asked_keys)
    except ConfigError as error:
        raise masked_error(error, secrets) from None


def masked_error(error: ConfigError, secrets: set[str]) -> ConfigError:
    """`error` as it may be shown: it quotes the value it refused, which may
    hold what a ${...} reference put there (a token in a URL), masked as logs are."""
    problem = Masker(secrets).secrets_only(error.problem)
    return error if problem == error.problem else ConfigError(error.key, problem)


def _parse_config(
    substituted: dict[str, Any],
    secrets: set[str],
    base: Path,
    source: Path | None,
    asked_keys: set[str] | None,
) -> Config:
    root = Section(substituted, "", recorder=asked_keys)
    server = _server(root.section("server"))
    storage = parse_storage(root.section("storage"), base)
    admin = _admin(root.section("admin"), base)
    log = _log(root.section("log"))
    default_retry = parse_retry(root.section("retry"), RetryPolicy())
    listening = (server.listen, admin.listen) if admin.enabled else (server.listen,)
    targets = {
        name: _told(parse_target(name, section, default_retry, base), listening)
        for name, section in root.subsections("targets").items()
    }
    _check_rate_groups(targets)
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
    # Credentials are masked wherever they show, even when written in the file itself.
    secrets |= _credentials(admin, targets)
    for route in routes.values():
        secrets.update(source_kinds()[route.source_kind].secrets(route.source))
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


def _told(target: TargetConfig, listening: tuple[Listen, ...]) -> TargetConfig:
    """`target` with its settings told where relay itself listens (TargetKind.own_listeners)."""
    told = target_kinds()[target.type].own_listeners(target.settings, listening)
    return target if told is target.settings else dataclasses.replace(target, settings=told)


def _credentials(admin: AdminConfig, targets: Mapping[str, TargetConfig]) -> set[str]:
    found = {admin.token} if admin.token else set()
    for target in targets.values():
        found.update(target_kinds()[target.type].secrets(target.settings))
    return found


def _server(section: Section) -> ServerConfig:
    defaults = ServerConfig()
    server = ServerConfig(
        listen=_listen(section, "listen", defaults.listen),
        max_body_size=section.size("max_body_size", defaults.max_body_size),
        shutdown_timeout=section.duration("shutdown_timeout", defaults.shutdown_timeout),
        trusted_proxies=parse_networks(section, "trusted_proxies"),
        read_timeout=section.duration("read_timeout", defaults.read_timeout),
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


def parse_storage(section: Section, base: Path) -> StorageConfig:
    defaults = StorageConfig()
    storage = StorageConfig(
        path=section.path("path", base, base / defaults.path),
        synchronous=section.choice("synchronous", ("full", "normal"), defaults.synchronous),
        busy_timeout=section.duration("busy_timeout", defaults.busy_timeout),
        retention=section.duration("retention", defaults.retention),
        url=section.string("url", None),
        instance_id=section.string("instance_id", None),
        dead_after=section.duration("dead_after", defaults.dead_after),
        # Two at least: a commit in progress holds one while a claim needs another.
        pool_size=section.integer("pool_size", defaults.pool_size, minimum=2, maximum=1000),
    )
    if storage.url is not None and not storage.url.startswith(("postgresql://", "postgres://")):
        raise ConfigError(
            section.key("url"),
            f'expected a URL like "postgresql://relay@db/relay", got {masked_url(storage.url)!r}',
        )
    if storage.url is not None and (problem := url_problem(storage.url)):
        raise ConfigError(section.key("url"), problem)
    _cluster_keys(section, storage, defaults)
    section.done()
    return storage


def _cluster_keys(section: Section, storage: StorageConfig, defaults: StorageConfig) -> None:
    """instance_id, dead_after, pool_size: what instances sharing PostgreSQL need."""
    instance_id = storage.instance_id
    if instance_id is not None and not re.fullmatch(r"[\w.:@-]{1,100}", instance_id):
        raise ConfigError(
            section.key("instance_id"),
            "expected up to 100 letters, digits and . _ - : @ (a name unique in the"
            f" cluster, like the host's), got {instance_id!r}",
        )
    if storage.dead_after < MIN_DEAD_AFTER:
        raise ConfigError(
            section.key("dead_after"),
            f"expected {MIN_DEAD_AFTER:g}s or more (instances speak to the database"
            f" several times within it), got {storage.dead_after:g}s",
        )
    if storage.url is None:
        for name, value, default in (
            ("instance_id", instance_id, None),
            ("dead_after", storage.dead_after, defaults.dead_after),
            ("pool_size", storage.pool_size, defaults.pool_size),
        ):
            if value != default:
                raise ConfigError(
                    section.key(name),
                    "applies to PostgreSQL only (set storage.url); one SQLite process needs none",
                )


# Heartbeats come every dead_after / 5, leadership checks every dead_after / 4
# at most: below 2 s a busy second would pass for a dead instance.
MIN_DEAD_AFTER = 2.0


def _admin(section: Section, base: Path) -> AdminConfig:
    defaults = AdminConfig()
    enabled = section.boolean("enabled", defaults.enabled)
    listen = _listen(section, "listen", defaults.listen)
    token = section.string("token", None, nonempty=False) or None
    token_file = section.path("token_file", base, None)
    token_key = section.key("token")
    if token_file is not None:
        token_key = section.key("token_file")
        if token is not None:
            raise ConfigError(token_key, "set admin.token or admin.token_file, not both")
        try:
            token = read_token_file(token_file)
        except ValueError as unreadable:
            raise ConfigError(token_key, str(unreadable)) from None
        if token is None and (unwritable := folder_problem(token_file)):
            raise ConfigError(token_key, unwritable)
    # A token file not written yet gets its token when relay starts.
    if enabled and token is None and token_file is None and not listen.is_loopback:
        raise ConfigError(
            section.key("token"),
            f"is required when the admin listener ({listen}) is not on loopback",
        )
    if token is not None and len(token) < 16:
        raise ConfigError(token_key, "expected at least 16 characters")
    if token is not None and token_bits(token) < MIN_TOKEN_BITS:
        # Never echo the value: it is a credential.
        raise ConfigError(
            token_key,
            "too easy to guess (repeated or too few different characters); use a random"
            " one: python3 -c 'import secrets; print(secrets.token_urlsafe(32))'",
        )
    allowed_hosts = frozenset(
        name.strip().lower().rstrip(".") for name in section.string_list("allowed_hosts", ())
    )
    timezone = parse_timezone(section)
    section.done()
    return AdminConfig(
        enabled=enabled,
        listen=listen,
        token=token,
        allowed_hosts=allowed_hosts,
        token_file=token_file,
        timezone=timezone,
    )


def parse_timezone(section: Section) -> str | None:
    """admin.timezone: an IANA name the tz database knows, or absent (the system's)."""
    name = section.string("timezone", None, nonempty=False) or None
    try:
        zone_named(name)
    except UnknownZone as problem:
        raise ConfigError(section.key("timezone"), str(problem)) from None
    return name


# Length is not entropy: "aaaaaaaaaaaaaaaa" is 16 characters and 0 bits. A
# token's characters, counted, give an upper bound of what a guesser must try.
MIN_TOKEN_BITS = 64


def token_bits(token: str) -> float:
    """Shannon's estimate of the token's entropy from its own character counts."""
    counts = Counter(token)
    return -sum(n * math.log2(n / len(token)) for n in counts.values())


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
        delivery_failing_after=section.integer(
            "delivery_failing_after", defaults.delivery_failing_after, minimum=1
        ),
        group_window=section.duration("group_window", defaults.group_window),
        silence_factor=section.number("silence_factor", defaults.silence_factor, minimum=1),
    )
    section.done()
    return alerts


def _check_rate_groups(targets: Mapping[str, TargetConfig]) -> None:
    """Targets of one rate_group share one pacer: they must agree on its rate."""
    seen: dict[str, tuple[str, Rate]] = {}
    for target in targets.values():
        for group, rate in target.shared_rates:
            if not group.startswith("group-"):
                continue
            first = seen.setdefault(group, (target.name, rate))
            if first[1] != rate:
                raise ConfigError(
                    f"targets.{target.name}.rate",
                    f'rate_group "{group.removeprefix("group-")}" is paced at {first[1]}'
                    f" by targets.{first[0]}; give every target of the group one rate",
                )


def _route(
    name: str, section: Section, targets: Mapping[str, TargetConfig], server: ServerConfig
) -> RouteConfig:
    if not NAME.fullmatch(name):
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
    source_kind = source_kinds()[section.choice("source", source_kinds(), "generic")]
    source = source_kind.parse(section)
    dedup_window = section.duration("dedup_window", None)
    floor = source_kind.dedup_window
    if floor is not None and (dedup_window is None or dedup_window < floor):
        dedup_window = floor
    route = RouteConfig(
        name=name,
        path=path,
        targets=route_targets,
        idempotency_key=section.template("idempotency_key", None, offers=REQUEST_VARIABLES),
        require_idempotency_key=section.boolean("require_idempotency_key", False),
        max_body_size=section.size("max_body_size", server.max_body_size),
        dedup_window=dedup_window,
        source=source,
        source_kind=source_kind.name,
        allow_ips=parse_networks(section, "allow_ips"),
        response=parse_answer(section, "response"),
        key_conflict="reject"
        if section.choice("key_conflict", ("store", "reject"), "store") == "reject"
        else "store",
        strip_fields=tuple(section.string_list("strip_fields", [])),
        silent_after=_silent_after(section),
    )
    section.done()
    return route


def _silent_after(section: Section) -> float | None:
    """A route's `silent_after`: a duration, or "never" (not watched at all)."""
    value = section.take("silent_after", None)
    if value is None:
        return None
    if value == "never":
        return math.inf
    try:
        return section.parse_duration_value("silent_after", value)
    except ConfigError:
        raise section.error(
            "silent_after", 'a duration like "2h" or "1d", or "never"', value
        ) from None


def _route_target(
    route: Section, where: str, item: object, targets: Mapping[str, TargetConfig]
) -> RouteTarget:
    if isinstance(item, str):
        table = route.nested({"target": item}, route.key(where))
    elif isinstance(item, dict):
        table = route.nested(item, route.key(where))
    else:
        raise route.error(where, 'a target name or a table like { target = "crm" }', item)
    name = table.string("target")
    if name not in targets:
        known = ", ".join(sorted(targets)) or "none"
        key = table.key("target") if isinstance(item, dict) else table.where
        raise ConfigError(key, f'unknown target "{name}" (configured: {known})')
    # A route-level override starts from the target's own schedule.
    policy = parse_retry(table.section("retry"), targets[name].retry)
    # Decided before the event is stored: no `event` to read yet.
    when = table.expression("when", None, offers=REQUEST_VARIABLES)
    order_by = table.template("order_by", None, offers=REQUEST_VARIABLES)
    table.done()
    return RouteTarget(target=name, retry=policy, when=when, order_by=order_by)
