"""`relay serve`: the daemon."""

from __future__ import annotations

import argparse
import dataclasses

from relay.cli.common import add_config_option, read_config, run
from relay.ops import logs


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser("serve", help="run relay: accept webhooks and deliver them")
    add_config_option(parser)
    parser.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        help="override [log] level",
    )
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    config = read_config(args)
    log_config = config.log
    if args.log_level:
        log_config = dataclasses.replace(log_config, level=args.log_level)
    logs.configure(log_config, config.masker)
    # The daemon's whole machinery (aiohttp.web, Jinja2) is imported
    # here, not with the CLI: the database commands start without it.
    from relay.app import serve

    return run(serve(config))
