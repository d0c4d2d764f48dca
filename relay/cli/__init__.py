"""The `relay` command: one subcommand per module, all sharing `--config`."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from relay import __version__, compiled
from relay.cli import (
    check,
    completion,
    events,
    export,
    movestore,
    operate,
    render,
    resend,
    serve,
    setup,
)
from relay.cli.common import CommandError, Parser, as_root_hint
from relay.ops.inputs import BadRequest
from relay.store import AlreadyRunning, Conflict, NotFound, StoreError

COMMANDS = (serve, check, events, export, operate, render, resend, setup, movestore, completion)


def parser() -> Parser:
    root = Parser(
        prog="relay", description="A webhook relay: accept, keep on disk, deliver with retries."
    )
    root.add_argument(
        "--version", action="version", version=f"relay {__version__}, {compiled.describe()}"
    )
    commands = root.add_subparsers(
        dest="command", metavar="COMMAND", required=True, parser_class=Parser
    )
    for module in COMMANDS:
        module.register(commands)
    for name, sub in commands.choices.items():
        completion.with_examples(sub, name)
    # `relay completion` writes a script for the whole tree: handed down, not
    # imported back from here (no import runs in a circle).
    root.set_defaults(root_parser=root)
    return root


def _subcommand(root: Parser, name: str) -> Parser | None:
    for action in root._subparsers._group_actions if root._subparsers else ():
        if isinstance(action, argparse._SubParsersAction):
            found = action.choices.get(name)
            return found if isinstance(found, Parser) else None
    return None


def main(argv: Sequence[str] | None = None) -> int:
    root = parser()
    args, extras = root.parse_known_args(argv)
    if extras:
        # Said under the subcommand's own usage, with the option it resembles.
        chosen = _subcommand(root, args.command)
        (chosen or root).unrecognized(extras)
    try:
        code: int = args.handler(args)
        sys.stdout.flush()  # here, where a closed pipe is still ours to answer
    except (CommandError, BadRequest, NotFound, Conflict) as error:
        # What was asked cannot be: the words are the admin API's (relay.ops.actions).
        print(f"relay: {error}", file=sys.stderr)
        return 2
    except (StoreError, AlreadyRunning) as error:
        print(f"relay: {error}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # `relay check | head`: the reader has all it wanted. Quiet, like other
        # tools, and with nothing left for the interpreter to flush at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for it
    except PermissionError as error:
        print(
            f"relay: {error.filename or 'a file'}: permission denied"
            f" (run as root: {as_root_hint()})",
            file=sys.stderr,
        )
        return 1
    except OSError as error:  # one line, never a traceback
        where = f"{error.filename}: " if error.filename else ""
        print(f"relay: {where}{error.strerror or error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return code
