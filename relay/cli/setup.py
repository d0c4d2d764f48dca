"""`relay init` (a starter config) and `relay backup` (a consistent copy of the database)."""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import stat
from importlib import resources
from pathlib import Path

from relay.cli.common import (
    SERVICE_CREDENTIALS,
    SERVICE_ENV_FILE,
    CommandError,
    add_config_option,
    add_json_option,
    emit,
    opened_store,
    read_database_command_config,
    run,
)
from relay.core.units import format_size


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    init = commands.add_parser(
        "init", help="write a commented starter config: a Tilda form to a CRM, Telegram and mail"
    )
    init.add_argument(
        "path",
        metavar="PATH",
        nargs="?",
        default=Path("relay.toml"),
        type=Path,
        help="where to write it (default: ./relay.toml; for the service: /etc/relay/relay.toml)",
    )
    init.add_argument("--force", action="store_true", help="overwrite an existing file")
    add_json_option(init)
    init.add_argument(
        "--database",
        metavar="DB",
        help='storage.path to write (default: "relay.db", beside the config;'
        " for the service: /var/lib/relay/relay.db)",
    )
    init.set_defaults(handler=write_starter)

    backup = commands.add_parser(
        "backup", help="a consistent copy of the database, safe while relay runs"
    )
    add_config_option(backup)
    add_json_option(backup)
    backup.add_argument("destination", metavar="DEST", type=Path)
    backup.add_argument("--force", action="store_true", help="overwrite an existing file")
    backup.set_defaults(handler=make_backup)


# The service runs as a dynamic user that exists only while it runs: nothing
# can give it the file beforehand, so the file is readable by everyone. It
# holds no secret: those come from ${VARS} (EnvironmentFile=, read by systemd
# as root) or ${file:NAME} (LoadCredential=, handed to the service alone).
CONFIG_MODE = 0o644


_STORAGE_PATH = re.compile(r'^path = "relay\.db"', re.MULTILINE)


def starter_config(database: str | None = None) -> str:
    text = resources.files("relay").joinpath("starter.toml").read_text(encoding="utf-8")
    if database is not None:
        text, count = _STORAGE_PATH.subn(lambda _: f"path = {json.dumps(database)}", text, 1)
        assert count == 1, "the starter config lost its storage.path line"
    return text


def write_starter(args: argparse.Namespace) -> int:
    path: Path = args.path
    if path.exists() and not args.force:
        raise CommandError(f"{path} exists (use --force to overwrite it)")
    _make_folders(path.parent)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, CONFIG_MODE)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        os.fchmod(descriptor, CONFIG_MODE)  # an existing file (--force) keeps no other mode
        handle.write(starter_config(args.database))
    token_path, fresh = _admin_token(path.parent / SERVICE_CREDENTIALS)
    env_file = path.parent / SERVICE_ENV_FILE
    found_alone = path.resolve() == Path("/etc/relay/relay.toml")
    check = f"sudo relay check{'' if found_alone else f' --config {path}'}"
    emit(
        args,
        {
            "config": str(path),
            "admin_token_file": str(token_path),
            "admin_token_written": fresh,
            "env_file": str(env_file),
            "next": check,
        },
        lambda _: "\n".join(
            [
                f"wrote {path} (mode {CONFIG_MODE:o}: it holds no secrets,"
                " they come from ${VARS})",
                f"{'wrote' if fresh else 'kept'} the admin token in {token_path} (mode 600;"
                f" the dashboard's password, the API's bearer token): sudo cat {token_path}",
                f"next: set the variables it names (see the top of the file) in {env_file}, then:",
                f"  {check}",
            ]
        ),
    )
    return 0


ADMIN_TOKEN = "relay_admin_token"


def _admin_token(folder: Path) -> tuple[Path, bool]:
    """The starter's admin token, one file (`${file:relay_admin_token}`), drawn
    here so that nobody has to invent one or leave the admin API open. An
    existing one is kept (`init --force` rewrites the config, not the
    password people sign in with)."""
    path = folder / ADMIN_TOKEN
    if not folder.exists():
        folder.mkdir(mode=0o700)
        folder.chmod(0o700)  # whatever the umask: root's alone, systemd copies from it
    if path.exists():
        return path, False
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        os.fchmod(descriptor, 0o600)
        handle.write(secrets.token_urlsafe(32) + "\n")
    return path, True


def _make_folders(folder: Path) -> None:
    """Create the folders on the way, each 755 whatever the umask (sudo with
    umask 077 would make /etc/relay a folder the service cannot enter)."""
    missing = []
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    for created in reversed(missing):
        created.mkdir(exist_ok=True)
        created.chmod(0o755)


def make_backup(args: argparse.Namespace) -> int:
    config = read_database_command_config(args)
    destination: Path = args.destination
    if destination.exists() and not args.force:
        raise CommandError(f"{destination} exists (use --force to overwrite it)")
    if destination.resolve() == config.storage.path.resolve():
        raise CommandError("the destination is the database itself")

    async def act() -> int:
        async with opened_store(config) as store:
            return await store.backup(destination)

    events = run(act())
    size = destination.stat().st_size
    mode = stat.S_IMODE(destination.stat().st_mode)
    emit(
        args,
        {
            "database": str(config.storage.path),
            "destination": str(destination),
            "events": events,
            "bytes": size,
            "mode": f"{mode:o}",
        },
        lambda _: (
            f"backed up {config.storage.path} to {destination}: {events} events,"
            f" {format_size(size) if size % 1024 == 0 else f'{size} bytes'},"
            f" mode {mode:o} (it holds what senders sent)"
        ),
    )
    return 0
