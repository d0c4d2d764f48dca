"""One `relay serve` per database: an exclusive lock held for the life of the process.

Each backend gives its own (`relay.store.backends`): for SQLite, a file lock
beside the database file.

Holding it also proves that no other serve process is running, so every
delivery still marked in flight was orphaned by a crash and can be taken
back at once instead of waiting for its lease to expire. The kernel drops
the lock when the process dies, kill -9 included.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Protocol


class AlreadyRunning(Exception):
    pass


class ServeLock(Protocol):
    """Held by `relay serve` from before the store opens until after it closes."""

    def acquire(self) -> None:
        """Take the lock, or raise AlreadyRunning naming who holds it."""
        ...

    def release(self) -> None: ...


def lock_path(database: Path) -> Path:
    """The lock beside the database file itself: a symlink to the same database
    under another name must meet the same lock, or two daemons would share it."""
    database = database.resolve()
    return database.with_name(database.name + ".lock")


class ProcessLock:
    """flock() on a file, never waiting: taken at once or AlreadyRunning."""

    def __init__(self, path: Path, database: Path | None = None) -> None:
        self.path = path
        self._database = database
        self._fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise AlreadyRunning(
                f"another relay serve holds {self.path} (one process per database)"
            ) from None
        self._fd = fd
        if self._database is not None:
            try:
                refuse_other_names(self._database)
            except AlreadyRunning:
                self.release()
                raise
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def refuse_other_names(database: Path) -> None:
    """A database with a second hard link is refused: a lock named after a path
    cannot see the other name, and SQLite keeps the WAL beside the name it opened,
    so a process using the other name reads the file without this one's -wal
    (delivered deliveries look pending and are sent again) and checkpoints its own
    into the shared file. SQLite's "How To Corrupt" lists multiple links to one file.
    """
    try:
        links = os.stat(database).st_nlink
    except FileNotFoundError:
        return  # created by this process: one name
    if links > 1:
        raise AlreadyRunning(
            f"{database} has {links} names (hard links): another relay could open it"
            " under the other name and send its deliveries again; keep one name"
            " (remove the other link) and start again"
        )
