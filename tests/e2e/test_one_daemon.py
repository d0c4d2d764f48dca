"""One `relay serve` per database, however the database path is spelled.

Before: the lock file was named after the configured path, so a second daemon
whose path was a symlink to the same database took its own lock, "recovered"
the first one's in-flight deliveries and sent every event twice.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import RelayProcess, write_config


def config(path: Path, database: str) -> Path:
    return write_config(
        path,
        {
            "storage": {"path": database},
            "targets": {"audit": {"type": "file", "path": "audit.jsonl"}},
            "routes": {"orders": {"path": "/orders", "targets": ["audit"]}},
        },
    )


def test_a_symlinked_database_path_meets_the_same_lock(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    first = RelayProcess(config(tmp_path / "a.toml", "data/relay.db"), tmp_path / "a.log").start()
    try:
        (tmp_path / "link.db").symlink_to(tmp_path / "data" / "relay.db")
        second = RelayProcess(config(tmp_path / "b.toml", "link.db"), tmp_path / "b.log")
        try:
            with pytest.raises(AssertionError, match="exited"):
                second.start()
        finally:
            second.stop()  # only if it did start
        assert "another relay serve holds" in second.log()
    finally:
        assert first.stop() == 0


def test_a_hard_linked_database_is_refused(tmp_path: Path) -> None:
    """A second name for the same file (a hard link) escapes any lock named after
    a path, and worse: SQLite keeps the WAL beside the name it opened, so a second
    daemon on link.db reads the file without the first one's relay.db-wal, sees
    delivered deliveries as pending and sends them again (seen: a delivered event
    sent a second time), then checkpoints its own WAL into the shared file. SQLite
    lists "multiple links to the same file" among the ways to corrupt a database
    (https://www.sqlite.org/howtocorrupt.html, "Multiple links to the same file")."""
    (tmp_path / "data").mkdir()
    first = RelayProcess(config(tmp_path / "a.toml", "data/relay.db"), tmp_path / "a.log").start()
    try:
        (tmp_path / "link.db").hardlink_to(tmp_path / "data" / "relay.db")
        second = RelayProcess(config(tmp_path / "b.toml", "link.db"), tmp_path / "b.log")
        try:
            with pytest.raises(AssertionError, match="exited"):
                second.start()
        finally:
            second.stop()
        [line] = [x for x in second.log().splitlines() if "hard link" in x]
        assert "link.db" in line
    finally:
        assert first.stop() == 0
