"""Jinja2 templates in a sandbox: one mechanism for keys, bodies, texts and filters.

A template is compiled once, when the config is loaded, and knows which
context variables it reads, so a request's body is parsed only when some
template actually looks at `json` or `form`.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import jinja2
import jinja2.meta
from jinja2.filters import do_default

from relay.core.budget import (
    MAX_OPERATIONS,
    MAX_OUTPUT_CHARS,
    TemplateError,
    end_budget,
    start_budget,
)
from relay.core.fields import FormFields
from relay.core.payload import EVENT_VARIABLES
from relay.templates.sandbox import BoundedEnvironment, bound

__all__ = [
    "MAX_OPERATIONS",
    "MAX_OUTPUT_CHARS",
    "Template",
    "compile_expression",
    "compile_template",
]

# Set by `relay render`: every value that fell back to its `default` is
# named here, so a missing field shows instead of passing as an empty value.
_fallbacks: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar(
    "template_fallbacks", default=None
)


@contextlib.contextmanager
def marking_defaults() -> Iterator[list[str]]:
    """Within this block, each value that falls back to its `default` is
    listed ("no comment = ''"). The output itself is unchanged: a marker in
    it could make a valid value invalid (a Reply-To address, a JSON number)."""
    found: list[str] = []
    token = _fallbacks.set(found)
    try:
        yield found
    finally:
        _fallbacks.reset(token)


def _default(value: Any, default_value: Any = "", boolean: bool = False) -> Any:
    result = do_default(value, default_value, boolean)
    found = _fallbacks.get()
    if found is not None and (result is not value or isinstance(value, jinja2.Undefined)):
        if isinstance(value, jinja2.Undefined) and value._undefined_name is not None:
            missing = f"no {value._undefined_name!s}"
        else:
            missing = f"empty {value!r}"
        found.append(f"{missing} = {result!r}")
    return result


class _Missing(jinja2.StrictUndefined):
    """A value a template reads that the payload does not have, said in the
    payload's words ("form field utm_source is missing"), not Python's
    ("'relay.core.fields.FormFields object' has no attribute 'utm_source'")."""

    @property
    def _undefined_message(self) -> str:
        if self._undefined_hint:
            return self._undefined_hint
        name, owner = self._undefined_name, self._undefined_obj
        if owner is jinja2.utils.missing:
            return f"{name!r} is undefined"
        if isinstance(owner, FormFields):
            return f"form field {name!s} is missing"
        if isinstance(owner, Mapping) and "multidict" in type(owner).__module__:
            return f"header {name!s} is missing"
        if isinstance(owner, Mapping):
            return f"field {name!s} is missing"
        if isinstance(owner, list | tuple):
            return f"item {name!s} is missing (the list has {len(owner)})"
        return f"{name!s} is missing (the value is {type(owner).__name__}, not an object)"


class _Environment(BoundedEnvironment):
    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.filters["default"] = self.filters["d"] = _default


_PLAIN = _Environment(undefined=_Missing, autoescape=False, keep_trailing_newline=True)
_HTML = _Environment(undefined=_Missing, autoescape=True, keep_trailing_newline=True)

# Telegram's MarkdownV2: every one of these must be escaped with a backslash
# outside entities (Bot API, "MarkdownV2 style"), the backslash itself too.
MARKDOWN_V2_SPECIAL = frozenset("_*[]()~`>#+-=|{}.!\\")


def escape_markdown_v2(text: str) -> str:
    return "".join("\\" + char if char in MARKDOWN_V2_SPECIAL else char for char in text)


def _markdown_value(value: Any) -> str:
    # Values only ({{ ... }}): the template's own text is the author's markup.
    return escape_markdown_v2(str(value))


_MARKDOWN_V2 = _Environment(
    undefined=_Missing,
    autoescape=False,
    keep_trailing_newline=True,
    finalize=_markdown_value,
)


@dataclass(frozen=True)
class Template:
    source: str
    variables: frozenset[str]
    _compiled: jinja2.Template = field(repr=False, compare=False)

    def render(self, context: Mapping[str, Any]) -> str:
        token = start_budget()
        try:
            pieces: list[str] = []
            size = 0
            for piece in self._compiled.generate(context):
                size += len(piece)
                if size > MAX_OUTPUT_CHARS:
                    raise TemplateError(f"template output exceeds {MAX_OUTPUT_CHARS} characters")
                pieces.append(piece)
        except TemplateError:
            raise
        except jinja2.UndefinedError as error:
            raise TemplateError(f"template error: {error.message}") from None
        except jinja2.TemplateError as error:
            raise TemplateError(f"template error: {error}") from None
        except Exception as error:  # anything a sandboxed expression can raise
            raise TemplateError(f"template error: {type(error).__name__}: {error}") from None
        finally:
            end_budget(token)
        return "".join(pieces)

    def holds(self, context: Mapping[str, Any]) -> bool:
        """A condition's verdict (see compile_expression)."""
        return self.render(context) == "1"


def compile_template(
    source: str,
    *,
    html: bool = False,
    markdown_v2: bool = False,
    offers: Collection[str] | None = None,
) -> Template:
    """Compile `source`; raises ValueError with Jinja's message on a syntax error.

    `html` escapes every value for HTML, `markdown_v2` for Telegram's MarkdownV2.
    With `offers`, a variable that is neither offered nor one of Jinja's own
    (`range`, `namespace`...) is refused now: rendered, it would fail every time."""
    environment = _HTML if html else _MARKDOWN_V2 if markdown_v2 else _PLAIN
    try:
        tree = environment.parse(source)
        # What the template reads, before loops and `~` are rewritten to be counted.
        variables = frozenset(jinja2.meta.find_undeclared_variables(tree))
        compiled = environment.from_string(bound(tree, environment))
    except jinja2.TemplateSyntaxError as error:
        raise ValueError(f"template syntax error at line {error.lineno}: {error.message}") from None
    except (RecursionError, SyntaxError, MemoryError):
        # Hundreds of nested filters or brackets: Jinja's compiler or Python's gives up.
        raise ValueError("template nested too deeply") from None
    if offers is not None:
        _refuse_unknown(variables, offers, environment)
    return Template(source=source, variables=variables, _compiled=compiled)


def _refuse_unknown(
    variables: frozenset[str], offers: Collection[str], environment: jinja2.Environment
) -> None:
    unknown = sorted(variables - set(offers) - set(environment.globals))
    if not unknown:
        return
    readable = ", ".join(sorted(offers))
    name = unknown[0]
    if name in EVENT_VARIABLES:
        raise ValueError(
            f"reads {name}, which is not known here (this template can read {readable};"
            " event exists only in a target's templates: a request has no id before it"
            " is stored)"
        )
    raise ValueError(f"reads {name}, which is not a template variable (use {readable})")


def compile_expression(source: str, *, offers: Collection[str] | None = None) -> Template:
    """A boolean condition such as `json.Status == 'CONFIRMED'`, as a template.

    Rendered through the same sandbox; the result is "1" when it holds and ""
    when it does not (see `Template.holds`).
    """
    wrapped = compile_template("{% if (" + source + ") %}1{% endif %}", offers=offers)
    # Messages ("when: ... is false") show the condition as the user wrote it.
    return dataclasses.replace(wrapped, source=source)
