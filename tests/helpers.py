"""Small helpers shared by the tests: TOML writing, a recording target server, waiting."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from relay.core.outcome import Outcome, Verdict
from relay.delivery.step import Attempted, settle
from relay.delivery.step import Down as Hold
from relay.store import (
    AttemptKind,
    AttemptRecord,
    ClaimedDelivery,
    FailureStreak,
    History,
    Queue,
    Step,
    TargetHealth,
    Transition,
    Waits,
)

# How tests start relay in a process of its own. -P: not the working
# directory first on sys.path, where `-m relay` run from a checkout would
# import the checkout's pure sources even in the run against the compiled
# wheel (.ci/run, tests/unit/test_compiled.py).
RELAY = [sys.executable, "-P", "-m", "relay"]


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        return f'"{escaped}"'
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f'"{k}" = {toml_value(v)}' for k, v in value.items()) + " }"
    raise TypeError(type(value))


# Tables written inline ({ a = "b" }) rather than as [sections].
INLINE_TABLES = frozenset({"headers", "form", "response"})


def to_toml(data: Mapping[str, Any], prefix: str = "") -> str:
    """Nested dicts as TOML: dicts become [sections], except the INLINE_TABLES keys."""
    lines = [f"[{prefix}]"] if prefix else []
    sections = []
    for key, value in data.items():
        if isinstance(value, dict) and key not in INLINE_TABLES:
            sections.append(to_toml(value, f"{prefix}.{key}" if prefix else key))
        else:
            lines.append(f"{toml_value(key) if '.' in key else key} = {toml_value(value)}")
    return "\n".join(lines) + "\n\n" + "".join(sections)


def write_config(path: Path, data: Mapping[str, Any]) -> Path:
    """Write a relay config; both listeners take free ports unless told otherwise."""
    data = {"admin": {"listen": "127.0.0.1:0"}, **data}
    data["server"] = {"listen": "127.0.0.1:0", **data.get("server", {})}
    path.write_text(to_toml(data), encoding="utf-8")
    return path


def orders_config(path: Path, **sections: Mapping[str, Any]) -> Path:
    """A relay whose one route, /orders, stores into a file target: what a
    test of the listeners or the store needs and no more."""
    return write_config(
        path,
        {
            "storage": {"path": "relay.db"},
            "targets": {"audit": {"type": "file", "path": "audit.jsonl"}},
            "routes": {"orders": {"path": "/orders", "targets": ["audit"]}},
            **sections,
        },
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Received:
    method: str
    path: str
    headers: CIMultiDict[str]
    body: bytes
    at: float


Responder = Callable[[web.Request, int], Awaitable[web.StreamResponse] | web.StreamResponse]


@dataclass
class Sink:
    """A target stand-in: records every request and answers by a script.

    `script` is a list of statuses (the last one repeats) or a function of the
    request and its 0-based number.
    """

    script: list[int] | Responder = field(default_factory=lambda: [200])
    requests: list[Received] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        number = len(self.requests)
        body = await request.read()
        self.requests.append(
            Received(
                request.method, request.path_qs, CIMultiDict(request.headers), body, time.time()
            )
        )
        self.arrived.set()
        if callable(self.script):
            result = self.script(request, number)
            if asyncio.iscoroutine(result):
                result = await result
            assert isinstance(result, web.StreamResponse)
            return result
        status = self.script[min(number, len(self.script) - 1)]
        return web.Response(status=status, text=f"answer {number}: {status}")

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    async def wait_for(self, count: int, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.requests) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"sink got {len(self.requests)} requests, wanted {count}")
            self.arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.arrived.wait(), 0.1)


class Timeline:
    """Monotonic time that moves when the test moves it, for the code that takes
    `monotonic` and `sleep` or `wait` (relay.ops.systemd.watchdog,
    relay.background.memory): a sleep ends once the test has moved time past
    it; a wait then, or as soon as its event is set."""

    STEP = 0.01

    def __init__(self) -> None:
        self.now = 0.0
        self._moved = asyncio.Event()  # set, and replaced, at each step

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        until = self.now + seconds
        while self.now < until - 1e-9:
            await self._moved.wait()

    async def wait(self, event: asyncio.Event, seconds: float) -> None:
        until = self.now + seconds
        while not event.is_set() and self.now < until - 1e-9:
            waiters = [asyncio.create_task(self._moved.wait()), asyncio.create_task(event.wait())]
            _, pending = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            for waiter in pending:
                waiter.cancel()

    async def advance(self, seconds: float) -> None:
        """Move on in steps; at each (and before the first), whatever is due
        runs before time moves again."""
        end = self.now + seconds
        await self.settle()
        while self.now < end - 1e-9:
            self.now = min(end, self.now + self.STEP)
            moved, self._moved = self._moved, asyncio.Event()
            moved.set()
            await self.settle()

    @staticmethod
    async def settle() -> None:
        """A few turns of the loop: what was woken runs up to its next wait."""
        for _ in range(10):
            await asyncio.sleep(0)


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    """Poll `check` until it holds; for state reached by another process."""
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.02)


async def post_events(url: str, count: int, *, parallel: int = 32) -> None:
    """POST `count` empty JSON events with keys k0…k{count-1}; each must be accepted."""
    connector = aiohttp.TCPConnector(limit=parallel)
    async with aiohttp.ClientSession(connector=connector) as http:

        async def one(i: int) -> None:
            async with http.post(url, data=b"{}", headers={"Idempotency-Key": f"k{i}"}) as response:
                assert response.status == 200, await response.text()

        await asyncio.gather(*(one(i) for i in range(count)))


async def post_accepted(
    http: aiohttp.ClientSession,
    url: str,
    body: bytes = b'{"n": 1}',
    headers: Mapping[str, str] | None = None,
) -> int:
    """POST one JSON webhook that must be accepted; the event id relay answers with."""
    async with http.post(
        url, data=body, headers={"Content-Type": "application/json", **(headers or {})}
    ) as response:
        assert response.status == 200, await response.text()
        return int((await response.json())["id"])


class RelayProcess:
    """`relay serve` in a subprocess, as a user runs it. Stopped by its own PID:
    by the test, and whatever happens to the test (a failure, a timeout that
    skips its `finally`), by conftest's `no_relay_left_running` after it."""

    started: ClassVar[list[RelayProcess]] = []  # every one started, until reaped

    @classmethod
    def reap(cls) -> list[int]:
        """Kill every relay started and still running; their PIDs."""
        killed = []
        for relay in cls.started:
            process = relay.process
            if process is not None and process.poll() is None:
                process.kill()
                process.wait(timeout=30)
                killed.append(process.pid)
        cls.started.clear()
        return killed

    def __init__(
        self,
        config_path: Path,
        log_path: Path,
        env: Mapping[str, str] | None = None,
        *,
        max_open_files: int | None = None,
        wrapper: Sequence[str] = (),
        pass_fds: Sequence[int] = (),
    ) -> None:
        self.config_path = config_path
        # A command that execs `relay serve` (keeping its pid), and the
        # descriptors it inherits: tests/activation.py passes sockets so.
        self.wrapper = list(wrapper)
        self.pass_fds = tuple(pass_fds)
        self.log_path = log_path
        # A fatal signal makes Python print every thread's stack: a relay that
        # does not stop is sent SIGABRT, so its log says where it was stuck.
        self.env = {**os.environ, "PYTHONFAULTHANDLER": "1", **(env or {})}
        self.max_open_files = max_open_files  # `ulimit -n` for the process
        self.process: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.admin_url = ""

    def start(self, timeout: float = 15.0) -> RelayProcess:
        log = self.log_path.open("ab")
        self._log_offset = self.log_path.stat().st_size
        self.process = subprocess.Popen(
            [*self.wrapper, *RELAY, "serve", "--config", str(self.config_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env,
            preexec_fn=self._limit if self.max_open_files else None,
            pass_fds=self.pass_fds,
        )
        RelayProcess.started.append(self)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.log_path.open("rb") as written:  # this run's part of a log many share
                written.seek(self._log_offset)
                text = written.read().decode(errors="replace")
            match = re.search(r"ingress on (http://\S+?),", text)
            if match:
                self.url = match.group(1)
                admin = re.search(r"admin on (http://\S+?),", text)
                self.admin_url = admin.group(1) if admin else ""
                return self
            if self.process.poll() is not None:
                raise AssertionError(f"relay serve exited {self.process.returncode}:\n{text}")
            time.sleep(0.02)
        raise AssertionError("relay serve did not get ready:\n" + self.log_path.read_text())

    def _limit(self) -> None:
        assert self.max_open_files is not None
        resource.setrlimit(resource.RLIMIT_NOFILE, (self.max_open_files, self.max_open_files))

    def kill(self, signum: int = signal.SIGKILL) -> int:
        assert self.process is not None
        self.process.send_signal(signum)
        try:
            return self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.send_signal(signal.SIGABRT)  # stacks into the log
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            raise AssertionError(
                f"relay did not exit within 30 s of signal {signum}; its log ends:\n"
                + self.log()[-8000:]
            ) from None

    def stop(self) -> int:
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else 0
        return self.kill(signal.SIGTERM)

    async def astop(self) -> int:
        """Stop without blocking the test's event loop (its servers must keep answering)."""
        return await asyncio.to_thread(self.stop)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def relay_cli(
    *args: str, check: bool = True, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [*RELAY, *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        env={**os.environ, **(env or {})},
    )
    if check and result.returncode != 0:
        raise AssertionError(f"relay {' '.join(args)} exited {result.returncode}: {result.stderr}")
    return result


def relay_json(*args: str, env: Mapping[str, str] | None = None) -> Any:
    return json.loads(relay_cli(*args, "--json", env=env).stdout)


async def arelay_cli(
    *args: str, check: bool = True, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`relay_cli` off the event loop, so in-test servers keep answering meanwhile."""
    return await asyncio.to_thread(relay_cli, *args, check=check, env=env)


async def arelay_json(*args: str, env: Mapping[str, str] | None = None) -> Any:
    return json.loads((await arelay_cli(*args, "--json", env=env)).stdout)


class ForwardingProxy:
    """An HTTP proxy on 127.0.0.1, as Squid or tinyproxy behave for relay:
    CONNECT host:port opens a tunnel (answered 200, then bytes both ways); a
    request in absolute form (`POST http://host:port/path`) is sent on in
    origin form with `Connection: close`. Each request line is recorded with
    its Proxy-Authorization; with `credentials` ("user:password") any other
    gets 407 (RFC 9110 section 15.5.8)."""

    def __init__(self, credentials: str | None = None) -> None:
        self.credentials = credentials
        self.seen: list[tuple[str, str | None]] = []  # (request line, Proxy-Authorization)
        self.url = ""
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        return self.url

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        upstream: asyncio.StreamWriter | None = None
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, target, version = lines[0].split(" ")
            fields = [line.split(":", 1) for line in lines[1:] if ":" in line]
            given = {name.strip().lower(): value.strip() for name, value in fields}
            authorization = given.get("proxy-authorization")
            self.seen.append((lines[0], authorization))
            if self.credentials is not None:
                expected = "Basic " + base64.b64encode(self.credentials.encode()).decode()
                if authorization != expected:
                    writer.write(
                        b"HTTP/1.1 407 Proxy Authentication Required\r\n"
                        b'Proxy-Authenticate: Basic realm="proxy"\r\n'
                        b"Content-Length: 0\r\nConnection: close\r\n\r\n"
                    )
                    await writer.drain()
                    return
            if method == "CONNECT":
                host, _, port = target.rpartition(":")
                try:
                    up_reader, upstream = await asyncio.open_connection(host.strip("[]"), int(port))
                except OSError:
                    writer.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
                    await writer.drain()
                    return
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                await writer.drain()
            else:
                where = target.split("://", 1)[1]
                authority, _, path = where.partition("/")
                host, _, port = (
                    authority.rpartition(":") if ":" in authority else (authority, "", "80")
                )
                try:
                    up_reader, upstream = await asyncio.open_connection(host.strip("[]"), int(port))
                except OSError:  # a name that does not resolve too: 502, as Squid answers
                    writer.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
                    await writer.drain()
                    return
                kept = [
                    line
                    for line in lines[1:]
                    if line and not line.lower().startswith(("proxy-authorization:", "connection:"))
                ]
                rewritten = [f"{method} /{path} {version}", *kept, "Connection: close", "", ""]
                upstream.write("\r\n".join(rewritten).encode("latin-1"))
            await asyncio.gather(_pipe(reader, upstream), _pipe(up_reader, writer))
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError, ValueError):
            pass
        finally:
            if upstream is not None:
                upstream.close()
            writer.close()
            self._tasks.discard(task)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.write_eof()


def admin_credentials(folder: Path, token: str = "0123456789abcdef0123") -> dict[str, str]:
    """What systemd's LoadCredential= gives the starter config's admin token
    (`${file:relay_admin_token}`): a folder with the file, in the environment."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "relay_admin_token").write_text(token + "\n")
    return {"CREDENTIALS_DIRECTORY": str(folder)}


async def record(
    store: Queue,
    delivery: ClaimedDelivery,
    attempt: AttemptRecord,
    then: Transition,
    now: float,
    hold: Hold | None = None,
) -> FailureStreak:
    """Record `attempt`, its delivery going on to `then` as the test says, and
    its target's health as relay.delivery.step settles it (`hold`: the
    hold_when_down rule of this attempt). The store's half of the step, told."""
    return (await recorded(store, delivery, attempt, then, now, hold)).streak


async def recorded(
    store: Queue,
    delivery: ClaimedDelivery,
    attempt: AttemptRecord,
    then: Transition,
    now: float,
    hold: Hold | None = None,
) -> Step:
    """`record`, answering the whole Step the store wrote."""
    attempted = Attempted(
        delivery,
        Outcome(
            Verdict(attempt.outcome),
            attempt.http_status,
            attempt.error,
            target_at_fault=attempt.target_at_fault,
        ),
        now,
        probe=attempt.kind is AttemptKind.PROBE or (hold is not None and hold.probe),
    )
    in_cycle = attempted.kind is AttemptKind.CYCLE and not isinstance(then, Waits)

    def told(health: TargetHealth, history: History) -> Step:
        return settle(then, attempted, hold, health, history, in_cycle=in_cycle)

    return await store.record_attempt(delivery, attempt, told, now)
