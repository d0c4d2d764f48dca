"""`relay check` on a PostgreSQL config: the URL shown without its password,
and a warning when the server would let an acknowledged event be lost."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import relay_cli, write_config
from pgcluster import commits_off

pytestmark = pytest.mark.postgres


def config(tmp_path: Path, url: str = "${RELAY_DB_URL}") -> Path:
    return write_config(
        tmp_path / "relay.toml",
        {
            "storage": {"url": url},
            "targets": {"crm": {"type": "file", "path": str(tmp_path / "out.jsonl")}},
            "routes": {"orders": {"path": "/hooks/orders", "targets": ["crm"]}},
        },
    )


async def test_check_warns_when_commits_are_not_synchronous(pg_url: str, tmp_path: Path) -> None:
    path = config(tmp_path)
    clean = relay_cli("check", "--config", str(path), env={"RELAY_DB_URL": pg_url})
    assert "storage: PostgreSQL" in clean.stdout
    assert "PostgreSQL server" not in clean.stdout
    # The database's own setting, as a careless operator would leave it.
    await commits_off(pg_url)
    warned = relay_cli("check", "--config", str(path), env={"RELAY_DB_URL": pg_url})
    assert "warning: the PostgreSQL server runs with synchronous_commit = off" in warned.stdout


def test_check_says_when_the_server_cannot_be_reached(tmp_path: Path) -> None:
    # The documented form: only the password from the environment; no server there.
    path = config(tmp_path, f"postgresql://relay:${{PGPW}}@/relay?host={tmp_path}")
    result = relay_cli("check", "--config", str(path), env={"PGPW": "s3cret-pw"})
    assert "storage: PostgreSQL postgresql://***@/relay" in result.stdout
    assert "warning: cannot reach postgresql://***@/relay" in result.stdout
    assert "s3cret-pw" not in result.stdout + result.stderr
