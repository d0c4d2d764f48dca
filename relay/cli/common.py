"""What every subcommand shares: finding the config, opening the store, printing."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import os
import re
import select
import shlex
import sys
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import orjson

from relay.cli.envfile import parse_env_file
from relay.config import Config, ConfigError
from relay.core.clock import SystemClock
from relay.core.closest import closest
from relay.core.printable import printable, printable_json, printable_lines
from relay.loader import DatabaseCommandConfig, load_config, load_database_command_config
from relay.ops.actions import Actions
from relay.ops.inputs import BadRequest, instant, whole_number
from relay.store import BY_CLI, Store, open_store

T = TypeVar("T")

DEFAULT_CONFIG_PATHS = (Path("relay.toml"), Path("/etc/relay/relay.toml"))


class CommandError(Exception):
    """A one-line message for the user; the command exits non-zero."""


_INVALID_CHOICE = re.compile(r"invalid choice: '(?P<given>[^']*)' \(choose from (?P<names>.*)\)")


class Parser(argparse.ArgumentParser):
    """argparse, and a typo gets a suggestion: "did you mean --route?", "did
    you mean dead?" — under the usage of the subcommand it was typed for."""

    def error(self, message: str) -> NoReturn:
        match = _INVALID_CHOICE.search(message)
        if match:
            names = [name.strip(" '") for name in match["names"].split(",")]
            close = closest(match["given"], names)
            if close:
                message += f"; did you mean {close}?"
        super().error(message)

    def unrecognized(self, extras: list[str]) -> NoReturn:
        """What argparse left over, said by the parser of the subcommand."""
        options = [o for o in self._option_string_actions if o.startswith("--")]
        hints = []
        for extra in extras:
            if extra.startswith("-"):
                close = closest(extra.split("=", 1)[0], options)
                if close:
                    hints.append(f"did you mean {close}?")
        self.error("; ".join([f"unrecognized arguments: {' '.join(extras)}", *hints]))


def count_type(maximum: int = 100_000) -> Callable[[str], int]:
    """`--limit` and such: a whole number from 1 ("0" or "-5" is an error, not one row)."""

    def parse(text: str) -> int:
        try:
            return whole_number(text, "value", maximum=maximum)
        except BadRequest:
            raise argparse.ArgumentTypeError(
                f"expected a whole number from 1 to {maximum}, not {text!r}"
            ) from None

    return parse


def add_time_options(parser: argparse.ArgumentParser, what: str = "events received") -> None:
    forms = (
        "a date (2026-12-02), a local time (2026-12-02T15:00), an ISO time with an"
        ' offset, an age ("2h", "3d"), a time of day (06:00, its last occurrence) or'
        ' "today"/"yesterday"; local times are in admin.timezone'
    )
    parser.add_argument("--since", metavar="TIME", help=f"only {what} at or after TIME: {forms}")
    parser.add_argument("--until", metavar="TIME", help=f"only {what} before TIME (same forms)")


def time_window(
    args: argparse.Namespace, config: Config | DatabaseCommandConfig
) -> tuple[float | None, float | None]:
    """--since and --until as Unix times, read in the config's time zone."""
    now = time.time()
    return (
        instant(getattr(args, "since", None), "--since", now, config.zone),
        instant(getattr(args, "until", None), "--until", now, config.zone),
    )


def add_config_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        metavar="PATH",
        type=Path,
        help="config file (default: $RELAY_CONFIG, then ./relay.toml, then /etc/relay/relay.toml)",
    )


def add_service_environment_options(parser: argparse.ArgumentParser) -> None:
    """Read secrets as the unit gives them, from outside the unit."""
    parser.add_argument(
        "--env-file",
        metavar="FILE",
        type=Path,
        help="read ${VARS} from this file as systemd's EnvironmentFile= does"
        " (e.g. /etc/relay/relay.env)",
    )
    parser.add_argument(
        "--credentials",
        metavar="DIR",
        type=Path,
        help="read ${file:NAME} from DIR/NAME, as the unit's LoadCredential= would"
        " (e.g. /etc/relay/credentials)",
    )


def add_json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json", action="store_true", help="print JSON instead of text (times in UTC)"
    )


