"""A PostgreSQL URL ([storage] url, `migrate-store --to`) checked before the
driver reads it, and shown without its password.

asyncpg splits the URL at the first `@` and the first `/` after `://`, so a
password holding `@ / ? #` that was put into the URL as it is (`${PGPASSWORD}`
from a generator) makes the driver read a piece of it as the port, and raise
a ValueError that quotes that piece. Nothing here ever quotes the URL.
"""

from __future__ import annotations

import re
import urllib.parse

UNREADABLE = (
    "does not parse as a PostgreSQL URL (is there a password with @ / ? # or % in it?):"
    " percent-encode such characters in the password (@ is %40, / is %2F, ? is %3F,"
    " # is %23, % is %25), or leave the password out of the URL and set PGPASSWORD"
    " in relay's environment, which the driver reads"
)


def url_problem(url: str) -> str | None:
    """Why the driver would misread `url`, or None; never quotes it."""
    try:
        parsed = urllib.parse.urlsplit(url)
        if parsed.query:
            urllib.parse.parse_qs(parsed.query, strict_parsing=True)
    except ValueError:
        return UNREADABLE
    # As asyncpg reads it: the user and password end at the first @.
    hosts = parsed.netloc.partition("@")[2] if "@" in parsed.netloc else parsed.netloc
    # An "@" after the host: a password's "/" ended the host early (a piece
    # of digits before it read as the port; a database name holds it as %40).
    if parsed.fragment or "@" in hosts or "@" in parsed.path:
        return UNREADABLE
    for host in hosts.split(","):
        if host.startswith("["):  # [IPv6]:port
            port = host.partition("]")[2].removeprefix(":")
        else:
            port = host.partition(":")[2]
        if port and not port.isdigit():
            return UNREADABLE
    return None


# "://user:password@" of a URL the driver reads as written (no "/" or "@" in it).
_USER_AND_PASSWORD = re.compile(r"://([^:@/]*):[^@/]*@")


def masked_url(url: str) -> str:
    """The URL for messages: its password as ***. One the driver would misread
    (a password with "/" or "@" in it) shows nothing before its last "@":
    where its password ends cannot be told."""
    if url_problem(url) is not None:
        return re.sub(r"://.*@", "://***@", url, count=1)
    return _USER_AND_PASSWORD.sub(r"://\1:***@", url, count=1)


def url_to_write(url: str) -> str:
    """The URL as relay.toml should hold it: its password, if any, named as the
    ${PGPASSWORD} reference the guide uses (a file every user may read must
    not hold it). For a URL that passed url_problem."""
    return _USER_AND_PASSWORD.sub(r"://\1:${PGPASSWORD}@", url, count=1)
