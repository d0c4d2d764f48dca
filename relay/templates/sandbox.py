"""The Jinja2 sandbox relay renders in, with a bill for everything a render may cost.

Jinja's sandbox stops escapes (no `__class__`, no `__globals__`), not cost.
Counting calls and lookups alone let `'x' * 10**8`, `name|center(10**9)`,
`b ** 10**9` and nested loops over a payload through: one event's template
could hold the event loop for seconds or eat the memory. Here:

- sizes: any string, list or number one operation builds is checked *before*
  it is built (`*`, `+`, `~`, `**`, `%` and str.format widths, the width and
  count arguments of filters and str methods), and again after any call;
- loops: every iteration of every `for` is an operation (the template is
  rewritten so that each loop's iterable passes through `_counted`);
- time: a render on the event loop may take LOOP_SECONDS, a render in a
  worker thread (targets render there) WORKER_SECONDS, then it stops.

All of it ends in a TemplateError: a template that cannot be rendered for
this payload, a permanent failure for this one event.
"""

from __future__ import annotations

import math
import re
import string
from collections.abc import Callable, Iterable, Iterator, Sized
from typing import Any, cast

import jinja2
from jinja2 import nodes
from jinja2.runtime import markup_join, str_join
from jinja2.sandbox import SandboxedEnvironment
from jinja2.visitor import NodeTransformer

from relay.core.budget import (
    TemplateError,
    check_bits,
    check_size,
    on_loop,
    spend,
)

# Filters that run Python for every item in one call the clock cannot stop
# (~1 µs an item): on the event loop they take this many items at most.
PER_ITEM_FILTERS = frozenset({"sort", "unique", "groupby", "dictsort", "min", "max", "sum"})
LOOP_FILTER_ITEMS = 20_000

LOOP_NAME = "_relay_counted"
CONCAT_NAME = "_relay_concat"


def _counted(iterable: Iterable[Any]) -> Iterator[Any]:
    """Each loop's iterable: one operation per item."""
    for item in iterable:
        spend()
        yield item


def _concat(join: Callable[[Iterable[Any]], str]) -> Callable[[tuple[Any, ...]], str]:
    def concat(parts: tuple[Any, ...]) -> str:
        check_size(sum(len(str(part)) for part in parts), "a ~ result")
        return join(parts)

    return concat


class _Bounded(NodeTransformer):
    """Rewrites a parsed template: loops count their items, `~` checks its size."""

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        node.iter = nodes.Call(
            nodes.Name(LOOP_NAME, "load"), [node.iter], [], None, None, lineno=node.lineno
        )
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        parts = nodes.Tuple(node.nodes, "load", lineno=node.lineno)
        return nodes.Call(
            nodes.Name(CONCAT_NAME, "load"), [parts], [], None, None, lineno=node.lineno
        )


def bound(tree: nodes.Template, environment: jinja2.Environment) -> nodes.Template:
    bounded = _Bounded().visit(tree)
    assert isinstance(bounded, nodes.Template)
    bounded.set_environment(environment)
    return bounded


# A %-conversion after its mapping key: flags, a width or precision ("*" takes
# it from the arguments), a length modifier, the conversion. Matched at one
# place at a time, possessive: a pass over the text, whatever it holds.
_CONVERSION = re.compile(r"[-#0 +]*+(\*|\d++)?+(?:\.(\*|\d*+))?+[hlL]?+[a-zA-Z%]")


def _percent_format(text: str) -> None:
    """Refuses a width or precision that would build a huge string, reading
    each conversion as CPython does (Objects/unicodeobject.c): a mapping key's
    parentheses nest, so `%(a(b)c)9999999s` has the width 9999999."""
    position = text.find("%")
    while position >= 0:
        spec = position + 1
        if text.startswith("(", spec):
            spec = _mapping_key_end(text, spec)
            if spec < 0:
                return  # no closing ")": formatting fails here, having built no more
        conversion = _CONVERSION.match(text, spec)
        if conversion is not None:
            for number in conversion.groups():
                if number == "*":
                    raise TemplateError("template error: '*' widths are not supported")
                if number:
                    check_size(int(number), "a %-format width")
            spec = conversion.end()
        position = text.find("%", spec)


def _mapping_key_end(text: str, opening: int) -> int:
    """Where the mapping key opened at `opening` ends (after its ")"), or -1."""
    depth = 1
    position = opening + 1
    while depth:
        closing = text.find(")", position)
        if closing < 0:
            return -1
        depth += text.count("(", position, closing) - 1
        position = closing + 1
    return position


