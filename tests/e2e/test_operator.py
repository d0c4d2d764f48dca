"""The operator's view of a running relay: CLI and API side by side, and no secret anywhere."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from pytest_aiohttp import AiohttpServer

from helpers import (
    RelayProcess,
    Sink,
    arelay_cli,
    arelay_json,
    eventually,
    free_port,
    relay_cli,
    write_config,
)

SECRETS = {
    "RELAY_ADMIN_TOKEN": "adm-9f8e7d6c5b4a3210",
    "CRM_TOKEN": "crm-secret-5551234",
    "BOT_TOKEN": "123456:AAbot-secret-token",
    "PROXY_PASS": "pr0xy-pa55word",
}


# The same operator's day on either backend: a relay serve and some thirty
# CLI runs, the longest test there is (pytest -m slow; -m postgres).
@pytest.mark.parametrize(
    "backend",
    [
        pytest.param("sqlite", marks=pytest.mark.slow),
        pytest.param("postgres", marks=pytest.mark.postgres),
    ],
)
async def test_cli_and_api_drive_a_running_relay_and_never_show_a_secret(
    tmp_path: Path, aiohttp_server: AiohttpServer, backend: str, request: pytest.FixtureRequest
) -> None:
    def echo(request: web.Request, number: int) -> web.StreamResponse:
        # A target that echoes what it got, credentials included, and fails.
        return web.Response(status=500, text=f"{request.path} {dict(request.headers)}")

    crm = Sink(script=echo)
    crm_server = await aiohttp_server(crm.app())
    crm_base = str(crm_server.make_url(""))
    storage: dict[str, str] = {}
    env = dict(SECRETS)
    if backend == "postgres":
        storage = {"url": "${RELAY_DB_URL}"}
        env["RELAY_DB_URL"] = request.getfixturevalue("pg_url")
    config = write_config(
        tmp_path / "relay.toml",
        {
            "storage": storage,
            "admin": {"listen": "127.0.0.1:0", "token": "${RELAY_ADMIN_TOKEN}"},
            "retry": {"unit": "1ms", "retries": 2, "jitter": 0},
            "targets": {
                "crm": {
                    "type": "http",
                    "url": crm_base + "/leads",
                    "headers": {"Authorization": "Bearer ${CRM_TOKEN}"},
                },
                "bot": {"type": "http", "url": crm_base + "/bot${BOT_TOKEN}/sendMessage"},
                "proxy": {
                    "type": "http",
                    "url": f"http://relay:${{PROXY_PASS}}@127.0.0.1:{free_port()}/x",
                },
            },
            "routes": {
                "orders": {"path": "/hooks/orders", "targets": ["crm", "bot", "proxy"]},
                "tg": {
                    "path": "/hooks/tg",
                    "targets": ["crm"],
                    "source": "telegram",
                    "secret_token": "${BOT_TOKEN}",
                },
            },
        },
    )
    relay = RelayProcess(config, tmp_path / "relay.log", env=env).start()
    outputs: list[str] = []
    try:
        async with aiohttp.ClientSession() as http:
            async with http.post(
                f"{relay.url}/hooks/orders",
                json={"n": 1},
                headers={"Authorization": f"Bearer {SECRETS['CRM_TOKEN']}"},
            ) as r:
                event_id = (await r.json())["id"]

            async def dead() -> bool:
                events = await arelay_json("events", "--config", str(config), env=env)
                return events[0]["status"] == "dead" and all(
                    d["status"] == "dead" for d in events[0]["deliveries"]
                )

            await eventually(dead, timeout=20)
            headers = {"Authorization": f"Bearer {SECRETS['RELAY_ADMIN_TOKEN']}"}
            for path in (
                "/api/v1/events",
                f"/api/v1/events/{event_id}",
                "/api/v1/stats",
                "/api/v1/targets",
                "/metrics",
            ):
                async with http.get(relay.admin_url + path, headers=headers) as response:
                    assert response.status == 200
                    outputs.append(await response.text())

            # The CLI changes what the daemon does: pause, requeue, resume.
            await arelay_cli("pause", "crm", "--config", str(config), env=env)

            async def paused() -> bool:
                async with http.get(
                    relay.admin_url + "/api/v1/targets", headers=headers
                ) as response:
                    targets = {t["name"]: t for t in (await response.json())["targets"]}
                    return bool(targets["crm"]["paused"])

            await eventually(paused, timeout=5)
            before = len(crm.requests)
            requeued = await arelay_json(
                "requeue", "--target", "crm", "--config", str(config), env=env
            )
            assert requeued["requeued"] == 1
            crm.script = [200]
            stats = await arelay_json("stats", "--config", str(config), env=env)
            assert stats["targets"]["crm"]["paused"] is True
            assert stats["targets"]["crm"]["paused_by"].startswith("cli user ")
            assert stats["targets"]["crm"]["paused_since"] is not None
            assert stats["targets"]["crm"]["pending"] == 1

            # The service says in its own log what the CLI did (issue 55, item 9).
            async def noticed() -> bool:
                said = [
                    line for line in relay.log().splitlines() if "by a database command" in line
                ]
                return any("action=pause" in line for line in said) and any(
                    "action=requeue" in line for line in said
                )

            await eventually(noticed, timeout=10)
            assert len(crm.requests) == before  # paused: nothing sent, nothing burned
            await arelay_cli("resume", "crm", "--config", str(config), env=env)

            async def crm_delivered() -> bool:
                shown = await arelay_json("show", event_id, "--config", str(config), env=env)
                return any(
                    d["target"] == "crm" and d["status"] == "delivered" for d in shown["deliveries"]
                )

            await eventually(crm_delivered, timeout=10)
            shown = await arelay_json("show", event_id, "--config", str(config), env=env)
            proxy_ids = [d["id"] for d in shown["deliveries"] if d["target"] == "proxy"]
            retried = await arelay_json("retry", *proxy_ids, "--config", str(config), env=env)
            assert retried[0]["status"] == "pending"

        for args in (("events",), ("show", event_id), ("stats",), ("rejections",)):
            outputs.append((await arelay_cli(*args, "--config", str(config), env=env)).stdout)
            outputs.append(
                (await arelay_cli(*args, "--json", "--config", str(config), env=env)).stdout
            )
        outputs.append((await arelay_cli("check", "--config", str(config), env=env)).stdout)
    finally:
        await relay.astop()
    outputs.append(relay.log())

    shown = json.loads(
        relay_cli("show", event_id, "--json", "--config", str(config), env=env).stdout
    )
    crm_delivery = next(d for d in shown["deliveries"] if d["target"] == "crm")
    assert [h["kind"] for h in crm_delivery["history"]] == ["requeue"]
    assert crm_delivery["attempts"] == 4  # 3 before the requeue, 1 after
    assert "attempt=" in relay.log()
    assert "outcome=retry" in relay.log()

    everything = "\n".join(outputs)
    assert "***" in everything  # masking happened where secrets would have been
    for name, secret in SECRETS.items():
        assert secret not in everything, f"{name} leaked"
    # The echoing target really did receive the secrets, so the test could catch a leak.
    assert any(SECRETS["CRM_TOKEN"] in r.headers.get("Authorization", "") for r in crm.requests)