def config_path(args: argparse.Namespace, environ: Mapping[str, str]) -> Path:
    if args.config is not None:
        return Path(args.config)
    if environ.get("RELAY_CONFIG"):
        return Path(environ["RELAY_CONFIG"])
    for candidate in DEFAULT_CONFIG_PATHS:
        if candidate.exists():
            return candidate
    raise CommandError("no config file: pass --config PATH or set RELAY_CONFIG")


# Where deploy.md puts what the unit hands the service, beside its config:
# EnvironmentFile=/etc/relay/relay.env, LoadCredential=...:/etc/relay/credentials/NAME.
SERVICE_ENV_FILE = "relay.env"
SERVICE_CREDENTIALS = "credentials"


def service_sources(
    args: argparse.Namespace, config: Path, environ: Mapping[str, str]
) -> tuple[Path | None, Path | None]:
    """The env file and credentials folder to read: --env-file and --credentials
    when given, else the service's own beside the config (relay.env,
    credentials/) when they are there — so that `sudo relay check`, `render`
    and `resend` see what the service sees, with no flag to remember. A
    credentials folder the environment already names ($CREDENTIALS_DIRECTORY,
    inside the unit) is kept."""
    env_file: Path | None = getattr(args, "env_file", None)
    credentials: Path | None = getattr(args, "credentials", None)
    folder = config.parent
    if not hasattr(args, "env_file"):
        # `relay serve`: systemd hands it its environment and credentials. Run
        # by hand beside a config `relay init` wrote, it finds the admin token
        # there (when it may read it; else the credential's error says how).
        beside = folder / SERVICE_CREDENTIALS
        if not environ.get("CREDENTIALS_DIRECTORY") and os.access(beside, os.R_OK | os.X_OK):
            return None, beside
        return None, None
    if env_file is None and (folder / SERVICE_ENV_FILE).is_file():
        env_file = folder / SERVICE_ENV_FILE
    if (
        credentials is None
        and not environ.get("CREDENTIALS_DIRECTORY")
        and (folder / SERVICE_CREDENTIALS).is_dir()
    ):
        credentials = folder / SERVICE_CREDENTIALS
    return env_file, credentials


def service_environ(
    args: argparse.Namespace, env_file: Path | None, credentials: Path | None
) -> dict[str, str]:
    """This process's environment, plus the env file's variables and credentials."""
    environ = dict(os.environ)
    if env_file is not None:
        try:
            text = env_file.read_text(encoding="utf-8")
        except OSError as error:
            raise CommandError(_cannot(env_file, error, "read")) from None
        except UnicodeDecodeError:
            raise CommandError(f"{env_file}: not UTF-8 (systemd ignores such lines)") from None
        environ.update(parse_env_file(text))
    if credentials is not None:
        if not credentials.is_dir():
            raise CommandError(f"--credentials {credentials}: not a directory")
        if not os.access(credentials, os.R_OK | os.X_OK):
            raise CommandError(
                _cannot(credentials, PermissionError(errno.EACCES, "denied"), "read")
            )
        environ["CREDENTIALS_DIRECTORY"] = str(credentials.resolve())
    return environ


def read_config(args: argparse.Namespace, *, command: bool = False) -> Config:
    """The whole config; a `command` (resend, render) leaves out what only
    `relay serve` uses (its listeners, its instance name: config.load)."""
    path = config_path(args, os.environ)
    env_file, credentials = service_sources(args, path, os.environ)
    if hasattr(args, "env_file"):
        # What was read, for `relay check` to say (and to check the env file).
        args.env_file, args.credentials = env_file, credentials
    environ = service_environ(args, env_file, credentials)
    try:
        return load_config(path, environ, command=command)
    except ConfigError as error:
        hint = ""
        # `relay check`/`render` in a shell on the server: the variables are in
        # the service's environment file, which only systemd loads.
        unset = error.problem.startswith("environment variable ") and error.problem.endswith(
            " is not set"
        )
        if unset and hasattr(args, "env_file") and env_file is None:
            hint = " (outside the service: --env-file FILE, e.g. /etc/relay/relay.env)"
        raise CommandError(f"config error: {error}{hint}") from None


