"""systemd's protocols, spoken directly: notify, and socket activation.

Notify: one datagram to $NOTIFY_SOCKET. READY=1 once both listeners are
bound and the store is open; WATCHDOG=1 at half of $WATCHDOG_USEC, sent from
the event loop and only while the scheduler keeps ticking, so a stuck loop or
a stuck scheduler lets systemd's watchdog fire; STATUS= a one-line summary;
RELOADING=1 / READY=1 around a reload; STOPPING=1 on shutdown. Without the
variables every call is a no-op.

Socket activation (sd_listen_fds(3)): systemd holds the listening sockets
(systemd/relay.socket, relay-admin.socket) and passes them to each `relay
serve` it starts, from descriptor 3 on, named by FileDescriptorName=. While
relay restarts, connections wait in the sockets' queue instead of being refused.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping

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
    monotonic: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
) -> None:
    """Ping the watchdog at half its interval while `alive(interval)` holds,
    and refresh the status line every `status_every` seconds.

    Time is monotonic, never the wall clock: a clock stepped back must not
    hold the pings. Pings go from the event loop (`sleep` is the loop's), so
    a stuck loop stops them; tests pass their own `monotonic` and `sleep`."""
    interval = notifier.watchdog_interval
    period = min(interval / 2, status_every) if interval else status_every
    last_status = float("-inf")
    while True:
        if interval and alive(interval):
            notifier.send("WATCHDOG=1")
        elif interval:
            log.error("scheduler has not ticked for %gs: letting the watchdog fire", interval)
        if monotonic() - last_status >= status_every:
            try:
                notifier.status(await summary())
            except Exception as error:  # a status line must never stop the pings
                log.debug("no status line: %s", error)
            last_status = monotonic()
        await sleep(period)


# The first descriptor systemd passes (SD_LISTEN_FDS_START).
LISTEN_FDS_START = 3
# The queue of connections not yet accepted, as relay asks for it and as the
# socket units' Backlog= sets it (a test holds them equal): while one relay
# process stops and the next starts, this many connections wait in it.
BACKLOG = 1024
# The names relay takes, each the FileDescriptorName= of one socket unit:
# systemd gives every descriptor of a unit the same name, so each listener has
# a unit of its own, and relay never guesses which is which from an address.
LISTENERS = ("ingress", "admin")
_VARIABLES = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")


class ActivationError(Exception):
    """The sockets systemd passed cannot be used as they are: one line for the log."""


def inherited_listeners(
    environ: MutableMapping[str, str] | None = None, *, start: int = LISTEN_FDS_START
) -> dict[str, socket.socket]:
    """The listening sockets systemd passed, by name ("ingress", "admin"); none
    when it passed none (relay then binds its listeners itself).

    As sd_listen_fds_with_names(3) with unset_environment: the variables are
    taken only when LISTEN_PID is this process (they may have been inherited
    from a parent they were meant for), and removed from the environment either
    way, so that nothing relay starts takes them for its own. The descriptors
    are closed on exec for the same reason."""
    env = os.environ if environ is None else environ
    pid, count, names = (env.pop(name, None) for name in _VARIABLES)
    if pid is None or count is None:
        return {}
    if pid != str(os.getpid()):
        log.warning(
            "LISTEN_FDS names process %s, not this one (%d): its sockets are not"
            " taken, the listeners are bound here (a wrapper that forks instead of exec?)",
            pid,
            os.getpid(),
        )
        return {}
    if not count.isdigit():
        raise ActivationError(f"LISTEN_FDS={count!r} is not a number of sockets")
    labels = names.split(":") if names else []
    if len(labels) != int(count):
        raise ActivationError(
            f"systemd passed {count} sockets named {names or 'nothing'}: name each socket unit"
            f" with FileDescriptorName= ({' or '.join(LISTENERS)}), as systemd/relay.socket does"
        )
    sockets: dict[str, socket.socket] = {}
    for fd, label in enumerate(labels, start):
        os.set_inheritable(fd, False)
        if label not in LISTENERS or label in sockets:
            again = " twice" if label in sockets else ""
            raise ActivationError(
                f"systemd passed a socket named {label!r}{again}: relay takes one named"
                f" {' and one named '.join(LISTENERS)} (FileDescriptorName= of its socket units)"
            )
        sock = socket.socket(fileno=fd)
        listening = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
        tcp = sock.family in (socket.AF_INET, socket.AF_INET6)
        if sock.type != socket.SOCK_STREAM or not listening or not tcp:
            sock.close()
            raise ActivationError(
                f"the socket named {label!r} is not a listening TCP socket"
                " (ListenStream=ADDRESS:PORT, Accept=no)"
            )
        sockets[label] = sock
    return sockets
