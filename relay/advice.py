"""Risky but valid setups, for `relay check` to warn about."""

from __future__ import annotations

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
