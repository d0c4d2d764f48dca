"""`relay serve` on sockets systemd holds (socket activation), and how it stops.

The test holds the sockets of the units in systemd/ as systemd does
(tests/activation.py) and starts `relay serve` on them: real processes, real
sockets, aiohttp servers as targets.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from pytest_aiohttp import AiohttpServer

from relay.ops.systemd import ActivationError, inherited_listeners

from activation import SocketUnits, service_sockets
from helpers import RELAY, RelayProcess, Sink, eventually, free_port, write_config


@pytest.fixture
def units() -> Iterator[SocketUnits]:
    held = SocketUnits(service_sockets()).listen()
    try:
        yield held
    finally:
        held.close()


def config_on(path: Path, units: SocketUnits, sink_url: str, **server: Any) -> Path:
    """A config whose listeners name the sockets' addresses, as the units and
    relay.toml name the same ones in a real install."""
    return write_config(
        path,
        {
            "server": {"listen": f"127.0.0.1:{units.port('relay.socket')}", **server},
            "admin": {"listen": f"127.0.0.1:{units.port('relay-admin.socket')}"},
            "storage": {"path": "relay.db"},
            "retry": {"unit": "50ms", "retries": 50, "jitter": 0, "timeout": "30s"},
            "targets": {"crm": {"type": "http", "url": sink_url}},
            "routes": {"orders": {"path": "/orders", "targets": ["crm"]}},
        },
    )


async def test_relay_serve_takes_its_listeners_from_systemd(
    tmp_path: Path, units: SocketUnits, aiohttp_server: AiohttpServer
) -> None:
    """Both listeners are the sockets passed, told apart by their names; the
    log says they came from systemd; and what the config names instead is not
    bound (the socket unit's address wins)."""
    sink = Sink()
    server = await aiohttp_server(sink.app())
    elsewhere = free_port()
    config = config_on(tmp_path / "relay.toml", units, str(server.make_url("/hook")))
    config.write_text(
        config.read_text().replace(
            f"127.0.0.1:{units.port('relay.socket')}", f"127.0.0.1:{elsewhere}"
        )
    )
    relay = units.relay(config, tmp_path / "relay.log").start()
    try:
        assert relay.url == units.url("relay.socket")
        assert relay.admin_url == units.url("relay-admin.socket")
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{relay.url}/orders", json={"n": 1}) as answer,
        ):
            assert answer.status == 200
        await sink.wait_for(1)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", elsewhere), timeout=1).close()
        log = relay.log()
        admin = units.url("relay-admin.socket").removeprefix("http://")
        ingress = units.url("relay.socket").removeprefix("http://")
        assert (
            f"listeners from systemd (socket activation): ingress on {ingress}, admin on {admin}"
            in log
        )
        assert f"server.listen is 127.0.0.1:{elsewhere}, but the ingress socket" in log
        # A reload that moves it says where the address is decided.
        config.write_text(
            config.read_text().replace(f"127.0.0.1:{elsewhere}", f"127.0.0.1:{free_port()}")
        )
        assert relay.process is not None
        relay.process.send_signal(signal.SIGHUP)

        async def told() -> bool:
            return "the ingress socket is systemd's: change ListenStream=" in relay.log()

        await eventually(told)
    finally:
        assert relay.stop() == 0


def test_sockets_meant_for_another_process_are_not_taken(tmp_path: Path) -> None:
    """LISTEN_PID names the process the sockets are for: a relay started by a
    wrapper that forked (not exec'd) must not take descriptors it does not own."""
    port = free_port()
    config = write_config(
        tmp_path / "relay.toml",
        {
            "server": {"listen": f"127.0.0.1:{port}"},
            "admin": {"enabled": False},
            "storage": {"path": "relay.db"},
            "targets": {"audit": {"type": "file", "path": "audit.jsonl"}},
            "routes": {"orders": {"path": "/orders", "targets": ["audit"]}},
        },
    )
    env = {"LISTEN_PID": "1", "LISTEN_FDS": "1", "LISTEN_FDNAMES": "ingress"}
    relay = RelayProcess(config, tmp_path / "relay.log", env).start()
    try:
        assert relay.url == f"http://127.0.0.1:{port}"  # bound by relay itself
        assert "LISTEN_FDS names process 1, not this one" in relay.log()
        assert "from systemd" not in relay.log()
    finally:
        assert relay.stop() == 0


