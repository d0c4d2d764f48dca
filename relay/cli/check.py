"""`relay check`: validate the config and show what it means (routes, targets, schedules)."""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relay.cli.common import (
    add_config_option,
    add_json_option,
    add_service_environment_options,
    emit,
    read_config,
)
from relay.cli.envfile import parse_env_file
from relay.config import Config, TargetConfig
from relay.core.secrets import Masker
from relay.core.units import format_size
from relay.delivery.retry import describe_schedule
from relay.loader.registry import target_kind
from relay.store.lock import lock_path


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser("check", help="check the config and print what it sets up")
    add_config_option(parser)
    add_service_environment_options(parser)
    add_json_option(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    # advice reads the whole config model with its targets (aiohttp's client):
    # imported by the command that uses it, not by every `relay` command.
    from relay.cli.advice import warnings

    config = read_config(args)
    sources = [str(p) for p in (args.env_file, args.credentials) if p is not None]
    found = [
        *warnings(config),
        *database_warnings(config),
        *env_file_warnings(args.env_file),
        *readable_warnings(config.source),
        *restart_warnings(config, [p for p in (args.env_file, args.credentials) if p]),
    ]
    if args.json:
        emit(args, {**summary(config), "secrets_from": sources, "warnings": found}, str)
        return 0
    print(check_text(config))
    if sources:
        print(f"secrets read from: {', '.join(sources)} (as the unit hands them to the service)")
    for warning in found:
        print(f"warning: {warning}")
    return 0


def summary(config: Config) -> dict[str, Any]:
    """What `check_text` says, as data (`relay check --json`)."""
    masker = config.masker
    routes = []
    for route in config.routes.values():
        targets = []
        for route_target in route.targets:
            target = config.targets[route_target.target]
            targets.append(
                {
                    "target": target.name,
                    "type": target.type,
                    "where": where(target, masker),
                    "concurrency": target.concurrency,
                    "rate": str(target.rate) if target.rate is not None else None,
                    "when": route_target.when.source if route_target.when else None,
                    "schedule": describe_schedule(route_target.retry),
                }
            )
        routes.append({"name": route.name, "path": masker.text(route.path), "targets": targets})
    storage = config.storage
    return {
        "config": str(config.source),
        "ok": True,
        "ingress": str(config.server.listen),
        "storage": str(storage.path) if storage.url is None else masker.text(storage.location()),
        "routes": routes,
        "unused_targets": unused_targets(config),
    }


def readable_warnings(path: Path | None) -> list[str]:
    """The service runs as a user of its own (systemd's DynamicUser=): a
    relay.toml only root may read stops it at start ("permission denied")
    while `sudo relay check` reads it fine. Said for a file root owns that
    others may not read."""
    if path is None:
        return []
    found = []
    try:
        info = path.stat()
        if info.st_uid == 0 and not info.st_mode & stat.S_IROTH:
            found.append(
                f"{path} is mode {stat.S_IMODE(info.st_mode):o}, owned by root: the service's"
                f" user cannot read it and relay will not start; it holds no secret:"
                f" sudo chmod 644 {path}"
            )
    except OSError:
        return found
    return found


def restart_warnings(config: Config, sources: list[Path]) -> list[str]:
    """systemd reads EnvironmentFile= and LoadCredential= only when the service
    starts, not on reload: an env file or credential changed since the running
    service started is not what it uses. The running `relay serve` is the one
    holding the database's lock (relay.store.lock), which it wrote at start."""
    if config.storage.url is not None or not sources:
        return []
    lock = lock_path(config.storage.path)
    try:
        descriptor = os.open(lock, os.O_RDONLY)
    except OSError:
        return []
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            started = os.fstat(descriptor).st_mtime
            pid = os.read(descriptor, 32).decode(errors="replace").strip()
        else:
            return []  # no relay serve runs on this database
    finally:
        os.close(descriptor)
    changed = []
    for source in sources:
        files = [source] if source.is_file() else sorted(source.iterdir())
        changed += [f for f in files if f.stat().st_mtime > started]
    if not changed:
        return []
    names = ", ".join(str(f) for f in changed)
    return [
        f"{names} changed after the running relay serve (PID {pid or '?'}) started:"
        " systemd hands the service these only at start, so it still uses the old values"
        " (a reload re-reads relay.toml, not these): sudo systemctl restart relay"
    ]


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
    cannot be reached); nothing for SQLite, whose settings relay sets itself.
    Prints how many connections the cluster needs of what the server allows."""
    if config.storage.url is None:
        return []
    masker = config.masker
    try:
        settings, connections, pooled = asyncio.run(_server_facts(config))
    except Exception as error:
        return [masker.text(f"cannot reach {config.storage.location()}: {error}")]
    said, found = connection_budget(config.storage.pool_size, connections)
    print(said)
    if pooled:
        from relay.store.postgres.cluster import SESSION_POOLING_NEEDED

        found.append(f"relay serve will refuse this database: {SESSION_POOLING_NEEDED}")
    return [*durability_warnings(settings), *found]


@dataclass(frozen=True)
class ServerConnections:
    """What bounds a cluster's connections, as the server says it now."""

    max_connections: int
    reserved: int  # kept for superusers (and, from PostgreSQL 16, reserved roles)
    others: int  # open now, not relay instances' (other applications, psql, this check)
    running: int  # relay instances alive now, besides the one this config names


