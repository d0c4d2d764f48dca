"""Reloads and starts that cannot be applied: a real `relay serve` keeps running its
config, says so in one line, counts it, and always stops cleanly afterwards.

Each bad file here once hung the daemon: the exception left `serve()` without
`stop()`, the process kept `relay.db.lock` and ignored SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from pytest_aiohttp import AiohttpServer

from relay.app import Relay
from relay.loader import load_config

from helpers import RelayProcess, eventually, relay_cli, to_toml, write_config

pytestmark = pytest.mark.chaos


def good_config(tmp_path: Path) -> dict[str, Any]:
    return {
        "server": {"listen": "127.0.0.1:0", "shutdown_timeout": "2s"},
        "admin": {"listen": "127.0.0.1:0"},
        "storage": {"path": "relay.db"},
        "targets": {"audit": {"type": "file", "path": "out/audit.jsonl"}},
        "routes": {"orders": {"path": "/hooks/orders", "targets": ["audit"]}},
    }


def non_utf8(tmp_path: Path, text: str) -> bytes:
    # A comment saved in Windows-1251 by an editor that guessed the locale.
    return text.encode() + "# заказы с сайта\n".encode("cp1251")


def missing_ca_file(tmp_path: Path, text: str) -> bytes:
    config = good_config(tmp_path)
    config["targets"]["mail"] = {
        "type": "smtp",
        "host": "127.0.0.1",
        "tls": "starttls",
        "from": "relay@example.com",
        "to": ["ops@example.com"],
        "ca_file": "no-such-ca.pem",
    }
    return to_toml(config).encode()


def uncreatable_folder(tmp_path: Path, text: str) -> bytes:
    # A regular file where the target's folder should be: mkdir cannot make it.
    (tmp_path / "blocker").write_text("not a folder")
    return text.replace("out/audit.jsonl", "blocker/sub/audit.jsonl").encode()


def deeply_nested(tmp_path: Path, text: str) -> bytes:
    depth = 5000
    return (text + "\n[extra]\nvalue = " + "[" * depth + "]" * depth + "\n").encode()


BAD_FILES: dict[str, Callable[[Path, str], bytes]] = {
    "non_utf8": non_utf8,
    "missing_ca_file": missing_ca_file,
    "uncreatable_folder": uncreatable_folder,
    "deeply_nested": deeply_nested,
}


async def post(http: aiohttp.ClientSession, url: str, n: int) -> int:
    async with http.post(url + "/hooks/orders", json={"n": n}) as response:
        return response.status


async def metric(http: aiohttp.ClientSession, admin_url: str, line: str) -> float:
    async with http.get(admin_url + "/metrics") as response:
        for row in (await response.text()).splitlines():
            if row.startswith(line + " "):
                return float(row.split()[-1])
    return 0.0


@pytest.mark.parametrize("bad", sorted(BAD_FILES))
async def test_reload_with_a_file_that_cannot_be_applied_keeps_running(
    tmp_path: Path, bad: str
) -> None:
    path = write_config(tmp_path / "relay.toml", good_config(tmp_path))
    good_text = path.read_text()
    relay = RelayProcess(path, tmp_path / "relay.log").start()
    try:
        async with aiohttp.ClientSession() as http:
            assert await post(http, relay.url, 1) == 200
            path.write_bytes(BAD_FILES[bad](tmp_path, good_text))

            # `relay check` finds the problem first: one line, no traceback.
            checked = await asyncio.to_thread(
                relay_cli, "check", "--config", str(path), check=False
            )
            assert checked.returncode != 0, checked.stdout
            assert "Traceback" not in checked.stderr
            assert len(checked.stderr.strip().splitlines()) == 1, checked.stderr

            assert relay.process is not None
            relay.process.send_signal(signal.SIGHUP)

            async def failed() -> bool:
                return "reload failed" in relay.log()

            await eventually(failed, timeout=10)
            # The running config is kept: webhooks still land in its file target.
            assert await post(http, relay.url, 2) == 200

            async def delivered() -> bool:
                audit = tmp_path / "out" / "audit.jsonl"
                return audit.exists() and len(audit.read_text().splitlines()) == 2

            await eventually(delivered, timeout=10)
            result = 'relay_config_reloads_total{result="failed"}'
            assert await metric(http, relay.admin_url, result) == 1.0
        code = await relay.astop()
    finally:
        relay.stop()
    log = relay.log()
    assert code == 0, log
    assert "Traceback" not in log
    [line] = [row for row in log.splitlines() if "reload failed" in row]
    assert str(path.name) in line or "config" in line
    # It let go of the database: a new relay starts on it.
    path.write_text(good_text)
    again = RelayProcess(path, tmp_path / "relay.log").start()
    assert again.stop() == 0


@pytest.mark.parametrize("text", ["", "# routes moved to another file\n[log]\nlevel = 'info'\n"])
async def test_reload_with_no_routes_keeps_the_running_ones(tmp_path: Path, text: str) -> None:
    """An editor that saved an empty file (the disk was full), or a file whose
    routes were cut away: valid TOML, so the reload was applied ("reloaded: 0
    routes, 0 targets") and every webhook got 404 from then on. A running relay
    keeps its routes; `relay check` warns."""
    path = write_config(tmp_path / "relay.toml", good_config(tmp_path))
    relay = RelayProcess(path, tmp_path / "relay.log").start()
    try:
        async with aiohttp.ClientSession() as http:
            assert await post(http, relay.url, 1) == 200
            path.write_text(text)
            checked = await asyncio.to_thread(relay_cli, "check", "--config", str(path))
            assert "warning: routes: none" in checked.stdout
            assert relay.process is not None
            relay.process.send_signal(signal.SIGHUP)

            async def failed() -> bool:
                return "reload failed" in relay.log()

            await eventually(failed, timeout=10)
            assert await post(http, relay.url, 2) == 200
            result = 'relay_config_reloads_total{result="failed"}'
            assert await metric(http, relay.admin_url, result) == 1.0
        assert await relay.astop() == 0
    finally:
        relay.stop()
    [line] = [row for row in relay.log().splitlines() if "reload failed" in row]
    assert "routes: none" in line


async def test_reload_whose_new_target_cannot_start_keeps_the_running_config(
    tmp_path: Path,
) -> None:
    """A failure the file's check could not foresee (the folder became a file
    after the check): the new targets are undone and the old config stays."""
    path = write_config(tmp_path / "relay.toml", good_config(tmp_path))
    relay = Relay(load_config(path, {}))
    await relay.start(background=False)
    try:
        path.write_text(path.read_text().replace("out/audit.jsonl", "later/sub/audit.jsonl"))
        config = load_config(path, {})
        (tmp_path / "later").write_text("now a file")
        with pytest.raises(NotADirectoryError):
            await relay.reload(config)
        assert relay.config.targets["audit"].settings != config.targets["audit"].settings
    finally:
        await relay.stop()


def test_port_in_use_is_one_line_and_exit_1(tmp_path: Path) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        config = good_config(tmp_path)
        config["server"]["listen"] = f"127.0.0.1:{port}"
        path = write_config(tmp_path / "relay.toml", config)
        result = relay_cli("serve", "--config", str(path), check=False)
    finally:
        taken.close()
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    output = result.stdout + result.stderr
    errors = [line for line in output.splitlines() if "ERROR" in line or "relay:" in line]
    assert len(errors) == 1, output
    assert f"127.0.0.1:{port}" in errors[0]
    assert "in use" in errors[0]


# `relay serve` in a real process whose background task named argv[1] is killed
# (cancelled, as a bug or a stray cancel would) one second after it is ready.
KILL_A_TASK = """
import asyncio, sys
from relay import app
from relay.cli import main

