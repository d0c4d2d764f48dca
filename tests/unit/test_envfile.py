"""relay.cli.envfile reads EnvironmentFile= as systemd does.

Each case is a rule of systemd.exec(5), "EnvironmentFile=", as implemented
by parse_env_file_internal() in systemd's src/basic/env-file.c (v252, the
version Debian 12 ships).
"""

from __future__ import annotations

import pytest

from relay.cli.envfile import parse_env_file


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # "Empty lines, lines without an "=" separator, or lines starting with
        # ";" or "#" will be ignored".
        ("\n# A=1\n; B=2\nC\nD=4\n", {"D": "4"}),
        # An inline comment is part of an unquoted value: systemd keeps it.
        (
            "TOKEN=abc123     # openssl rand -hex 24\n",
            {"TOKEN": "abc123     # openssl rand -hex 24"},
        ),
        # "Leading and trailing whitespace ... is discarded, but interior
        # whitespace within the line is preserved verbatim".
        ("  A =  one  two \t\n", {"A": "one  two"}),
        # "quotes after the first non-whitespace character are preserved".
        ('A=abc"def"\n', {"A": 'abc"def"'}),
        # "A line ending with a backslash will be continued to the following one".
        ("A=one\\\ntwo\n", {"A": "onetwo"}),
        # "\\" becomes "\"; a backslash keeps the next character.
        ("A=a\\\\b\\$c\n", {"A": "a\\b$c"}),
        # '...' spans lines and is verbatim, no escapes.
        ("A='x \\n\ny'\n", {"A": "x \\n\ny"}),
        # "..." unescapes \" \\ \` \$ only; other backslashes are kept.
        ('A="a\\"b\\\\c\\nd $HOME"\n', {"A": 'a"b\\c\\nd $HOME'}),
        # No expansion of $VAR anywhere; the last assignment wins.
        ("A=$HOME\nA=${HOME}x\n", {"A": "${HOME}x"}),
        # A value at the end of the file without a newline; an empty value.
        ("A=\nB=last", {"A": "", "B": "last"}),
        # Invalid names are dropped; CR ends a line like LF.
        ("1A=x\nA-B=y\r\nOK=z\r\n", {"OK": "z"}),
        # A backslash at the end of a comment continues the comment.
        ("# note \\\nA=hidden\nB=seen\n", {"B": "seen"}),
    ],
)
def test_systemd_rules(text: str, expected: dict[str, str]) -> None:
    assert parse_env_file(text) == expected
