"""`relay init` and `relay backup`, as a user runs them."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import aiohttp
from pytest_aiohttp import AiohttpServer

from helpers import RelayProcess, Sink, arelay_cli, relay_cli, write_config

STARTER_ENV = {
    "RELAY_ADMIN_TOKEN": "0123456789abcdef0123",
    "TILDA_API_KEY": "tilda-key",
    "BITRIX_WEBHOOK_URL": "https://example.bitrix24.ru/rest/1/abc123",
    "TELEGRAM_BOT_TOKEN": "123456:AAbot",
    "TELEGRAM_CHAT_ID": "-1001234567890",
    "SMTP_HOST": "smtp.example.com",
    "SMTP_USER": "relay@example.com",
    "SMTP_PASSWORD": "pw",
    "MAIL_FROM": "relay@example.com",
    "MAIL_TO": "manager@example.com",
}


def test_init_writes_a_config_that_checks_once_its_variables_are_set(tmp_path: Path) -> None:
    path = tmp_path / "etc" / "relay.toml"
    assert "wrote" in relay_cli("init", str(path)).stdout
    unset = relay_cli("check", "--config", str(path), check=False)
    assert unset.returncode == 2
    assert "environment variable RELAY_ADMIN_TOKEN is not set" in unset.stderr
    checked = relay_cli("check", "--config", str(path), env=STARTER_ENV)
    assert "route tilda: POST /hooks/tilda" in checked.stdout
    assert "→ crm" in checked.stdout
    assert "→ sales_chat" in checked.stdout
    again = relay_cli("init", str(path), check=False)
    assert again.returncode == 2
    assert "exists" in again.stderr


async def test_backup_while_webhooks_arrive_holds_every_acknowledged_event(
    tmp_path: Path, aiohttp_server: AiohttpServer
) -> None:
    sink = Sink(script=[200])
    url = str((await aiohttp_server(sink.app())).make_url("/hook"))
    config = write_config(
        tmp_path / "relay.toml",
        {
            "targets": {"crm": {"type": "http", "url": url}},
            "routes": {"orders": {"path": "/hooks/orders", "targets": ["crm"]}},
        },
    )
    relay = RelayProcess(config, tmp_path / "relay.log").start()
    acked: list[str] = []
    try:
        async with aiohttp.ClientSession() as http:

            async def send(i: int) -> None:
                async with http.post(
                    f"{relay.url}/hooks/orders", json={"i": i}, headers={"Idempotency-Key": f"k{i}"}
                ) as response:
                    if response.status == 200:
                        acked.append(f"k{i}")

            first = asyncio.gather(*(send(i) for i in range(200)))
            await asyncio.sleep(0.05)
            backup = arelay_cli("backup", str(tmp_path / "during.db"), "--config", str(config))
            await asyncio.gather(first, backup)
            done_before = list(acked)
            await arelay_cli("backup", str(tmp_path / "after.db"), "--config", str(config))
    finally:
        await relay.astop()
    during = sqlite3.connect(tmp_path / "during.db")
    assert during.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    during.close()
    after = sqlite3.connect(tmp_path / "after.db")
    keys = {row[0] for row in after.execute("SELECT idempotency_key FROM events")}
    after.close()
    assert set(done_before) <= keys
    assert len(acked) == 200
