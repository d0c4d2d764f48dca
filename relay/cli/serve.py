"""`relay serve`: the daemon."""

from __future__ import annotations

import argparse

from relay import logs
from relay.app import serve
from relay.cli.common import add_config_option, read_config, run
from relay.secrets import Masker


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser("serve", help="run relay: accept webhooks and deliver them")
    add_config_option(parser)
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning"])
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    config = read_config(args)
    logs.configure(args.log_level, Masker(config.secrets))
    return run(serve(config))
