"""Checkpoints beside the writer, not inside its commits.

SQLite copies the WAL back into the database file (a checkpoint: the copy and
an fsync of the database file) inside whichever COMMIT takes the WAL past
`wal_autocheckpoint` pages. That commit's senders, and every one queued
behind it, wait for it. For a lone sender at SQLite's default of 1,000 pages
more than one answer in a hundred waited for a checkpoint, so its p99 was
the checkpoint's length (bench/lone_sender.py; the figures: bench/RESULTS.md).

Here a thread of its own, on a connection of its own, runs SQLite's PASSIVE
checkpoint a moment after commits: it takes no lock a writer needs, so the
writer goes on committing meanwhile. It cannot always finish: frames
committed during a checkpoint are left for the next one, and SQLite only
starts the WAL over once a checkpoint has copied all of it. So the writer
keeps SQLite's own checkpoint too, at BACKSTOP_PAGES: by then nearly all of
the WAL has been copied here, its checkpoint is short, and it starts the WAL
over. So the WAL stays near BACKSTOP_PAGES at most, whatever this thread
manages (a commit whose checkpoint finds this thread's under way leaves it to
the next commit).

Durability does not depend on any of this: a webhook is on disk once its
commit's WAL frames are fsynced. A checkpoint only moves committed pages.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable

log = logging.getLogger("relay.store")

# The writer's own wal_autocheckpoint while this thread runs (pages, 4 KiB
# each): a bound on the WAL's size, reached only when commits keep coming
# faster than each checkpoint here can finish.
BACKSTOP_PAGES = 4000
# A checkpoint at most this often: each is an fsync of the database file
# beside the writer's fsyncs of the WAL. Frames wait about this long to be
# copied, so the writer's own checkpoint at BACKSTOP_PAGES finds little left.
PAUSE_SECONDS = 0.02


class Checkpointer:
    """A thread that checkpoints the WAL soon after the writer commits."""

    def __init__(
        self, connect: Callable[[], sqlite3.Connection], *, pause: float = PAUSE_SECONDS
    ) -> None:
        self._connect = connect
        self._pause = pause
        self._due = threading.Event()  # something was committed since the last checkpoint
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.checkpoints = 0  # checkpoints run so far

    def start(self) -> None:
        """Open the connection and start the thread; raises what opening raised."""
        connection = self._connect()
        self._stopping.clear()
        self._thread = threading.Thread(
            target=self._run, args=(connection,), name="relay-checkpointer", daemon=True
        )
        self._thread.start()

    def committed(self) -> None:
        """The writer committed: checkpoint soon. (Called on the writer's thread
        once a batch; setting an event already set costs well under a µs.)"""
        self._due.set()

    def stop(self) -> None:
        """End the thread and close its connection; a checkpoint under way finishes first."""
        self._stopping.set()
        self._due.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()

    def _run(self, connection: sqlite3.Connection) -> None:
        failing = False
        try:
            while True:
                self._due.wait()
                if self._stopping.is_set():
                    return
                self._due.clear()
                try:
                    connection.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                    self.checkpoints += 1
                    failing = False
                except sqlite3.Error as error:
                    # The writer's own checkpoint at BACKSTOP_PAGES still
                    # bounds the WAL; said once a spell, not 50 times a second.
                    (log.debug if failing else log.warning)(
                        "checkpoint beside the writer failed (the writer's own"
                        " checkpoints go on): %s",
                        error,
                    )
                    failing = True
                if self._stopping.wait(self._pause):
                    return
        finally:
            connection.close()
