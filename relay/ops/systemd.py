"""systemd's notify protocol, spoken directly: one datagram to $NOTIFY_SOCKET.

READY=1 once both listeners are bound and the store is open; WATCHDOG=1 at
half of $WATCHDOG_USEC, sent from the event loop and only while the
scheduler keeps ticking, so a stuck loop or a stuck scheduler lets systemd's
watchdog fire; STATUS= a one-line summary; RELOADING=1 / READY=1 around a
reload; STOPPING=1 on shutdown. Without the variables every call is a no-op.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Mapping

log = logging.getLogger("relay.systemd")


class Notifier:
    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET", "")
        if address.startswith("@"):  # an abstract socket
            address = "\0" + address[1:]
        self._address = address or None
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        for_us = not pid or pid == str(os.getpid())
        self.watchdog_interval = int(usec) / 1e6 if usec.isdigit() and for_us else None

    @property
    def enabled(self) -> bool:
        return self._address is not None

    def send(self, *fields: str) -> None:
        if self._address is None:
            return
        message = "\n".join(fields).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.sendto(message, self._address)
        except OSError as error:
            log.warning("cannot notify systemd: %s", error)

    def ready(self, status: str) -> None:
        self.send("READY=1", f"STATUS={status}")

    def reloading(self) -> None:
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        self.send("RELOADING=1", f"MONOTONIC_USEC={usec}")

    def status(self, line: str) -> None:
        self.send(f"STATUS={line}")

    def stopping(self) -> None:
        self.send("STOPPING=1", "STATUS=stopping: finishing attempts in flight")


async def watchdog(
    notifier: Notifier,
    alive: Callable[[float], bool],
    summary: Callable[[], Awaitable[str]],
    *,
    status_every: float = 10.0,
) -> None:
    """Ping the watchdog at half its interval while `alive(interval)` holds,
    and refresh the status line every `status_every` seconds."""
    interval = notifier.watchdog_interval
    period = min(interval / 2, status_every) if interval else status_every
    last_status = float("-inf")
    while True:
        if interval and alive(interval):
            notifier.send("WATCHDOG=1")
        elif interval:
            log.error("scheduler has not ticked for %gs: letting the watchdog fire", interval)
        if time.monotonic() - last_status >= status_every:
            try:
                notifier.status(await summary())
            except Exception as error:  # a status line must never stop the pings
                log.debug("no status line: %s", error)
            last_status = time.monotonic()
        await asyncio.sleep(period)
