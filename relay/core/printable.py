"""Text a terminal or a log shows: what a sender or a target wrote never drives it.

A webhook's fields, a target's answer and a key reach `relay events`, `relay
show`, `relay audit` and the journal. Written as they came, ESC sequences
would drive the terminal of whoever reads them (OSC 52 writes the clipboard,
others set the title or clear the screen), a carriage return would write over
what the line said, a line break would forge a row of a table or a line of
the journal, and the Unicode bidi controls would show a line in another order
than it reads. Each is written as its escape instead (`\\x1b`, `\\n`,
`\\u202e`): the text stays readable and says what was sent.
"""

from __future__ import annotations

import re

# C0 controls but tab, DEL and C1; the bidi embeddings, overrides and
# isolates; the line and paragraph separators. `_LINES` keeps line breaks.
_ALWAYS = r"\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u2028\u2029"
_ONE_LINE = re.compile(f"[{_ALWAYS}\n]")
_LINES = re.compile(f"[{_ALWAYS}]")
# What JSON leaves as it is of those: C1 (a terminal may act on U+009B as on
# ESC [), the bidi controls and the separators. JSON escapes C0 itself.
_UNESCAPED_BY_JSON = "\x7f-\x9f\u202a-\u202e\u2066-\u2069\u2028\u2029"
_IN_JSON = re.compile(f"[{_UNESCAPED_BY_JSON}]")


def _escaped(found: re.Match[str]) -> str:
    return found.group().encode("unicode_escape").decode("ascii")


def printable(text: str) -> str:
    """`text` as one line: every control character written as its escape."""
    if text.isprintable():  # nearly always, and cheaper to ask
        return text
    return _ONE_LINE.sub(_escaped, text)


def printable_lines(text: str) -> str:
    """`text` as lines (a body, a preview, a traceback): line breaks and tabs
    kept, every other control character written as its escape."""
    return _LINES.sub(_escaped, text)


def _json_escape(found: re.Match[str]) -> str:
    return f"\\u{ord(found.group()):04x}"


def printable_json(document: bytes) -> bytes:
    """A JSON document (UTF-8) as a terminal may show it: the characters JSON
    writes as they are but a terminal may act on, written as `\\uXXXX` —
    the same document to any parser (they occur only inside strings)."""
    text = document.decode("utf-8")
    if text.isascii():
        return document
    return _IN_JSON.sub(_json_escape, text).encode("utf-8")