def read_database_command_config(args: argparse.Namespace) -> DatabaseCommandConfig:
    """For commands that work on the database: secrets of targets are not needed.
    [storage] may name some (a PostgreSQL password): the service's env file and
    credentials beside the config are read when this user may read them."""
    path = config_path(args, os.environ)
    environ = dict(os.environ)
    env_file, credentials = path.parent / SERVICE_ENV_FILE, path.parent / SERVICE_CREDENTIALS
    # Not there, or not ours to read: [storage] rarely needs it.
    with contextlib.suppress(OSError, UnicodeDecodeError):
        environ.update(parse_env_file(env_file.read_text(encoding="utf-8")))
    if not environ.get("CREDENTIALS_DIRECTORY") and os.access(credentials, os.R_OK | os.X_OK):
        environ["CREDENTIALS_DIRECTORY"] = str(credentials.resolve())
    try:
        return load_database_command_config(path, environ)
    except ConfigError as error:
        raise CommandError(f"config error: {error}") from None


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    """The event loop: uvloop when it is installed, asyncio's own otherwise.
    Chosen here only."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop
    return uvloop.new_event_loop


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(coroutine)


def as_root_hint() -> str:
    return "sudo " + shlex.join(["relay", *sys.argv[1:]])


def _cannot(path: Path, error: OSError, verb: str) -> str:
    if error.errno in (errno.EACCES, errno.EPERM):
        return f"cannot {verb} {path}: permission denied (run this as root: {as_root_hint()})"
    return f"cannot {verb} {path}: {error.strerror}"


def existing_database(path: Path) -> None:
    """Commands other than `serve` work on the service's database: never a new one."""
    try:
        os.stat(path)
        with open(path, "rb"):
            pass
    except FileNotFoundError:
        raise CommandError(f"no database at {path} (is this the service's config?)") from None
    except OSError as error:
        raise CommandError(_cannot(path, error, "open")) from None


@asynccontextmanager
async def opened_store(config: Config | DatabaseCommandConfig) -> AsyncIterator[Store]:
    if config.storage.url is None:
        existing_database(config.storage.path)
    store = open_store(config.storage)
    await store.open()
    try:
        yield store
    finally:
        await store.close()


@asynccontextmanager
async def acting(config: Config | DatabaseCommandConfig) -> AsyncIterator[Actions]:
    """What a person may do, with the same rules and words as the admin API."""
    async with opened_store(config) as store:
        yield Actions(store, SystemClock(), lambda: config)


def who() -> str:
    """The person at the shell (through sudo, the one who ran sudo): who acts."""
    import getpass  # only an operator's command asks (termios: not for `relay serve`)

    user = os.environ.get("SUDO_USER") or getpass.getuser()
    return f"{BY_CLI} {user}"


def emit(args: argparse.Namespace, data: Any, render_text: Callable[[Any], str]) -> None:
    """Print `data` as JSON with --json, else as the text `render_text` makes
    of it: either way no control character a sender or a target wrote can
    drive the terminal (relay.core.printable)."""
    if getattr(args, "json", False):
        write_all(printable_json(orjson.dumps(data, option=orjson.OPT_INDENT_2)) + b"\n")
    else:
        text = render_text(data)
        if text:
            print(printable_lines(text))


def write_all(data: bytes) -> None:
    """Write every byte to stdout.

    Under PYTHONUNBUFFERED (set in many service and CI environments)
    `sys.stdout.buffer` is a raw FileIO whose write() is one system call: into
    a pipe it may take only part of a large document and say so in its
    return value, which a single call would silently drop.
    """
    sys.stdout.flush()
    out = sys.stdout.buffer
    view = memoryview(data)
    while view:
        written = out.write(view)
        if written is None:  # a non-blocking stdout that is full: wait for room
            select.select([], [out], [])
            continue
        view = view[written:]
    out.flush()


def table(rows: list[list[str]], headers: list[str]) -> str:
    """Rows under their headers, aligned; a cell is one line (a line break in
    one written `\\n`, so no value can forge a row)."""
    if not rows:
        return "(none)"
    rows = [[printable(str(cell)) for cell in row] for row in rows]
    widths = [max(len(str(row[i])) for row in [headers, *rows]) for i in range(len(headers))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += [
        "  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    return "\n".join(lines)
