"""`relay check`: validate the config and show what it means (routes, targets, schedules)."""

from __future__ import annotations

import argparse

from relay.advice import warnings
from relay.cli.common import add_config_option, add_service_environment_options, read_config
from relay.config import Config, FileTarget, HttpTarget, SmtpTarget, TargetConfig
from relay.retry import describe_schedule
from relay.secrets import Masker
from relay.units import format_size


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser("check", help="check the config and print what it sets up")
    add_config_option(parser)
    add_service_environment_options(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    config = read_config(args)
    print(describe(config))
    for warning in warnings(config):
        print(f"warning: {warning}")
    return 0


def where(target: TargetConfig, masker: Masker) -> str:
    settings = target.settings
    if isinstance(settings, HttpTarget):
        body = "" if settings.format == "raw" else f", {settings.format} body"
        return f"{settings.method} {masker.text(settings.url)}{body}"
    if isinstance(settings, FileTarget):
        return str(settings.path)
    if isinstance(settings, SmtpTarget):
        return f"{settings.host}:{settings.port} {settings.tls}, to {', '.join(settings.to)}"
    return f"chat {settings.chat_id}, {settings.parse_mode}"


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
            condition = f" when {route_target.when.source}" if route_target.when else ""
            limits = f"concurrency {target.concurrency}"
            if target.rate is not None:
                limits += f", rate {target.rate}"
            lines.append(
                f"  → {target.name} ({target.type} {where(target, masker)}; {limits}){condition}"
            )
            lines.append(f"      {describe_schedule(route_target.retry)}")
    unused = set(config.targets) - {t.target for r in config.routes.values() for t in r.targets}
    for name in sorted(unused):
        lines.append(f"target {name} is not used by any route")
    return "\n".join(lines)
