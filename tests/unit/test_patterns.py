"""Every regular expression relay applies to text a sender or a target chose
does work linear in that text.

Python's `re` backtracks and holds the GIL while it does: a pattern that is
quadratic on some input stops the event loop, and a worker thread does not
help (one 58 KiB webhook once held the process past systemd's watchdog
through the masker's URL pattern). So every `re` call in relay is listed
here, found by reading the source (a new one fails `test_every_pattern_is_listed`
until it is), either as trusted (it reads the config, the operator's own
command line or relay's own SQL) or with the shapes that are hardest for it:
each is timed in CPU time at N and at 8N, and must grow no faster than
linearly, within a fixed bound; random texts over the pattern's own
characters are timed too.

How to write a pattern over untrusted text is in docs/develop.md
("Patterns over untrusted text").
"""

from __future__ import annotations

import ast
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

import relay

ROOT = Path(relay.__file__).parent
CALLS = {"compile", "search", "match", "fullmatch", "sub", "subn", "split", "findall", "finditer"}


@dataclass(frozen=True)
class Trusted:
    why: str


@dataclass(frozen=True)
class Untrusted:
    """A pattern over untrusted text: how relay applies it, and its worst shapes
    (a function of N giving a text about N units long)."""

    shapes: dict[str, Callable[[int], str]]
    method: str = "finditer"
    flags: int = 0
    # For a pattern built at run time: one it builds.
    pattern: str | None = None
    extra_alphabet: str = "a0 \n"


def _alternation_of_literals(n: int) -> str:
    return "toke passwor secre api_ke signatur " * n