@pytest.mark.parametrize(
    ("names", "said"),
    [
        ("", "systemd passed 2 sockets named nothing: name each socket unit"),
        ("ingress:metrics", "systemd passed a socket named 'metrics'"),
        ("ingress:ingress", "systemd passed a socket named 'ingress' twice"),
    ],
)
def test_sockets_relay_cannot_tell_apart_stop_it_with_one_line(
    tmp_path: Path, units: SocketUnits, names: str, said: str
) -> None:
    config = config_on(tmp_path / "relay.toml", units, "http://127.0.0.1:9/")
    prefix, fds = units.launcher()
    done = subprocess.run(
        [*prefix, "env", f"LISTEN_FDNAMES={names}", *RELAY, "serve", "--config", str(config)],
        pass_fds=fds,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert said in done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr


def test_the_variables_are_not_passed_on_and_the_descriptors_close_on_exec() -> None:
    """sd_listen_fds(3) with unset_environment: nothing relay starts may take
    the sockets for its own (their variables gone, their descriptors closed on exec)."""
    with socket.create_server(("127.0.0.1", 0)) as listening:
        fd = os.dup(listening.fileno())
        os.set_inheritable(fd, True)
        env = {"LISTEN_PID": str(os.getpid()), "LISTEN_FDS": "1", "LISTEN_FDNAMES": "ingress"}
        taken = inherited_listeners(env, start=fd)
        try:
            assert env == {}
            assert list(taken) == ["ingress"]
            assert taken["ingress"].getsockname() == listening.getsockname()
            assert not os.get_inheritable(fd)
        finally:
            taken["ingress"].close()
    one, other = socket.socketpair()
    with one, other, pytest.raises(ActivationError, match="not a listening TCP socket"):
        inherited_listeners(
            {"LISTEN_PID": str(os.getpid()), "LISTEN_FDS": "1", "LISTEN_FDNAMES": "admin"},
            start=os.dup(one.fileno()),
        )
    assert inherited_listeners({}) == {}


async def test_a_stop_finishes_attempts_while_webhooks_are_answered_then_ends_within_its_budget(
    tmp_path: Path, units: SocketUnits, aiohttp_server: AiohttpServer
) -> None:
    """SIGTERM: the scheduler stops claiming and the attempt in flight may
    finish, while the old process goes on answering webhooks (not queued for
    the next one); the attempt that outlasts the budget gives its lease back;
    the whole stop ends within server.shutdown_timeout; the next process, on
    the same sockets, delivers everything. Before: the ingress closed first,
    and webhooks waited (or, without systemd, were refused) until the next
    process, for as long as the attempt took."""
    hanging = asyncio.Event()

    async def first_hangs(request: web.Request, number: int) -> web.StreamResponse:
        if number == 0:
            hanging.set()
            await asyncio.sleep(60)  # longer than the stop's budget
        return web.Response(status=200)

    sink = Sink(script=first_hangs)
    server = await aiohttp_server(sink.app())
    budget = 2.0  # attempts get 1.5 s of it, webhooks the last 0.5 s
    config = config_on(
        tmp_path / "relay.toml",
        units,
        str(server.make_url("/hook")),
        shutdown_timeout=f"{budget:g}s",
    )
    relay = units.relay(config, tmp_path / "relay.log").start()
    answered: list[float] = []
    async with aiohttp.ClientSession() as http:

        async def post(n: int) -> None:
            started = time.monotonic()
            async with http.post(f"{relay.url}/orders", json={"n": n}) as answer:
                assert answer.status == 200
            answered.append(time.monotonic() - started)

        await post(0)
        await asyncio.wait_for(hanging.wait(), 10)
        assert relay.process is not None
        stopped_at = time.monotonic()
        relay.process.send_signal(signal.SIGTERM)
        exited = asyncio.create_task(asyncio.to_thread(relay.process.wait, 30))
        await asyncio.sleep(0.2)
        for n in range(1, 6):
            await post(n)
            await asyncio.sleep(0.1)
        assert not exited.done(), "relay stopped before the attempt in flight had its time"
        assert max(answered) < 0.5, answered  # answered by the stopping process, not queued
        assert await exited == 0
        took = time.monotonic() - stopped_at
        assert budget - 1 < took < budget + 1.5, took
        assert "could not release" not in relay.log()

        following = units.relay(config, tmp_path / "relay.log").start()
        try:
            await post(6)
            await sink.wait_for(8, timeout=20)  # the one given back, again, and 6 more
        finally:
            assert following.stop() == 0


def test_an_admin_socket_relay_does_not_use_is_said(tmp_path: Path, units: SocketUnits) -> None:
    config = write_config(
        tmp_path / "relay.toml",
        {
            "server": {"listen": f"127.0.0.1:{units.port('relay.socket')}"},
            "admin": {"enabled": False},
            "storage": {"path": "relay.db"},
            "targets": {"audit": {"type": "file", "path": "audit.jsonl"}},
            "routes": {"orders": {"path": "/orders", "targets": ["audit"]}},
        },
    )
    relay = units.relay(config, tmp_path / "relay.log").start()
    try:
        assert "systemd passed the admin socket, which relay does not use" in relay.log()
        assert "admin" not in relay.log().split("listeners from systemd")[1].split("\n")[0]
    finally:
        assert relay.stop() == 0
