"""`relay check`: validate the config and show what it means (routes, targets, schedules)."""

from __future__ import annotations

import argparse
import asyncio
import re
from pathlib import Path

from relay.cli.common import add_config_option, add_service_environment_options, read_config
from relay.config import Config, TargetConfig
from relay.envfile import parse_env_file
from relay.kinds.registry import target_kind
from relay.retry import describe_schedule
from relay.secrets import Masker
from relay.units import format_size


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser("check", help="check the config and print what it sets up")
    add_config_option(parser)
    add_service_environment_options(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    # advice reads the whole config model with its targets (aiohttp's client):
    # imported by the command that uses it, not by every `relay` command.
    from relay.advice import warnings

    config = read_config(args)
    print(describe(config))
    found = [*warnings(config), *database_warnings(config), *env_file_warnings(args.env_file)]
    for warning in found:
        print(f"warning: {warning}")
    return 0


def env_file_warnings(path: Path | None) -> list[str]:
    """What a shell and systemd read differently in an environment file:
    systemd keeps a comment after a value as part of the value."""
    if path is None:
        return []
    found = []
    for name, value in parse_env_file(path.read_text(encoding="utf-8")).items():
        if re.search(r"\s[#;]", value):
            found.append(
                f"{path}: {name}'s value has a comment after it, which systemd keeps as part"
                " of the value: put comments on lines of their own"
            )
    return found


def database_warnings(config: Config) -> list[str]:
    """What the PostgreSQL server says that breaks relay's promise (or that it
    cannot be reached); nothing for SQLite, whose settings relay sets itself."""
    if config.storage.url is None:
        return []
    masker = config.masker
    try:
        settings = asyncio.run(_server_settings(config.storage.url))
    except Exception as error:
        return [masker.text(f"cannot reach {config.storage.describe()}: {error}")]
    return durability_warnings(settings)


def durability_warnings(settings: dict[str, str]) -> list[str]:
    found = []
    if settings.get("fsync") == "off":
        found.append(
            "the PostgreSQL server runs with fsync = off: a power cut can lose events"
            " relay acknowledged (set fsync = on)"
        )
    if settings.get("synchronous_commit") == "off":
        found.append(
            "the PostgreSQL server runs with synchronous_commit = off: a commit is"
            " answered before it is on disk (relay turns it on for its own sessions;"
            " set it for relay's role all the same: ALTER ROLE relay SET synchronous_commit = on)"
        )
    return found


async def _server_settings(url: str) -> dict[str, str]:
    import asyncpg  # only a PostgreSQL config needs the driver

    connection = await asyncpg.connect(url, timeout=5)
    try:
        rows = await connection.fetch(
            "SELECT name, setting FROM pg_settings WHERE name IN ('fsync', 'synchronous_commit')"
        )
        return {row[0]: row[1] for row in rows}
    finally:
        await connection.close()


def where(target: TargetConfig, masker: Masker) -> str:
    return target_kind(target.type).describe(target.settings, masker)


def describe(config: Config) -> str:
    masker = config.masker
    server, storage = config.server, config.storage
    lines = [
        f"config OK: {config.source}",
        f"ingress: {server.listen} (max body {format_size(server.max_body_size)})",
        f"storage: {storage.path} (synchronous = {storage.synchronous})"
        if storage.url is None
        else f"storage: PostgreSQL {masker.text(storage.describe())}",
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
