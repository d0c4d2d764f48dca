"""The `relay` command: one subcommand per module, all sharing `--config`."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from relay import __version__, compiled
from relay.cli import completion
from relay.cli.common import CommandError, Parser, as_root_hint
from relay.core.printable import printable
from relay.ops.inputs import BadRequest
from relay.store import AlreadyRunning, Conflict, NotFound, StoreError

# Each subcommand's module (relay.cli.<module>, in the order help lists
# them). Only the module of the command run is imported: `relay serve` does
# not hold every other command's code for as long as it runs, and a command
# starts without loading the rest. Help, a mistyped command and `relay
# completion` (which writes the whole tree) import them all.
COMMANDS = {
    "serve": "serve",
    "check": "check",
    "events": "events",
    "rejections": "events",
    "show": "events",
    "export": "export",
    "retry": "operate",
    "skip": "operate",
    "requeue": "operate",
    "pause": "operate",
    "resume": "operate",
    "audit": "operate",
    "stats": "operate",
    "purge": "operate",
    "render": "render",
    "resend": "resend",
    "init": "setup",
    "backup": "setup",
    "migrate-store": "movestore",
    "completion": "completion",
}
_WHOLE_TREE = {"completion"}


def parser(command: str | None = None) -> Parser:
    """The command line's parser: with `command`'s module alone when it is one
    of COMMANDS (its module may register others beside it), else all."""
    root = Parser(
        prog="relay", description="A webhook relay: accept, keep on disk, deliver with retries."
    )
    root.add_argument(
        "--version", action="version", version=f"relay {__version__}, {compiled.build_name()}"
    )
    commands = root.add_subparsers(
        dest="command", metavar="COMMAND", required=True, parser_class=Parser
    )
    if command in COMMANDS and command not in _WHOLE_TREE:
        modules = [COMMANDS[command]]
    else:
        modules = list(dict.fromkeys(COMMANDS.values()))
    for name in modules:
        importlib.import_module(f"relay.cli.{name}").register(commands)
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
    words = list(sys.argv[1:] if argv is None else argv)
    # The command is the first word that is not an option (`relay --version`
    # has none: every module, as for help).
    root = parser(next((word for word in words if not word.startswith("-")), None))
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
        print(f"relay: {printable(str(error))}", file=sys.stderr)
        return 2
    except (StoreError, AlreadyRunning) as error:
        print(f"relay: {printable(str(error))}", file=sys.stderr)
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
