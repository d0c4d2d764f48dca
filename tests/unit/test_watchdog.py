"""The notify protocol on a real unix socket, and a watchdog that stops with the loop."""

from __future__ import annotations

import asyncio
import os
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from relay.ops.systemd import Notifier, watchdog

from helpers import Timeline


class NotifySocket:
    """A datagram socket like systemd's; a thread stamps each message on arrival.

    `path` is what NOTIFY_SOCKET says. An abstract socket ("@name") is reached
    from any mount namespace and by any uid, as the deploy test needs."""

    def __init__(self, *, abstract: bool = False) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.folder: str | None = None
        if abstract:
            self.path = f"@relay-notify-{os.getpid()}-{time.monotonic_ns()}"
            self.sock.bind("\0" + self.path[1:])
        else:
            self.folder = tempfile.mkdtemp(prefix="notify-", dir="/tmp")
            self.path = str(Path(self.folder, "s"))
            self.sock.bind(self.path)
        self.sock.settimeout(0.02)  # how soon close() ends the reader
        self.messages: list[tuple[float, str]] = []
        self._marks = 0
        self._seen = 0  # messages sent_so_far has returned
        self._stop = False
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop:
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            self.messages.append((time.monotonic(), data.decode()))

    def close(self) -> None:
        self._stop = True
        self._thread.join()
        self.sock.close()
        if self.folder is not None:
            Path(self.path).unlink(missing_ok=True)
            Path(self.folder).rmdir()

    def pings(self) -> list[float]:
        return [at for at, text in self.messages if text == "WATCHDOG=1"]

    def texts(self) -> list[str]:
        return [text for _, text in self.messages]

    def wait_for(self, count: int, timeout: float = 5.0) -> None:
        """Until `count` messages have arrived (the reader is a thread)."""
        deadline = time.monotonic() + timeout
        while len(self.messages) < count:
            assert time.monotonic() < deadline, f"{len(self.messages)} of {count} messages"
            time.sleep(0.002)

    def sent_so_far(self, notifier: Notifier) -> list[str]:
        """What was sent since the last call, all arrived: a mark sent after
        it arrives last (datagrams on a unix socket keep their order)."""
        self._marks += 1
        mark = f"MARK={self._marks}"
        notifier.send(mark)
        deadline = time.monotonic() + 5.0
        while mark not in self.texts():
            assert time.monotonic() < deadline, "the mark never arrived"
            time.sleep(0.002)
        texts = self.texts()
        at = texts.index(mark)
        new = [text for text in texts[self._seen : at] if not text.startswith("MARK=")]
        self._seen = at + 1
        return new


@pytest.fixture
def notify() -> Iterator[NotifySocket]:
    sock = NotifySocket()
    yield sock
    sock.close()


def test_no_socket_means_no_op() -> None:
    notifier = Notifier({})
    assert not notifier.enabled
    notifier.ready("x")  # nothing to send to, nothing raised


def test_messages_arrive_as_datagrams(notify: NotifySocket) -> None:
    notifier = Notifier({"NOTIFY_SOCKET": notify.path})
    notifier.ready("pending 0")
    notifier.reloading()
    notifier.stopping()
    notify.wait_for(3)
    texts = notify.texts()
    assert texts[0] == "READY=1\nSTATUS=pending 0"
    assert texts[1].startswith("RELOADING=1\nMONOTONIC_USEC=")
    assert texts[2].startswith("STOPPING=1")


def test_watchdog_for_another_pid_is_ignored() -> None:
    notifier = Notifier({"NOTIFY_SOCKET": "/x", "WATCHDOG_USEC": "100000", "WATCHDOG_PID": "1"})
    assert notifier.watchdog_interval is None


async def test_pings_at_half_the_interval_stop_while_the_scheduler_is_stuck(
    notify: NotifySocket,
) -> None:
    notifier = Notifier({"NOTIFY_SOCKET": notify.path, "WATCHDOG_USEC": "100000"})
    timeline = Timeline()
    healthy = True
    asked: list[float] = []

    def alive(within: float) -> bool:
        asked.append(within)
        return healthy

    async def summary() -> str:
        return f"at {timeline.now:.2f}"

    task = asyncio.create_task(
        watchdog(
            notifier,
            alive,
            summary,
            status_every=0.2,
            monotonic=timeline.monotonic,
            sleep=timeline.sleep,
        )
    )
    await timeline.advance(0.5)
    said = notify.sent_so_far(notifier)
    # Every 50 ms from 0 to 0.5 s, and the status line every 0.2 s.
    assert said.count("WATCHDOG=1") == 11
    assert [t for t in said if t.startswith("STATUS=")] == [
        "STATUS=at 0.00",
        "STATUS=at 0.20",
        "STATUS=at 0.40",
    ]
    assert set(asked) == {0.1}  # the scheduler must have ticked within the interval

    healthy = False  # the scheduler stopped ticking: the watchdog must be let to fire
    await timeline.advance(0.5)
    said = notify.sent_so_far(notifier)
    assert "WATCHDOG=1" not in said
    assert len([t for t in said if t.startswith("STATUS=")]) == 2  # the status goes on

    healthy = True
    await timeline.advance(0.1)
    assert notify.sent_so_far(notifier).count("WATCHDOG=1") == 2
    task.cancel()


async def test_pings_come_from_the_event_loop_and_stop_while_it_is_blocked(
    notify: NotifySocket,
) -> None:
    """Real time, as the point needs: a ping every 20 ms, and the loop stuck
    for ten of them. A pinger on a thread of its own would ping on."""
    notifier = Notifier({"NOTIFY_SOCKET": notify.path, "WATCHDOG_USEC": "40000"})

    async def summary() -> str:
        return "ok"

    task = asyncio.create_task(watchdog(notifier, lambda _: True, summary))
    await asyncio.sleep(0.05)  # a few pings
    blocked_at = time.monotonic()
    time.sleep(0.2)  # noqa: ASYNC251 - the point: the event loop is stuck meanwhile
    unblocked_at = time.monotonic()
    await asyncio.sleep(0.05)
    task.cancel()
    notify.sent_so_far(notifier)  # every ping sent has arrived
    pings = notify.pings()
    assert [at for at in pings if blocked_at + 0.05 < at < unblocked_at] == []
    assert any(at > unblocked_at for at in pings)  # and the loop, free again, pings
