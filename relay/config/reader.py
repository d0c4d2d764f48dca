"""Typed reading of a TOML table, with errors that name the dotted key.

Every getter removes the key it read, so `done()` can refuse whatever is
left: a typo such as `server.lisen` is an error, not a silently ignored line.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from relay.core.units import parse_duration, parse_size

if TYPE_CHECKING:
    from relay.templates import Template


class ConfigError(Exception):
    """An invalid config: one line that names the key and what was expected."""

    def __init__(self, key: str, problem: str) -> None:
        key, problem = _one_line(key), _one_line(problem)
        super().__init__(f"{key}: {problem}" if key else problem)
        self.key = key
        self.problem = problem


def _one_line(text: str) -> str:
    """Control characters (a key may hold a newline) escaped: the error stays one line."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


class _Missing:
    def __repr__(self) -> str:
        return "<required>"


# The default of a getter called without one: the key must be there. A getter's
# type is its value's, or the default's (`string("url", None)` is `str | None`;
# without a default the type variable has no solution and the type is `str`).
REQUIRED: Any = _Missing()
D = TypeVar("D")
C = TypeVar("C", bound=str)


def as_toml(value: object) -> str:
    """A value as it would look in TOML, for error messages."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "a list"
    return str(value)


class Section:
    """One TOML table being read; `where` is its dotted name ("" for the root)."""

    def __init__(
        self, data: Mapping[str, Any], where: str, *, recorder: set[str] | None = None
    ) -> None:
        """`recorder`, when given, gets every dotted key asked for here and in the
        tables below: the docs test lists every key the loader knows with it."""
        self._data = dict(data)
        self._asked: list[str] = []
        self._recorder = recorder
        self.where = where

    def nested(self, data: Mapping[str, Any], where: str) -> Section:
        """A table read on behalf of this one (its recorder follows)."""
        return Section(data, where, recorder=self._recorder)

    def key(self, name: str) -> str:
        return f"{self.where}.{name}" if self.where else name

    def has(self, name: str) -> bool:
        return name in self._data

    def names(self) -> list[str]:
        return list(self._data)

    def take(self, name: str, default: Any = REQUIRED) -> Any:
        if name not in self._asked:
            self._asked.append(name)
        if self._recorder is not None:
            self._recorder.add(self.key(name))
        if name in self._data:
            return self._data.pop(name)
        if default is REQUIRED:
            raise ConfigError(self.key(name), "is required")
        return default

    def error(self, name: str, expected: str, value: object) -> ConfigError:
        return ConfigError(self.key(name), f"expected {expected}, got {as_toml(value)}")

    def _typed(self, name: str, default: Any, check: Callable[[Any], bool], expected: str) -> Any:
        value = self.take(name, default)
        if value is default and default is not REQUIRED:
            return value
        if not check(value):
            raise self.error(name, expected, value)
        return value

    def string(self, name: str, default: D = REQUIRED, *, nonempty: bool = True) -> str | D:
        expected = "a non-empty string" if nonempty else "a string"
        value: str | D = self._typed(
            name, default, lambda v: isinstance(v, str) and (bool(v) or not nonempty), expected
        )
        return value

    def boolean(self, name: str, default: D = REQUIRED) -> bool | D:
        value: bool | D = self._typed(name, default, lambda v: isinstance(v, bool), "true or false")
        return value

    def integer(
        self,
        name: str,
        default: D = REQUIRED,
        *,
        minimum: int | None = None,
        maximum: int | None = None,
    ) -> int | D:
        expected = _range_text("an integer", minimum, maximum)
        value: int | D = self._typed(
            name,
            default,
            lambda v: (
                isinstance(v, int)
                and not isinstance(v, bool)
                and (minimum is None or v >= minimum)
                and (maximum is None or v <= maximum)
            ),
            expected,
        )
        return value

    def number(
        self,
        name: str,
        default: D = REQUIRED,
        *,
        minimum: float | None = None,
        maximum: float | None = None,
    ) -> float | D:
        expected = _range_text("a number", minimum, maximum)
        value = self._typed(
            name,
            default,
            lambda v: (
                isinstance(v, int | float)
                and not isinstance(v, bool)
                and (minimum is None or v >= minimum)
                and (maximum is None or v <= maximum)
            ),
            expected,
        )
        return float(value) if isinstance(value, int) else value

    def choice(self, name: str, choices: Iterable[C], default: D = REQUIRED) -> C | D:
        options = list(choices)
        expected = "one of " + ", ".join(f'"{c}"' for c in options)
        value: C | D = self._typed(name, default, lambda v: v in options, expected)
        return value

    def duration(self, name: str, default: D = REQUIRED, *, positive: bool = True) -> float | D:
        value = self.take(name, default)
        if value is default and default is not REQUIRED:
            return value
        return self.parse_duration_value(name, value, positive=positive)

    def parse_duration_value(self, name: str, value: object, *, positive: bool = True) -> float:
        expected = 'a duration like "500ms", "2s", "5m", "1h" or "1d"'
        if not isinstance(value, str):
            raise self.error(name, expected, value)
        try:
            seconds = parse_duration(value)
        except ValueError:
            raise self.error(name, expected, value) from None
        if positive and seconds <= 0:
            raise self.error(name, "a duration above zero", value)
        return seconds

    def size(self, name: str, default: D = REQUIRED) -> int | D:
        value = self.take(name, default)
        if value is default and default is not REQUIRED:
            return value
        expected = 'a size like "64KiB" or "1MiB"'
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
        if not isinstance(value, str):
            raise self.error(name, expected, value)
        try:
            size = parse_size(value)
        except ValueError:
            raise self.error(name, expected, value) from None
        if size <= 0:
            raise self.error(name, "a size above zero", value)
        return size

    def string_list(self, name: str, default: D = REQUIRED) -> tuple[str, ...] | D:
        value = self._typed(
            name,
            default,
            lambda v: isinstance(v, list) and all(isinstance(item, str) for item in v),
            "a list of strings",
        )
        return tuple(value) if isinstance(value, list) else value

    def string_map(self, name: str, default: D = REQUIRED) -> dict[str, str] | D:
        value = self.take(name, default)
        if value is default and default is not REQUIRED:
            return value
        if not isinstance(value, dict):
            raise self.error(name, "a table of strings", value)
        for item_key, item in value.items():
            if not isinstance(item, str):
                raise ConfigError(
                    self.key(f"{name}.{item_key}"), f"expected a string, got {as_toml(item)}"
                )
        return dict(value)

    def path(self, name: str, base: Path, default: D = REQUIRED) -> Path | D:
        value = self.string(name, None)
        if value is None:
            absent: Path | D = self.take(name, default)  # the default, or "is required"
            return absent
        return resolve_path(value, base)

    def template(
        self,
        name: str,
        default: D = REQUIRED,
        *,
        offers: Collection[str],
        html: bool = False,
        markdown_v2: bool = False,
    ) -> Template | D:
        """A Jinja2 template, compiled now: a syntax error, or a variable that is not
        in `offers` (what this place's context holds), is a config error."""
        source = self.string(name, None, nonempty=False)
        if source is None:
            absent: Template | D = self.take(name, default)  # the default, or "is required"
            return absent
        return self._compile(name, source, offers, html=html, markdown_v2=markdown_v2)

    def template_or(
        self,
        name: str,
        default_source: str,
        *,
        offers: Collection[str],
        html: bool = False,
        markdown_v2: bool = False,
    ) -> Template:
        """A template, or `default_source` compiled as one when the key is absent."""
        source = self.string(name, default_source, nonempty=False)
        return self._compile(name, source, offers, html=html, markdown_v2=markdown_v2)

    def template_map(
        self, name: str, *, offers: Collection[str], html: bool = False
    ) -> dict[str, Template]:
        return {
            key: self._compile(f"{name}.{key}", value, offers, html=html)
            for key, value in self.string_map(name, {}).items()
        }

    def expression(
        self, name: str, default: D = REQUIRED, *, offers: Collection[str]
    ) -> Template | D:
        """A condition such as `json.Status == 'PAID'`, compiled now."""
        source = self.string(name, None)
        if source is None:
            absent: Template | D = self.take(name, default)  # the default, or "is required"
            return absent
        from relay.templates import compile_expression  # see _compile

        try:
            return compile_expression(source, offers=offers)
        except ValueError as error:
            raise ConfigError(self.key(name), f"{error} in {as_toml(source)}") from None

    def _compile(
        self,
        name: str,
        source: str,
        offers: Collection[str],
        *,
        html: bool,
        markdown_v2: bool = False,
    ) -> Template:
        # Jinja2 is imported by the first template a config holds: the operator
        # commands (`relay events`, `relay stats`) read none, and start without it.
        from relay.templates import compile_template

        try:
            return compile_template(source, html=html, markdown_v2=markdown_v2, offers=offers)
        except ValueError as error:
            raise ConfigError(self.key(name), str(error)) from None

    def section(self, name: str) -> Section:
        value = self.take(name, {})
        if not isinstance(value, dict):
            raise self.error(name, "a table", value)
        return self.nested(value, self.key(name))

    def subsections(self, name: str) -> dict[str, Section]:
        table = self.section(name)
        result: dict[str, Section] = {}
        for child in table.names():
            result[child] = table.section(child)
        return result

    def done(self) -> None:
        """Refuse the first key nobody asked for, listing the ones that were."""
        if self._data:
            name = next(iter(self._data))
            known = ", ".join(self._asked) or "none"
            raise ConfigError(self.key(name), f"unknown key (expected one of: {known})")


def _range_text(kind: str, minimum: float | None, maximum: float | None) -> str:
    if minimum is not None and maximum is not None:
        return f"{kind} from {_num(minimum)} to {_num(maximum)}"
    if minimum is not None:
        return f"{kind} >= {_num(minimum)}"
    if maximum is not None:
        return f"{kind} <= {_num(maximum)}"
    return kind


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def resolve_path(value: str, base: Path) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else (base / path)


# ${VAR} reads the environment (${VAR:-default} when it may be unset);
# ${file:NAME} reads a systemd credential ($CREDENTIALS_DIRECTORY/NAME);
# $$ is a literal dollar sign.
_REFERENCE = re.compile(r"\$\$|\$\{([^}]*)\}")
_VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CREDENTIAL_NAME = re.compile(r"[A-Za-z0-9_.\-]+")


def substitute(
    tree: Any, environ: Mapping[str, str], where: str, secrets: set[str], *, strict: bool = True
) -> Any:
    """Replace references in every string of a parsed TOML tree.

    Every value that came from a reference is added to `secrets`, so logs and
    answers can mask it wherever it shows up later. With `strict=False` a
    reference that cannot be resolved is left as it is written.
    """
    if isinstance(tree, dict):
        return {
            key: substitute(
                value, environ, f"{where}.{key}" if where else key, secrets, strict=strict
            )
            for key, value in tree.items()
        }
    if isinstance(tree, list):
        return [
            substitute(item, environ, f"{where}[{i}]", secrets, strict=strict)
            for i, item in enumerate(tree)
        ]
    if isinstance(tree, str) and "$" in tree:
        return _substitute_string(tree, environ, where, secrets, strict)
    return tree


def _substitute_string(
    text: str, environ: Mapping[str, str], where: str, secrets: set[str], strict: bool
) -> str:
    def replace(match: re.Match[str]) -> str:
        try:
            return resolve(match)
        except ConfigError:
            if strict:
                raise
            return match.group(0)

    def resolve(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        reference = match.group(1)
        if reference.startswith("file:"):
            value = _read_credential(reference[5:], environ, where)
        elif _VAR_NAME.fullmatch(reference.split(":-", 1)[0]):
            name, has_default, default = reference.partition(":-")
            if environ.get(name):
                value = environ[name]
            elif has_default:
                return default
            elif name in environ:
                raise ConfigError(where, f"environment variable {name} is empty")
            else:
                raise ConfigError(where, f"environment variable {name} is not set")
        else:
            raise ConfigError(
                where,
                f"expected ${{VARIABLE}}, ${{VARIABLE:-default}} or ${{file:NAME}},"
                f" got ${{{reference}}}",
            )
        if value and (reference.startswith("file:") or not plain_setting(where)):
            secrets.add(value)
        return value

    return _REFERENCE.sub(replace, text)


# Settings that name where things are, not credentials: a value from ${VAR}
# there is shown as it is. Masking it would hide ordinary text everywhere it
# appears (SMTP_HOST=127.0.0.1 turned "ingress on http://127.0.0.1:8080" into
# "http://***:8080"; a chat id, an address, a port into "***").
PLAIN_SETTINGS = frozenset(
    {"host", "port", "chat_id", "from", "to", "cc", "username", "listen", "api_base"}
)


def plain_setting(where: str) -> bool:
    if where in ("storage.path", "storage.instance_id"):
        # An instance's name (instance_id = "${RELAY_INSTANCE}", one per host)
        # is shown in its log, its connections and the cluster's instance list.
        return True
    name = re.sub(r"(\[\d+\])+$", "", where).rsplit(".", 1)[-1]
    return name in PLAIN_SETTINGS or name in ("trusted_proxies", "allow_ips")


def _read_credential(name: str, environ: Mapping[str, str], where: str) -> str:
    if not _CREDENTIAL_NAME.fullmatch(name):
        raise ConfigError(where, f"expected a credential name after file:, got {name!r}")
    directory = environ.get("CREDENTIALS_DIRECTORY")
    if not directory:
        raise ConfigError(
            where,
            f"credential {name} needs $CREDENTIALS_DIRECTORY (systemd LoadCredential=;"
            " outside the unit: --credentials DIR, e.g. /etc/relay/credentials)",
        )
    try:
        return Path(directory, name).read_text(encoding="utf-8").rstrip("\r\n")
    except OSError as error:
        raise ConfigError(where, f"cannot read credential {name}: {error.strerror}") from None