# (module, the pattern as written) -> what it reads.
PATTERNS: dict[tuple[str, str], Trusted | Untrusted] = {
    # -- the config, the command line, relay's own text ---------------------------
    ("cli/check.py", r"\s[#;]"): Trusted("a config value"),
    ("cli/common.py", r"invalid choice: '(?P<given>[^']*)' \(choose from (?P<names>.*)\)"): (
        Trusted("argparse's message about the operator's own command line")
    ),
    ("cli/envfile.py", "[A-Za-z_][A-Za-z0-9_]*"): Trusted("a name in the operator's env file"),
    ("cli/setup.py", r'^path = "relay\.db"'): Trusted("relay's own starter config"),
    ("loader/load.py", r"[\w.:@-]{1,100}"): Trusted("[storage] instance_id"),
    ("config/reader.py", r"\$\$|\$\{([^}]*)\}"): Trusted("a config string's ${VAR}"),
    ("config/reader.py", "[A-Za-z_][A-Za-z0-9_]*"): Trusted("a ${VAR}'s name"),
    ("config/reader.py", r"[A-Za-z0-9_.\-]+"): Trusted("a ${file:NAME}'s name"),
    ("config/reader.py", r"(\[\d+\])+$"): Trusted("a config key's path"),
    ("loader/targets.py", r"[A-Za-z0-9][A-Za-z0-9_\-]*"): Trusted("a route or target name"),
    ("loader/targets.py", r"\s*(\d+)\s*/\s*(s|sec|second|m|min|minute|h|hour)\s*"): Trusted(
        "a target's rate"
    ),
    ("core/units.py", r"(\d+(?:\.\d+)?)(ms|s|m|h|d)"): Trusted("a duration in the config"),
    ("core/units.py", r"(\d+)\s*([a-z]*)"): Trusted("a size in the config"),
    ("core/pgurl.py", "://([^:@/]*):[^@/]*@"): Trusted("[storage] url"),
    ("core/pgurl.py", "://.*@"): Trusted("[storage] url"),
    ("store/dialect.py", r"\?"): Trusted("relay's own SQL"),
    ("targets/outbound/policy.py", r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"): Trusted(
        "a header name in the config"
    ),
    ("targets/telegram.py", r"\d+:[A-Za-z0-9_-]+"): Trusted("a bot token in the config"),
    # -- what senders and targets send, and what templates make of it -------------
    ("core/secrets.py", "'|'.join(_SENSITIVE_PARTS)"): Untrusted(
        {"near misses": _alternation_of_literals},
        "search",
        pattern="token|secret|password|passwd|signature|api_key|apikey",
    ),
    ("core/secrets.py", "'|'.join((*_SENSITIVE_PARTS, 'api-key', '\\\\\\\\'))"): Untrusted(
        {"near misses": _alternation_of_literals},
        "search",
        pattern=r"token|secret|password|passwd|signature|api_key|apikey|api-key|\\",
    ),
    ("core/secrets.py", r"(?<!\w)(\w++://)[^/\s:@]++(?::[^/\s@]*+)?+@"): Untrusted(
        {
            # The shape that held the loop for seconds: every start in the
            # first run reaches "://", then reads every b looking for "@".
            "word, scheme, no @": lambda n: "@" + "a" * n + "://" + "b" * n,
            "schemes": lambda n: "a://" * n,
            "schemes with a password": lambda n: "a://b:" * n,
            "user, no @": lambda n: "h://" + "u:" * n,
        },
        "sub",
    ),
    (
        "core/secrets.py",
        "_JSON_STRING + '(?:\\\\s*+:\\\\s*+(?:' + _JSON_STRING"
        " + '|(-?[0-9][0-9.eE+-]*+)|([\\\\[{])))?'",
    ): Untrusted(
        {
            "open strings": lambda n: '"a' * n,
            "keys without values": lambda n: '"":' * n,
            "escapes": lambda n: '"' + "\\a" * n,
            "spaces before a colon": lambda n: '"k"' + " " * n + "x",
            "a long number": lambda n: '"k":' + "1e" * n,
            "containers": lambda n: '"k":[' * n,
        },
        pattern=r'"([^"\\]*+(?:\\.[^"\\]*+)*+)(?:"|\Z)(?:\s*+:\s*+(?:"([^"\\]*+(?:\\.[^"\\]*+)*+)'
        r'(?:"|\Z)|(-?[0-9][0-9.eE+-]*+)|([\[{])))?',
    ),
    ("core/secrets.py", r'"[^"\\]*+(?:\\.[^"\\]*+)*+(?:"|\Z)|[\[\]{}]'): Untrusted(
        {
            "brackets": lambda n: "[{" * n,
            "open string": lambda n: '"' + "a" * n,
            "escapes": lambda n: '"' + "\\a" * n,
        }
    ),
    ("core/secrets.py", "'[' + ''.join(hidden) + ']'"): Untrusted(
        {"placeholders": lambda n: "\ue000a\ue001" * n}, pattern="[\ue000\ue001]"
    ),
    ("core/multipart.py", rb';\s*([^\s=;]+)\s*=\s*("(?:[^"\\]|\\.)*"|[^;]*)'.decode()): Untrusted(
        {
            "an open quote before many separators": lambda n: ';a="' + ";" * n,
            "spaces": lambda n: ";" + " " * n,
            "names without values": lambda n: ";" + "a" * n,
            "escapes in an open quote": lambda n: ';a="' + "\\a" * n,
            "parameters": lambda n: ';a="b"' * n,
        }
    ),
    ("core/multipart.py", r"\\(.)"): Untrusted({"backslashes": lambda n: "\\" * n}, "sub"),
    ("core/printable.py", "f'[{_ALWAYS}\\n]'"): Untrusted(
        {"controls": lambda n: "\x1b]52;c;\n" * n},
        "sub",
        pattern="[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u2028\u2029\n]",
    ),
    ("core/printable.py", "f'[{_ALWAYS}]'"): Untrusted(
        {"controls": lambda n: "\x1b[2J\u202e" * n},
        "sub",
        pattern="[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u2028\u2029]",
    ),
    ("core/printable.py", "f'[{_UNESCAPED_BY_JSON}]'"): Untrusted(
        {"controls": lambda n: "\x9b2J\u202e" * n},
        "sub",
        pattern="[\x7f-\x9f\u202a-\u202e\u2066-\u2069\u2028\u2029]",
    ),
    ("ops/glance.py", r"[\W_]+"): Untrusted({"separators": lambda n: "_a" * n}, "sub"),
    ("ops/glance.py", r"\D"): Untrusted({"digits between": lambda n: "a1" * n}, "sub"),
    ("ops/logs.py", '[ "=]'): Untrusted({"plain": lambda n: "a" * n}, "search"),
    ("ops/resend.py", r"^[A-Za-z0-9][\w!#$&^.+-]*/[A-Za-z0-9][\w!#$&^.+-]*$"): Untrusted(
        {"two slashes": lambda n: "a" * n + "/" + "a" * n + "/"}, "match"
    ),
    ("ops/resend.py", r"[\n&,{\[;]"): Untrusted({"separators": lambda n: "&a" * n}),
    ("ops/resend.py", r"\s+"): Untrusted({"spaces": lambda n: " a" * n}, "sub"),
    ("ops/search.py", r"\d(?:[\d\u00a0 ().\-]*\d)?"): Untrusted(
        {
            "a digit and punctuation": lambda n: "1" + " (" * n,
            "digits apart": lambda n: "1 " * n + "x",
            "digits and dashes": lambda n: "1-" * n,
        }
    ),
    ("ops/search.py", r"\D"): Untrusted({"digits between": lambda n: "a1" * n}, "sub"),
    ("ops/search.py", r"^\+?[\d\u00a0 ().\-]+$"): Untrusted(
        {"a phone, then a letter": lambda n: "+7 (9" * n + "x"}, "match"
    ),
    ("ops/search.py", r"\s+"): Untrusted({"spaces": lambda n: " a" * n}, "sub"),
    ("sources/woocommerce.py", rb"webhook_id=\d+".decode()): Untrusted(
        {"digits, then a letter": lambda n: "webhook_id=" + "1" * n + "x"}, "fullmatch"
    ),
    ("targets/base.py", "^(X-Relay-Event-Id:) 0$"): Untrusted(
        {"lines": lambda n: "X-Relay-Event-Id: 0\nX-Relay-Event-Id: 01\n" * n},
        "sub",
        re.MULTILINE | re.IGNORECASE,
    ),
    ("targets/base.py", '^(webhook-id:|Idempotency-Key:) "?msg_relay_0"?$'): Untrusted(
        {
            "lines": lambda n: 'webhook-id: msg_relay_0\nIdempotency-Key: "msg_relay_01\n' * n,
            "near misses": lambda n: 'Idempotency-Key: "msg_relay_0""\n' * n,
        },
        "sub",
        re.MULTILINE | re.IGNORECASE,
    ),
    ("targets/smtp.py", r"[^@\s<>]+@[^@\s<>]+|.*<[^@\s<>]+@[^@\s<>]+>"): Untrusted(
        {
            "brackets": lambda n: "<a" * n + "@",
            "addresses in brackets": lambda n: "<a@" * n,
            "a long name": lambda n: "a" * n + "@",
            "spaces and brackets": lambda n: " <" * n,
        },
        "fullmatch",
    ),
    ("targets/telegram.py", r"<(/?)([a-zA-Z-]++)[^<>]*+>"): Untrusted(
        {"unclosed tags": lambda n: "<a" * n, "tags": lambda n: "<b>x</b>" * n}, "findall"
    ),
    ("targets/telegram.py", "&[a-zA-Z0-9#]*$"): Untrusted(
        {"entities": lambda n: "&a" * n + ";"}, "sub"
    ),
    ("templates/sandbox.py", r"[-#0 +]*+(\*|\d++)?+(?:\.(\*|\d*+))?+[hlL]?+[a-zA-Z%]"): Untrusted(
        {"flags": lambda n: "-" * n, "digits": lambda n: "1" * n + "."},
        "match",
    ),
    ("templates/sandbox.py", r"\d+"): Untrusted({"digits apart": lambda n: "1a" * n}, "findall"),
}


