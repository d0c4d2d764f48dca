"""relay.core.pgurl.url_problem as a table: URLs asyncpg reads as written pass,
URLs it would misread (a password's piece taken as a port or a database) do not."""

from __future__ import annotations

import pytest

from relay.core.pgurl import masked_url, url_problem

READ_AS_WRITTEN = [
    "postgresql://relay@db/relay",
    "postgres://relay@db/relay",
    "postgresql://relay:secret@db:5432/relay",
    "postgresql://relay:p%40ss%2Fw%3Fo%23rd%25@db/relay",  # percent-encoded @ / ? # %
    "postgresql://relay:@db/relay",
    "postgresql://relay@[::1]:5432/relay",
    "postgresql://relay@[fe80::1%25eth0]/relay",
    "postgresql://relay@h1:5432,h2:5433/relay",
    "postgresql://relay@h1,[::2]:5433/relay",
    "postgresql:///relay?host=/run/postgresql",
    "postgresql://relay@/relay?host=/run/postgresql&port=5433",
    "postgresql://%2Frun%2Fpostgresql/relay",
    "postgresql://relay@db/relay?sslmode=verify-full&sslrootcert=/etc/relay/ca.pem",
    "postgresql://relay@db/relay?options=-c%20search_path%3Drelay",
    "postgresql://relay@db",
]

MISREAD = [
    "postgresql://relay:p@ss@db/relay",  # host "ss@db"
    "postgresql://relay:pa/ss@db/relay",  # port "pa"
    "postgresql://relay:pa?ss@db/relay",
    "postgresql://relay:pa#ss@db/relay",
    # A password whose piece before its "/" is digits (base64 has "/"):
    # asyncpg reads host "relay", port 12, database "34@db/relay".
    "postgresql://relay:12/34@db/relay",
    "postgresql://relay:7/aB+c9@db/relay",
    "postgresql://relay@db:abc/relay",
    "postgresql://relay@[::1/relay",
]


@pytest.mark.parametrize("url", READ_AS_WRITTEN)
def test_a_url_the_driver_reads_as_written_passes(url: str) -> None:
    assert url_problem(url) is None


@pytest.mark.parametrize("url", MISREAD)
def test_a_url_the_driver_would_misread_is_refused_without_quoting_it(url: str) -> None:
    problem = url_problem(url)
    assert problem is not None
    assert "relay:" not in problem


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://relay:secret@db:5432/relay", "postgresql://relay:***@db:5432/relay"),
        ("postgresql://relay@db/relay", "postgresql://relay@db/relay"),
        # No user, a port, and an "@" in a query value: nothing to hide, shown as it is.
        (
            "postgresql://db.example:5432/relay?user=relay@myserver",
            "postgresql://db.example:5432/relay?user=relay@myserver",
        ),
        # One the driver would misread: nothing of it before its last "@".
        ("mysql://relay:pa/ss@db/relay", "mysql://***@db/relay"),
        ("postgresql://relay:p@ss@db/relay", "postgresql://***@db/relay"),
    ],
)
def test_a_url_is_shown_without_its_password_and_otherwise_as_written(url: str, shown: str) -> None:
    assert masked_url(url) == shown
