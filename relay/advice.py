"""Risky but valid setups, for `relay check` to warn about."""

from __future__ import annotations

import stat
import tomllib

from relay.config import (
    CdekSource,
    Config,
    GenericSource,
    RouteConfig,
    StandardWebhooksSource,
    TbankSource,
    TildaSource,
)
from relay.retry import schedule
from relay.units import format_duration

# How long senders keep retrying on their own (from their documentation).
# relay answers 200 at once, so the sender stops: relay should then keep
# trying at least as long as the sender would have.
SENDER_RETRY_WINDOWS: dict[type, tuple[str, float]] = {
    TbankSource: ("T-Bank", 30 * 86400.0),
    StandardWebhooksSource: ("a Standard Webhooks sender", 27 * 3600.0),
}


def warnings(config: Config) -> list[str]:
    found = []
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
    found += _readable_secrets(config)
    return found


# Keys whose values are credentials, per table: written as ${VAR} or
# ${file:NAME}, they stay out of a file every user may read.
_SECRET_KEYS = {
    "admin": ("token",),
    "targets": ("password", "bot_token", "sign"),
    "routes": ("api_key", "password", "secret", "secret_token", "token"),
}


def _readable_secrets(config: Config) -> list[str]:
    """Secrets written into a config file that every user can read.

    The service's dynamic user reads relay.toml only because it is world-
    readable (`relay init` writes it 644): so it must name its secrets, not
    hold them."""
    path = config.source
    if path is None:
        return []
    try:
        if not path.stat().st_mode & stat.S_IROTH:
            return []
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
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
            values = value if isinstance(value, list) else [value]
            if any(isinstance(v, str) and v and "${" not in v for v in values):
                found.append(
                    f"{where}.{key}: a secret written in {path}, which every user of this"
                    " machine can read: write ${VAR} (set in relay.env) or ${file:NAME} instead"
                )
    return found


def _route_warnings(route: RouteConfig, config: Config) -> list[str]:
    found = []
    source = route.source
    where = f"routes.{route.name}"
    if isinstance(source, GenericSource) and not source.tokens and not route.allow_ips:
        found.append(
            f"{where}: anyone can post to it (no token, no signature, no allow_ips);"
            " set a source profile or a token"
        )
    elif isinstance(source, TildaSource) and not source.api_keys and not route.allow_ips:
        found.append(f"{where}: Tilda route without api_key: anyone can post a form to it")
    elif isinstance(source, CdekSource) and not route.allow_ips:
        found.append(
            f"{where}: CDEK does not sign its webhooks: keep a secret in the path and set"
            " allow_ips to CDEK's addresses"
        )
    window = SENDER_RETRY_WINDOWS.get(type(source))
    if window is not None:
        sender, seconds = window
        for route_target in route.targets:
            policy = route_target.retry
            cycle = sum(schedule(policy)) if policy.retry_on_error else 0.0
            if cycle < seconds:
                found.append(
                    f"{where}: target {route_target.target} gives up after"
                    f" {format_duration(cycle)}, while {sender} would have kept trying for"
                    f" {format_duration(seconds)}: consider a longer schedule (more retries,"
                    " or delays up to 24h)"
                )
    return found