def connection_budget(pool_size: int, server: ServerConnections) -> tuple[str, list[str]]:
    """The cluster's connection need (each instance up to pool_size plus its
    own few) against what the server has for it: a line, and warnings."""
    from relay.store.postgres.cluster import CONNECTIONS_BESIDES_POOL

    each = pool_size + CONNECTIONS_BESIDES_POOL
    instances = server.running + 1
    need = instances * each
    room = server.max_connections - server.reserved - server.others
    said = (
        f"database connections: up to {each} an instance (pool_size {pool_size}"
        f" + {CONNECTIONS_BESIDES_POOL}); {instances} instance(s) with this one"
        f" ({server.running} running) need up to {need} of the {room} the server has for"
        f" them (max_connections {server.max_connections}, {server.reserved} reserved,"
        f" {server.others} open by other clients): room for {max(room, 0) // each} instances"
    )
    found = []
    if need > room:
        found.append(
            f"the cluster may need {need} database connections, more than the {room} the"
            " server has for it: an instance that cannot connect answers webhooks 503."
            " Raise the server's max_connections, or lower [storage] pool_size"
            " (docs/postgres.md, Sizing the database)"
        )
    return said, found


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


async def _server_facts(config: Config) -> tuple[dict[str, str], ServerConnections, bool]:
    """The server's durability settings, its connections, and whether a pooler
    in transaction mode is in between (two connections, one session)."""
    import asyncpg  # only a PostgreSQL config needs the driver

    from relay.store.postgres.cluster import SERVER_NOW, sessions_shared

    storage = config.storage
    assert storage.url is not None
    connection = await asyncpg.connect(storage.url, timeout=5)
    try:
        rows = await connection.fetch(
            "SELECT name, setting FROM pg_settings WHERE name IN ('fsync', 'synchronous_commit',"
            " 'max_connections', 'superuser_reserved_connections', 'reserved_connections')"
        )
        settings = {row[0]: row[1] for row in rows}
        others = await connection.fetchval(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE backend_type = 'client backend'"
            " AND coalesce(application_name, '') NOT LIKE 'relay/%' AND pid <> pg_backend_pid()"
        )
        running = 0
        if await connection.fetchval("SELECT to_regclass('instances') IS NOT NULL"):
            running = await connection.fetchval(
                f"SELECT COUNT(*) FROM instances WHERE alive_at >= {SERVER_NOW} - $1"
                " AND id IS DISTINCT FROM $2",
                storage.dead_after,
                storage.instance_id,
            )
        second = await asyncpg.connect(storage.url, timeout=5)
        try:
            pooled = await sessions_shared(connection, second)
        finally:
            await second.close()
    finally:
        await connection.close()
    return settings, _connections(settings, others, running), pooled


def _connections(settings: dict[str, Any], others: int, running: int) -> ServerConnections:
    reserved = sum(
        int(settings.get(name) or 0)
        for name in ("superuser_reserved_connections", "reserved_connections")
    )
    return ServerConnections(int(settings["max_connections"]), reserved, others, running)


def where(target: TargetConfig, masker: Masker) -> str:
    return target_kind(target.type).destination(target.settings, masker)


def check_text(config: Config) -> str:
    masker = config.masker
    server, storage = config.server, config.storage
    lines = [
        f"config OK: {config.source}",
        f"ingress: {server.listen} (max body {format_size(server.max_body_size)})",
        f"storage: {storage.path} (synchronous = {storage.synchronous})"
        if storage.url is None
        else f"storage: PostgreSQL {masker.text(storage.location())}",
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
    for name in unused_targets(config):
        lines.append(f"target {name} is not used by any route, nor by [alerts]")
    return "\n".join(lines)


def unused_targets(config: Config) -> list[str]:
    """Targets neither a route nor the alerts send to."""
    used = {t.target for r in config.routes.values() for t in r.targets}
    if config.alerts.target is not None:
        used.add(config.alerts.target)
    return sorted(set(config.targets) - used)
