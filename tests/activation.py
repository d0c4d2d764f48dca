"""A small systemd for the tests: socket activation without systemd as PID 1.

systemd is not PID 1 on the machines the tests run on, so the tests hold the
sockets themselves, as systemd does: `SocketUnits` reads the socket units in
systemd/ (ListenStream=, Backlog=, FileDescriptorName=), listens on their
sockets, and keeps them open across every `relay serve` it starts; each one
gets them as systemd passes them (sd_listen_fds(3)): from descriptor 3 on,
LISTEN_FDS, LISTEN_PID (its own pid) and LISTEN_FDNAMES. Run as a script,
this file is that last step: it moves the descriptors it is given to 3, 4...,
sets the variables and execs the command, which keeps its pid.
"""

from __future__ import annotations

import fcntl
import os
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from helpers import RelayProcess

ROOT = Path(__file__).resolve().parents[1]
UNITS = ROOT / "systemd"
LAUNCHER = [sys.executable, "-P", str(Path(__file__).resolve())]


def read_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """A unit file's directives by section, each with all its values."""
    sections: dict[str, dict[str, list[str]]] = {}
    section: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = sections.setdefault(line.strip("[]"), {})
            continue
        name, _, value = line.partition("=")
        section.setdefault(name, []).append(value)
    return sections


@dataclass(frozen=True)
class SocketUnit:
    name: str  # "relay.socket"
    listen: str  # ListenStream=, "127.0.0.1:8080"
    fd_name: str  # FileDescriptorName=, by default the unit's name
    backlog: int

    @classmethod
    def read(cls, path: Path) -> SocketUnit:
        socket_section = read_unit(path)["Socket"]
        [listen] = socket_section["ListenStream"]
        fd_name = socket_section.get("FileDescriptorName", [path.name])[-1]
        backlog = int(socket_section.get("Backlog", ["4096"])[-1])
        return cls(path.name, listen, fd_name, backlog)


def service_sockets(service: Path = UNITS / "relay.service") -> list[SocketUnit]:
    """The socket units the service names in Sockets=, read from beside it."""
    names = read_unit(service)["Service"]["Sockets"][-1].split()
    return [SocketUnit.read(service.parent / name) for name in names]


class SocketUnits:
    """The listening sockets of socket units, held as systemd holds them: open
    from `listen()` to `close()`, whatever the processes started on them do.
    Each listens on a free port of its unit's address (the units name 8080
    and 8081, which another test may hold), or, `as_written`, on its unit's."""

    def __init__(self, units: Sequence[SocketUnit], *, as_written: bool = False):
        self.units = list(units)
        self._as_written = as_written
        self.sockets: dict[str, socket.socket] = {}

    def listen(self) -> SocketUnits:
        for unit in self.units:
            host, _, port = unit.listen.rpartition(":")
            host = host.strip("[]") or "127.0.0.1"
            sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as systemd does
            sock.bind((host, int(port) if self._as_written else 0))
            sock.listen(unit.backlog)
            self.sockets[unit.name] = sock
        return self

    def close(self) -> None:
        for sock in self.sockets.values():
            sock.close()
        self.sockets.clear()

    @property
    def listening(self) -> bool:
        return bool(self.sockets)

    def url(self, unit: str) -> str:
        host, port = self.sockets[unit].getsockname()[:2]
        return f"http://{host}:{port}"

    def port(self, unit: str) -> int:
        port: int = self.sockets[unit].getsockname()[1]
        return port

    def launcher(self) -> tuple[list[str], tuple[int, ...]]:
        """The command prefix that passes these sockets to what follows it,
        and the descriptors the prefix must inherit."""
        given = [
            f"{self.sockets[unit.name].fileno()}:{unit.fd_name}"
            for unit in self.units
            if unit.name in self.sockets
        ]
        fds = tuple(sock.fileno() for sock in self.sockets.values())
        return [*LAUNCHER, *given, "--"], fds

    def relay(self, config: Path, log: Path, env: Mapping[str, str] | None = None) -> RelayProcess:
        """A `relay serve` to be started on these sockets."""
        from helpers import RelayProcess  # not at the top: run as a script, this imports nothing

        prefix, fds = self.launcher()
        return RelayProcess(config, log, env, wrapper=prefix, pass_fds=fds)


def main(argv: list[str]) -> None:
    """FD:NAME... -- COMMAND...: exec COMMAND with those descriptors at 3, 4...,
    named, as systemd execs a socket-activated service."""
    split = argv.index("--")
    given = [item.split(":", 1) for item in argv[:split]]
    # Out of the way first: a descriptor given may sit where another one goes.
    moved = [(fcntl.fcntl(int(fd), fcntl.F_DUPFD_CLOEXEC, 100), name) for fd, name in given]
    for fd, _ in given:
        os.close(int(fd))
    for target, (fd, _) in enumerate(moved, 3):
        os.dup2(fd, target)
        os.close(fd)
    os.environ["LISTEN_FDS"] = str(len(moved))
    os.environ["LISTEN_PID"] = str(os.getpid())  # exec keeps it
    os.environ["LISTEN_FDNAMES"] = ":".join(name for _, name in moved)
    command = argv[split + 1 :]
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