def _brace_format(text: str) -> None:
    try:
        fields = list(string.Formatter().parse(text))
    except ValueError as error:
        raise TemplateError(f"template error: {error}") from None
    for _, _, spec, _ in fields:
        if spec and "{" in spec:
            raise TemplateError("template error: nested format fields are not supported")
        for number in re.findall(r"\d+", spec or ""):
            check_size(int(number), "a format width")


def _text_method(owner: str | bytes, name: str, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """Checks a str (or bytes) method call before it runs; may return new args."""
    if name in ("center", "ljust", "rjust", "zfill") and args and isinstance(args[0], int):
        check_size(args[0], f"{name}()")
    elif name == "expandtabs":
        tabsize = args[0] if args and isinstance(args[0], int) else 8
        tabs = owner.count("\t") if isinstance(owner, str) else owner.count(b"\t")
        check_size(len(owner) + tabs * max(tabsize, 0), "expandtabs()")
    elif name == "replace" and len(args) >= 2:
        _replacement(owner, args[0], args[1], args[2] if len(args) > 2 else -1)
    elif name == "join" and args:
        items = list(args[0])
        check_size(len(owner) * len(items), "join()")
        return (items, *args[1:])
    elif name in ("format", "format_map") and isinstance(owner, str):
        _brace_format(owner)
    return args


def _replacement(text: Any, old: Any, new: Any, count: Any) -> None:
    if not isinstance(text, str | bytes) or not isinstance(new, str | bytes):
        return
    found = text.count(old) if old else len(text) + 1
    if isinstance(count, int) and count >= 0:
        found = min(found, count)
    check_size(len(text) + found * max(len(new) - len(old or ""), 0), "replace()")


def _bounded_filters(filters: dict[str, Any]) -> None:
    plain = dict(filters)

    def center(value: Any, width: int = 80) -> str:
        check_size(int(width), "center()")
        return str(plain["center"](value, width))

    def indent(text: Any, width: Any = 4, first: bool = False, blank: bool = False) -> str:
        lines = str(text).count("\n") + 1
        pad = len(width) if isinstance(width, str) else int(width)
        check_size(len(str(text)) + pad * lines, "indent()")
        return str(plain["indent"](text, width, first, blank))

    def wordwrap(
        environment: Any,
        text: Any,
        width: int = 79,
        break_long_words: bool = True,
        wrapstring: str | None = None,
        break_on_hyphens: bool = True,
    ) -> str:
        # textwrap is slow on long inputs and can insert a break per character.
        check_size(len(str(text)) * 16, "wordwrap() input, times 16,")
        check_size(len(str(text)) * (1 + len(wrapstring or "\n")), "wordwrap()")
        return str(
            plain["wordwrap"](
                environment, text, width, break_long_words, wrapstring, break_on_hyphens
            )
        )

    wordwrap.jinja_pass_arg = plain["wordwrap"].jinja_pass_arg  # type: ignore[attr-defined]

    def replace(eval_ctx: Any, text: Any, old: Any, new: Any, count: Any = None) -> str:
        _replacement(str(text), str(old), str(new), count)
        return str(plain["replace"](eval_ctx, text, old, new, count))

    replace.jinja_pass_arg = plain["replace"].jinja_pass_arg  # type: ignore[attr-defined]

    def join(eval_ctx: Any, value: Any, d: str = "", attribute: Any = None) -> str:
        items = list(value)
        spend(len(items))
        check_size(len(str(d)) * len(items), "join()")
        return str(plain["join"](eval_ctx, items, d, attribute))

    join.jinja_pass_arg = plain["join"].jinja_pass_arg  # type: ignore[attr-defined]

    def format_(value: Any, *args: Any, **kwargs: Any) -> str:
        _percent_format(str(value))
        return str(plain["format"](value, *args, **kwargs))

    def slice_(value: Any, slices: int, fill_with: Any = None) -> Any:
        check_size(int(slices), "slice()")
        return plain["slice"](value, slices, fill_with)

    def batch(value: Any, linecount: int, fill_with: Any = None) -> Any:
        check_size(int(linecount), "batch()")
        return plain["batch"](value, linecount, fill_with)

    def sum_(environment: Any, iterable: Any, attribute: Any = None, start: Any = 0) -> Any:
        if not isinstance(start, int | float):
            raise TemplateError("template error: sum() starts from a number only")
        return plain["sum"](environment, iterable, attribute, start)

    sum_.jinja_pass_arg = plain["sum"].jinja_pass_arg  # type: ignore[attr-defined]

    filters.update(
        center=center,
        indent=indent,
        wordwrap=wordwrap,
        replace=replace,
        join=join,
        format=format_,
        slice=slice_,
        batch=batch,
        sum=sum_,
    )


def _metered(function: Callable[..., Any], name: str = "") -> Callable[..., Any]:
    """A filter (or test) that spends an operation, plus one per 64 items or
    characters of its input: filters run in C or in Jinja without passing
    through call(), and a chain of them over a large payload must still reach
    the clock. The few that call Python per item and cannot be interrupted
    (sort, unique, ...) take at most LOOP_FILTER_ITEMS on the event loop."""
    passes = getattr(function, "jinja_pass_arg", None)
    position = 0 if passes is None else 1
    per_item = name in PER_ITEM_FILTERS

    def metered(*args: Any, **kwargs: Any) -> Any:
        value = args[position] if len(args) > position else None
        size = len(value) if isinstance(value, str | bytes | list | tuple | dict | set) else 0
        spend(1 + size // 64)
        if per_item and size > LOOP_FILTER_ITEMS and on_loop():
            raise TemplateError(
                f"template too expensive: {name} over {size} items while the"
                f" request waits (at most {LOOP_FILTER_ITEMS}; a target's template may)"
            )
        return function(*args, **kwargs)

    if passes is not None:
        metered.jinja_pass_arg = passes  # type: ignore[attr-defined]
    return metered


class BoundedEnvironment(SandboxedEnvironment):
    # A smaller range() than Jinja's default of 100,000 items: nobody needs a
    # long loop to shape a webhook, and nested loops multiply.
    MAX_RANGE = 10_000
    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.globals.pop("lipsum", None)  # lipsum(n) writes n paragraphs
        # JSON as most senders and CRMs write it, UTF-8: a Cyrillic name goes
        # as letters, not as \\uXXXX escapes (Jinja still escapes <, >, & and ').
        self.policies["json.dumps_kwargs"] = {"sort_keys": True, "ensure_ascii": False}
        self.globals[LOOP_NAME] = _counted
        self.globals[CONCAT_NAME] = _concat(markup_join if self.autoescape else str_join)
        _bounded_filters(self.filters)
        plain_tojson = self.filters["tojson"]

        def tojson(context: Any, value: Any, indent: int | None = None) -> Any:
            # Name the missing field, instead of "StrictUndefined is not JSON serializable".
            if isinstance(value, jinja2.Undefined):
                value._fail_with_undefined_error()
            return plain_tojson(context, value, indent)

        tojson.jinja_pass_arg = plain_tojson.jinja_pass_arg  # type: ignore[attr-defined]
        self.filters["tojson"] = tojson
        for name, function in list(self.filters.items()):
            self.filters[name] = _metered(function, name)
        for name, test in list(self.tests.items()):
            self.tests[name] = _metered(cast(Callable[..., Any], test))

    def getattr(self, obj: Any, attribute: str) -> Any:
        spend()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        spend()
        return super().getitem(obj, argument)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        spend()
        method = getattr(__obj, "__wrapped__", __obj)  # the sandbox wraps str.format
        owner = getattr(method, "__self__", None)
        if isinstance(owner, str | bytes):
            args = _text_method(owner, getattr(method, "__name__", ""), args)
        result = super().call(__context, __obj, *args, **kwargs)
        if isinstance(result, range):
            spend(len(result))  # a loop over it costs as much
        elif isinstance(result, str | bytes | list | tuple | dict | set):
            check_size(len(result), "a call's result")
        if isinstance(owner, list | dict | set):
            check_size(len(owner), "a list, dict or set")  # after append/extend/update
        return result

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "**" and _integers(left, right) and right > 0 and abs(left) > 1:
            check_bits(right * math.log2(abs(left)))
        elif operator == "*":
            if _integers(left, right):
                check_bits(left.bit_length() + right.bit_length())
            for sequence, times in ((left, right), (right, left)):
                if isinstance(sequence, Sized) and isinstance(times, int):
                    check_size(len(sequence) * times, "a * result")
        elif operator == "+" and isinstance(left, Sized) and isinstance(right, Sized):
            check_size(len(left) + len(right), "a + result")
        elif operator == "%" and isinstance(left, str):
            _percent_format(left)
        return super().call_binop(context, operator, left, right)


def _integers(left: Any, right: Any) -> bool:
    return isinstance(left, int) and isinstance(right, int)
