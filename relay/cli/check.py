"""`relay check`: validate the config and show what it means (routes, targets, schedules)."""

from __future__ import annotations

import argparse

from relay.cli.common import add_config_option, read_config
from relay.config import Config, FileTarget, HttpTarget, RetryPolicy
from relay.retry import schedule
from relay.secrets import Masker
from relay.units import format_duration, format_size


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser("check", help="check the config and print what it sets up")
    add_config_option(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    config = read_config(args)
    print(describe(config))
    return 0


def describe_schedule(policy: RetryPolicy) -> str:
    if not policy.retry_on_error or policy.retries == 0:
        return "no retries: the first failure is final"
    delays = schedule(policy)
    if len(delays) == 1:
        span = format_duration(delays[0])
    else:
        span = f"{format_duration(delays[0])} … {format_duration(delays[-1])}"
    extras = [f"timeout {format_duration(policy.timeout)}"]
    if policy.jitter:
        extras.append(f"jitter ±{policy.jitter * 100:g}%")
    return (
        f"{policy.retries} retries, {span}, cycle {format_duration(sum(delays))}"
        f" ({', '.join(extras)})\n"
        f"      delays: {' '.join(format_duration(d) for d in delays)}"
    )


def describe(config: Config) -> str:
    masker = Masker(config.secrets)
    server, storage = config.server, config.storage
    lines = [
        f"config OK: {config.source}",
        f"ingress: {server.listen} (max body {format_size(server.max_body_size)})",
        f"storage: {storage.path} (synchronous = {storage.synchronous})",
    ]
    for route in config.routes.values():
        lines.append(f"route {route.name}: POST {masker.text(route.path)}")
        for route_target in route.targets:
            target = config.targets[route_target.target]
            settings = target.settings
            if isinstance(settings, HttpTarget):
                where = f"{settings.method} {masker.text(settings.url)}"
            elif isinstance(settings, FileTarget):
                where = str(settings.path)
            else:  # pragma: no cover - every type is listed above
                where = ""
            condition = f" when {route_target.when.source}" if route_target.when else ""
            lines.append(f"  → {target.name} ({target.type} {where}){condition}")
            lines.append(f"      {describe_schedule(route_target.retry)}")
    unused = set(config.targets) - {t.target for r in config.routes.values() for t in r.targets}
    for name in sorted(unused):
        lines.append(f"target {name} is not used by any route")
    return "\n".join(lines)
