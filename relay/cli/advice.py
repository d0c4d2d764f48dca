"""Risky but valid setups, for `relay check` to warn about."""

from __future__ import annotations

import stat
import tomllib

from relay.config import Config, RouteConfig
from relay.core.units import format_duration
from relay.delivery.retry import covering, schedule
from relay.loader.registry import source_kind
from relay.targets.outbound.connections import Outbound

NO_ROUTES = "routes: none: every webhook gets 404 (a running relay refuses to reload to this)"


def warnings(config: Config) -> list[str]:
    found = []
    if not config.routes:
        found.append(NO_ROUTES)
    admin = config.admin
    if admin.enabled and not admin.listen.is_loopback:
        found.append(
            f"admin.listen: the admin API listens on {admin.listen}, beyond this machine;"
            " keep it on loopback and reach it through an SSH tunnel"
        )
    if admin.enabled and admin.token is None and admin.token_file is None:
        found.append("admin.token: not set: anyone with a shell on this machine can use the API")
    for route in config.routes.values():
        found += _route_warnings(route, config)
    for target in config.targets.values():
        outbound = getattr(target.settings, "outbound", None)
        if isinstance(outbound, Outbound) and not outbound.tls_verify:
            found.append(
                f"targets.{target.name}.tls_verify: FALSE: any certificate is taken and its"
                " name not checked, so whoever sits between relay and the target can read and"
                " change every delivery and its credentials; trust the target's CA with"
                " ca_file instead"
            )
        if isinstance(outbound, Outbound):
            found += _readable_key(target.name, outbound)
    written = _as_written(config)
    if written is not None:
        found += _readable_secrets(config, written)
        found += _sqlite_keys_beside_a_url(config, written)
    return found


def _readable_key(target: str, outbound: Outbound) -> list[str]:
    """A client certificate's private key is a credential: one any user of
    the machine may read lets them pose as relay to the target."""
    key, name = outbound.client_key, "client_key"
    if key is None and outbound.client_cert is not None:
        key, name = outbound.client_cert, "client_cert"  # the key in the same file
    if key is None:
        return []
    try:
        mode = stat.S_IMODE(key.stat().st_mode)
    except OSError:
        return []
    if not mode & (stat.S_IRGRP | stat.S_IROTH):
        return []
    return [
        f"targets.{target}.{name}: {key} holds a private key and is mode {mode:o}, readable"
        f" by other users of this machine: chmod 600 {key} (owned by the service's user)"
    ]


def _as_written(config: Config) -> dict[str, object] | None:
    """The config file's tables as written (before ${...} is substituted), read once."""
    if config.source is None:
        return None
    try:
        return tomllib.loads(config.source.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None


def _sqlite_keys_beside_a_url(config: Config, data: dict[str, object]) -> list[str]:
    """SQLite's settings left in [storage] once `url` is set (a moved install):
    valid, and doing nothing, which a reader of the file cannot tell."""
    if config.storage.url is None:
        return []
    storage = data.get("storage")
    if not isinstance(storage, dict):
        return []
    return [
        f"storage.{key}: not used with storage.url (PostgreSQL holds the data): remove it"
        for key in ("path", "synchronous")
        if key in storage
    ]


# Keys whose values are credentials, per table: written as ${VAR} or
# ${file:NAME}, they stay out of a file every user may read.
_SECRET_KEYS = {
    "admin": ("token",),
    "targets": ("password", "bot_token", "sign", "proxy"),
    "routes": ("api_key", "password", "secret", "secret_token", "token"),
}


def _proxy_password(url: str) -> bool:
    """Whether "http://user:password@host" has a password written in it."""
    userinfo = url.partition("://")[2].partition("@")
    return bool(userinfo[1]) and ":" in userinfo[0] and not userinfo[0].endswith(":")


def _readable_secrets(config: Config, data: dict[str, object]) -> list[str]:
    """Secrets written into a config file that every user can read.

    The service's dynamic user reads relay.toml only because it is world-
    readable (`relay init` writes it 644): so it must name its secrets, not
    hold them."""
    path = config.source
    assert path is not None  # `data` was read from it
    try:
        if not path.stat().st_mode & stat.S_IROTH:
            return []
    except OSError:
        return []
    tables: list[tuple[str, object]] = [("admin", data.get("admin"))]
    for group in ("targets", "routes"):
        named = data.get(group)
        if isinstance(named, dict):
            tables += [(f"{group}.{name}", table) for name, table in named.items()]
    found = []
    for where, table in tables:
        if not isinstance(table, dict):
            continue
        for key in _SECRET_KEYS[where.split(".", 1)[0]]:
            value = table.get(key)
            if key == "proxy":  # a secret only for the password in it
                value = value if isinstance(value, str) and _proxy_password(value) else None
            values = value if isinstance(value, list) else [value]
            if any(isinstance(v, str) and v and "${" not in v for v in values):
                found.append(
                    f"{where}.{key}: a secret written in {path}, which every user of this"
                    " machine can read: write ${VAR} (set in relay.env) or ${file:NAME} instead"
                )
    return found


def _route_warnings(route: RouteConfig, config: Config) -> list[str]:
    kind = source_kind(route.source_kind)
    where = f"routes.{route.name}"
    found = [f"{where}: {advice}" for advice in kind.advice(route.source, route)]
    # relay answers 200 at once, so the sender stops retrying: relay should then
    # keep trying at least as long as the sender would have.
    window = kind.retry_window
    if window is not None:
        sender, seconds = window.sender, window.seconds
        for route_target in route.targets:
            policy = route_target.retry
            cycle = sum(schedule(policy)) if policy.retry_on_error else 0.0
            if cycle < seconds:
                longer = covering(policy, seconds)
                found.append(
                    f"{where}: target {route_target.target} gives up after"
                    f" {format_duration(cycle)}, while {sender} would have kept trying for"
                    f" {format_duration(seconds)}: give its entry in the route's targets"
                    f' retry = {{ max_delay = "{(longer.max_delay or 0) / 3600:g}h", retries ='
                    f" {longer.retries} }} (a cycle of {format_duration(sum(schedule(longer)))})"
                )
    return found