def _calls() -> dict[tuple[str, str], int]:
    """Every re.<call>(pattern, ...) in relay: (module, pattern) -> its line."""
    found: dict[tuple[str, str], int] = {}
    for path in sorted(ROOT.rglob("*.py")):
        module = path.relative_to(ROOT).as_posix()
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [alias for alias in node.names if alias.name == "re"]
                from_re = isinstance(node, ast.ImportFrom) and node.module == "re"
                assert not from_re, f"{module}:{node.lineno}: use `import re` (the scan reads re.X)"
                assert all(alias.asname is None for alias in names), f"{module}: `import re as`"
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "re"
                and node.func.attr in CALLS
            ):
                continue
            argument = node.args[0]
            if isinstance(argument, ast.Constant) and isinstance(argument.value, str | bytes):
                value = argument.value
                pattern = value.decode() if isinstance(value, bytes) else value
            else:
                pattern = ast.unparse(argument)
            found[(module, pattern)] = node.lineno
    return found


def test_every_pattern_is_listed() -> None:
    calls = _calls()
    unlisted = [
        f"relay/{m}:{line}: {p!r}" for (m, p), line in calls.items() if (m, p) not in PATTERNS
    ]
    assert not unlisted, "patterns this test does not know (list each in PATTERNS):\n" + "\n".join(
        unlisted
    )
    stale = [key for key in PATTERNS if key not in calls]
    assert not stale, f"listed but no longer in relay: {stale}"


# CPU seconds of one application, at least this long a measurement (repeated).
_MEASURE = 0.002
# 8x the text may cost at most this many times as much: linear is 8, a
# quadratic pattern 64. Room for a busy machine's noise, none for a square.
_GROWTH = 20
# And at 8N (a text of tens of KiB) never this much CPU: the event loop's budget.
_BOUND = 0.05
_N = 2000


def _cpu(run: Callable[[], object]) -> float:
    """CPU seconds of one run (the best of three measurements)."""
    best = float("inf")
    for _ in range(3):
        count = 0
        start = time.process_time()
        while True:
            run()
            count += 1
            spent = time.process_time() - start
            if spent >= _MEASURE:
                break
        best = min(best, spent / count)
    return best


def _applier(entry: Untrusted, source: str) -> Callable[[str], object]:
    compiled = re.compile(entry.pattern or source, entry.flags)
    method = getattr(compiled, entry.method)
    if entry.method == "sub":
        return lambda text: compiled.sub("", text)
    if entry.method == "finditer":
        return lambda text: list(compiled.finditer(text))
    return lambda text: method(text)  # type: ignore[no-any-return]


