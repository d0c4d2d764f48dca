"""Read an environment file the way systemd's `EnvironmentFile=` does.

`relay check --env-file` must see the values the service will get, and a
shell does not read these files like systemd: `KEY=abc # note` is `abc` to
`sh` but `abc # note` to systemd. This follows systemd.exec(5)
("EnvironmentFile=") and its implementation, `parse_env_file_internal()` in
systemd's src/basic/env-file.c: comments are whole lines starting with `#`
or `;`; an unquoted value keeps its interior whitespace, quotes inside it and
anything after `#`, loses leading and trailing whitespace, and takes
backslash escapes (a backslash before a newline joins lines); '...' is
verbatim; "..." unescapes only \\ \" \\` \\$ (and joins lines), other
backslashes are kept. No `$VAR` is expanded. Invalid names are dropped.
"""

from __future__ import annotations

import re
from enum import Enum, auto

_WHITESPACE = " \t\n\r"
_NEWLINE = "\n\r"
_COMMENTS = "#;"
_SHELL_NEED_ESCAPE = '"\\`$'
# systemd's env_name_is_valid(): a C identifier.
_VALID_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class _State(Enum):
    PRE_KEY = auto()
    KEY = auto()
    PRE_VALUE = auto()
    VALUE = auto()
    VALUE_ESCAPE = auto()
    SINGLE_QUOTE = auto()
    DOUBLE_QUOTE = auto()
    DOUBLE_QUOTE_ESCAPE = auto()
    COMMENT = auto()
    COMMENT_ESCAPE = auto()


def parse_env_file(text: str) -> dict[str, str]:
    """Every assignment in `text`, later ones replacing earlier ones."""
    found: dict[str, str] = {}
    state = _State.PRE_KEY
    key: list[str] = []
    value: list[str] = []
    value_end: int | None = None  # where trailing whitespace of an unquoted value starts

    def push() -> None:
        name = "".join(key).rstrip(_WHITESPACE)
        if _VALID_NAME.fullmatch(name):
            found[name] = "".join(value)

    for char in text:
        if state is _State.PRE_KEY:
            if char in _COMMENTS:
                state = _State.COMMENT
            elif char not in _WHITESPACE:
                state, key, value, value_end = _State.KEY, [char], [], None
        elif state is _State.KEY:
            if char in _NEWLINE:
                state = _State.PRE_KEY  # a line without "=" is ignored
            elif char == "=":
                state = _State.PRE_VALUE
            else:
                key.append(char)
        elif state is _State.PRE_VALUE:
            if char in _NEWLINE:
                push()
                state = _State.PRE_KEY
            elif char == "'":
                state = _State.SINGLE_QUOTE
            elif char == '"':
                state = _State.DOUBLE_QUOTE
            elif char == "\\":
                state = _State.VALUE_ESCAPE
            elif char not in _WHITESPACE:
                state = _State.VALUE
                value.append(char)
        elif state is _State.VALUE:
            if char in _NEWLINE:
                if value_end is not None:
                    del value[value_end:]
                push()
                state = _State.PRE_KEY
            elif char == "\\":
                state, value_end = _State.VALUE_ESCAPE, None
            else:
                if char not in _WHITESPACE:
                    value_end = None
                elif value_end is None:
                    value_end = len(value)
                value.append(char)
        elif state is _State.VALUE_ESCAPE:
            state = _State.VALUE
            if char not in _NEWLINE:
                value.append(char)
        elif state is _State.SINGLE_QUOTE:
            if char == "'":
                state = _State.PRE_VALUE
            else:
                value.append(char)
        elif state is _State.DOUBLE_QUOTE:
            if char == '"':
                state = _State.PRE_VALUE
            elif char == "\\":
                state = _State.DOUBLE_QUOTE_ESCAPE
            else:
                value.append(char)
        elif state is _State.DOUBLE_QUOTE_ESCAPE:
            state = _State.DOUBLE_QUOTE
            if char in _SHELL_NEED_ESCAPE:
                value.append(char)
            elif char != "\n":
                value += ["\\", char]
        elif state is _State.COMMENT:
            if char == "\\":
                state = _State.COMMENT_ESCAPE
            elif char in _NEWLINE:
                state = _State.PRE_KEY
        else:  # COMMENT_ESCAPE: the escaped character stays in the comment
            state = _State.COMMENT
    if state not in (_State.PRE_KEY, _State.KEY, _State.COMMENT, _State.COMMENT_ESCAPE):
        if state is _State.VALUE and value_end is not None:
            del value[value_end:]
        push()
    return found