started = app.Relay.start

async def start_then_kill(self, *args, **kwargs):
    await started(self, *args, **kwargs)
    def kill():
        for task in asyncio.all_tasks():
            if task.get_name() == sys.argv[1]:
                task.cancel()
    asyncio.get_running_loop().call_later(1.0, kill)

app.Relay.start = start_then_kill
sys.exit(main(["serve", "--config", sys.argv[2]]))
"""


@pytest.mark.parametrize(
    "task", ["scheduler", "alerts", "retention", "search-indexer", "database-watch"]
)
def test_a_background_task_that_dies_stops_the_process_non_zero(tmp_path: Path, task: str) -> None:
    """procrastinate's `_monitor_side_tasks`: never keep running without one of them."""
    path = write_config(tmp_path / "relay.toml", good_config(tmp_path))
    result = subprocess.run(
        [sys.executable, "-c", KILL_A_TASK, task, str(path)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "Traceback" not in output
    [died] = [line for line in output.splitlines() if " ERROR " in line]
    assert f"background task {task} was cancelled: stopping relay" in died
    assert "stopped" in output.splitlines()[-1]
    # The lock is free again: the next start (systemd's restart) works.
    again = RelayProcess(path, tmp_path / "relay.log").start()
    assert again.stop() == 0


async def test_signals_while_stopping_neither_kill_nor_reload(
    tmp_path: Path, aiohttp_server: AiohttpServer
) -> None:
    """SIGHUP's default action kills: during the shutdown's grace period (an
    attempt still in flight) a `systemctl reload` must not end relay abruptly."""
    arrived = asyncio.Event()

    async def slow(request: web.Request) -> web.Response:
        arrived.set()
        await asyncio.sleep(1.5)
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/crm", slow)
    server = await aiohttp_server(app)
    config = good_config(tmp_path)
    config["server"]["shutdown_timeout"] = "5s"
    config["targets"] = {"crm": {"type": "http", "url": str(server.make_url("/crm"))}}
    config["routes"]["orders"]["targets"] = ["crm"]
    path = write_config(tmp_path / "relay.toml", config)
    relay = RelayProcess(path, tmp_path / "relay.log").start()
    assert relay.process is not None
    try:
        async with aiohttp.ClientSession() as http:
            assert await post(http, relay.url, 1) == 200
        await asyncio.wait_for(arrived.wait(), 10)
        relay.process.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.3)
        relay.process.send_signal(signal.SIGHUP)
        relay.process.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(relay.process.wait, 20)
    finally:
        relay.stop()
    log = relay.log()
    assert code == 0, log
    assert "already stopping" in log
    assert "reload" not in log
    events = await asyncio.to_thread(relay_cli, "events", "--config", str(path), "--json")
    assert '"delivered"' in events.stdout  # the attempt in flight was allowed to finish
