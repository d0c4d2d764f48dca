"""`relay migrate-store --to URL`: move a SQLite install to PostgreSQL."""

from __future__ import annotations

import argparse

from relay.cli.common import (
    CommandError,
    add_config_option,
    add_json_option,
    emit,
    read_database_command_config,
    run,
)
from relay.core.pgurl import masked_url, url_problem, url_to_write
from relay.store.backends import lock_path
from relay.store.lock import AlreadyRunning, ProcessLock


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "migrate-store",
        help="copy the SQLite database into an empty PostgreSQL one (relay serve stopped)",
    )
    add_config_option(parser)
    add_json_option(parser)
    parser.add_argument(
        "--to",
        metavar="URL",
        required=True,
        help='the PostgreSQL database, e.g. "postgresql://relay@db.internal/relay"',
    )
    parser.set_defaults(handler=migrate_store)


def migrate_store(args: argparse.Namespace) -> int:
    config = read_database_command_config(args)
    if config.storage.url is not None:
        raise CommandError("this config already uses PostgreSQL (storage.url): nothing to copy")
    url: str = args.to
    if not url.startswith(("postgresql://", "postgres://")):
        raise CommandError(
            f'--to: expected a URL like "postgresql://relay@db/relay", got {masked_url(url)!r}'
        )
    if problem := url_problem(url):
        raise CommandError(f"--to: {problem}")
    path = config.storage.path
    # The daemon's own lock: while relay serve runs, events would keep coming
    # into the file after the copy, and be lost to the new database.
    lock = ProcessLock(lock_path(path))
    try:
        lock.acquire()
    except AlreadyRunning:
        raise CommandError(
            f"relay serve is running on {path}: stop it first (systemctl stop relay),"
            " so that nothing arrives after the copy"
        ) from None
    # asyncpg: imported by the command that copies, not by every `relay` command.
    from relay.store.postgres.copy import copy_into, open_source

    try:
        source = open_source(path)
        try:
            copied = run(copy_into(source, url))
        finally:
            source.close()
    finally:
        lock.release()
    counts = ", ".join(f"{count} {table}" for table, count in copied.counts.items())
    emit(
        args,
        {"copied": str(path), "counts": dict(copied.counts), "url": url_to_write(url)},
        lambda _: (
            f"copied {path} into PostgreSQL, counts verified: {counts}\n"
            f'next: in the config, [storage] url = "{url_to_write(url)}" (the password from'
            " relay's environment, or ${file:NAME}), without path and synchronous;"
            " then start relay serve"
        ),
    )
    return 0
