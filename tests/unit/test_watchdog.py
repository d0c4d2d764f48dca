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
        self.sock.settimeout(0.1)
        self.messages: list[tuple[float, str]] = []
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
    time.sleep(0.3)
    texts = [text for _, text in notify.messages]
    assert texts[0] == "READY=1\nSTATUS=pending 0"
    assert texts[1].startswith("RELOADING=1\nMONOTONIC_USEC=")
    assert texts[2].startswith("STOPPING=1")


def test_watchdog_for_another_pid_is_ignored() -> None:
    notifier = Notifier({"NOTIFY_SOCKET": "/x", "WATCHDOG_USEC": "100000", "WATCHDOG_PID": "1"})
    assert notifier.watchdog_interval is None


async def test_pings_stop_while_the_loop_is_blocked_or_the_scheduler_is_stuck(
    notify: NotifySocket,
) -> None:
    notifier = Notifier({"NOTIFY_SOCKET": notify.path, "WATCHDOG_USEC": "100000"})
    healthy = True

    async def summary() -> str:
        return "ok"

    task = asyncio.create_task(watchdog(notifier, lambda _: healthy, summary))
    await asyncio.sleep(0.3)
    assert len(notify.pings()) >= 4  # every 50 ms

    blocked_at = time.monotonic()
    time.sleep(0.4)  # noqa: ASYNC251 - the point: the event loop is stuck meanwhile
    unblocked_at = time.monotonic()
    await asyncio.sleep(0.2)
    during = [at for at in notify.pings() if blocked_at + 0.06 < at < unblocked_at]
    assert during == []

    healthy = False  # the scheduler stopped ticking: the watchdog must be let to fire
    await asyncio.sleep(0.1)
    count = len(notify.pings())
    await asyncio.sleep(0.3)
    assert len(notify.pings()) == count
    task.cancel()