UNTRUSTED = [
    pytest.param(entry, source, shape, id=f"{module}:{name}")
    for (module, source), entry in PATTERNS.items()
    if isinstance(entry, Untrusted)
    for name, shape in entry.shapes.items()
]


@pytest.mark.parametrize(("entry", "source", "shape"), UNTRUSTED)
def test_worst_shapes_cost_linear_cpu(
    entry: Untrusted, source: str, shape: Callable[[int], str]
) -> None:
    apply = _applier(entry, source)
    small, large = shape(_N), shape(8 * _N)
    at_n = _cpu(lambda: apply(small))
    at_8n = _cpu(lambda: apply(large))
    assert at_8n < _BOUND, f"{at_8n * 1000:.1f} ms of CPU for {len(large):,} characters"
    assert at_8n <= _GROWTH * max(at_n, 2e-5), (
        f"8N cost {at_8n / at_n:.0f}x N ({at_n * 1e3:.2f} ms -> {at_8n * 1e3:.2f} ms): super-linear"
    )


@pytest.mark.parametrize(
    ("module", "source"),
    [key for key, entry in PATTERNS.items() if isinstance(entry, Untrusted)],
    ids=lambda value: str(value)[:40],
)
def test_random_texts_over_the_patterns_own_characters(module: str, source: str) -> None:
    entry = PATTERNS[(module, source)]
    assert isinstance(entry, Untrusted)
    apply = _applier(entry, source)
    alphabet = sorted(set(entry.pattern or source) | set(entry.extra_alphabet))
    generator = random.Random(f"{module}{source}")
    worst = 0.0
    for _ in range(3):
        # Runs of one character as well as mixes: backtracking needs both.
        pieces = [
            generator.choice(alphabet) * generator.choice((1, 1, 2, 7, 50))
            for _ in range(16 * _N // 12)
        ]
        text = "".join(pieces)
        worst = max(worst, _cpu(lambda text=text: apply(text)))  # type: ignore[misc]
    assert worst < _BOUND, f"{worst * 1000:.1f} ms for {len(text):,} random characters"


# Code that reads untrusted text with string methods where a pattern would
# backtrack; timed the same way. (module, function) -> its worst shapes.
def _functions() -> dict[str, tuple[Callable[[str], object], dict[str, Callable[[int], str]]]]:
    from relay.core.secrets import Masker, shown_body
    from relay.ops.search import document
    from relay.targets.telegram import cut
    from relay.templates.sandbox import _percent_format

    masker = Masker(["s3cret-value"])
    return {
        "Masker.text": (
            masker.text,
            {
                "word, scheme, no @": lambda n: "@" + "a" * n + "://" + "b" * n,
                "secrets": lambda n: "s3cret-valu" * n,
            },
        ),
        "shown_body (JSON)": (
            lambda text: shown_body(text, "application/json", masker),
            {
                "credential keys": lambda n: '{"token": "' + "a\\\\" * n + '"}',
                "a deep credential value": lambda n: '{"token": ' + "[" * n + "]" * n + "}",
                "credential values cut short": lambda n: '{"token": "x", "a": ["' * n,
            },
        ),
        "search document": (
            lambda text: document(
                1, headers=[("X-A", text)], query="", content_type=None, body=b"", masker=masker
            ),
            {"word, scheme, no @": lambda n: "@" + "a" * n + "://" + "b" * n},
        ),
        "telegram cut (HTML)": (
            lambda text: cut(text, html=True, limit=len(text) // 2),
            {
                # The cut keeps the first half: n unclosed tags and one ">".
                "unclosed tags, one >": lambda n: "<a" * n + ">" + "x" * 4 * n,
                "open tags": lambda n: "<b>" * n,
            },
        ),
        "%-format check": (
            _percent_format,
            {"open keys": lambda n: "%(" * n, "nested keys": lambda n: "%(" + "(" * n + ")" * n},
        ),
    }


@pytest.mark.parametrize(
    ("function", "shape"),
    [(name, shape) for name, (_, shapes) in _functions().items() for shape in shapes],
)
def test_functions_over_untrusted_text_cost_linear_cpu(function: str, shape: str) -> None:
    apply, shapes = _functions()[function]
    small, large = shapes[shape](_N), shapes[shape](8 * _N)
    at_n = _cpu(lambda: apply(small))
    at_8n = _cpu(lambda: apply(large))
    assert at_8n < _BOUND * 4, f"{at_8n * 1000:.1f} ms of CPU for {len(large):,} characters"
    assert at_8n <= _GROWTH * max(at_n, 2e-5), (
        f"8N cost {at_8n / at_n:.0f}x N ({at_n * 1e3:.2f} ms -> {at_8n * 1e3:.2f} ms): super-linear"
    )
