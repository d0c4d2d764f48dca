"""A restart refuses no webhook, and forgets nothing a person relies on.

systemd is not PID 1 here: the test is the small systemd (tests/activation.py).
It holds the sockets of the units in systemd/ and starts each `relay serve`
on them as systemd does, the next once the previous one has exited: at once
after a SIGTERM (`systemctl restart`), RestartSec= after a kill -9
(Restart=on-failure). Two senders post webhooks all along and never retry:
one opens a fresh connection for each (WooCommerce), one keeps its
connection alive. The target answers some deliveries slowly, so that a stop
has attempts in flight to finish while webhooks keep coming.

Figures (requests sent, refused, longest wait) go to
test-artifacts/restarts/; `pytest -m slow tests/e2e/test_restarts.py -s`
prints those of the 20-restart run.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import signal
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from pytest_aiohttp import AiohttpServer

from activation import SocketUnits, read_unit, service_sockets
from helpers import RelayProcess, Sink, arelay_cli, arelay_json, eventually, write_config

ROOT = Path(__file__).resolve().parents[2]
FIGURES = ROOT / "test-artifacts" / "restarts"
# What a sender waits for an answer before it gives up (a timeout counts as lost).
SENDER_TIMEOUT = 15.0
# systemd starts the service again this long after it died (Restart=on-failure).
RESTART_SEC = float(read_unit(ROOT / "systemd" / "relay.service")["Service"]["RestartSec"][0][:-1])


@pytest.fixture
def units() -> Iterator[SocketUnits]:
    held = SocketUnits(service_sockets()).listen()
    try:
        yield held
    finally:
        held.close()


def config_on(path: Path, units: SocketUnits, **sections: Any) -> Path:
    """A config whose listeners name the held sockets' addresses (as relay.toml
    and the socket units name the same ones in a real install)."""
    return write_config(
        path,
        {
            "server": {"listen": f"127.0.0.1:{units.port('relay.socket')}"},
            "admin": {"listen": f"127.0.0.1:{units.port('relay-admin.socket')}"},
            "storage": {"path": "relay.db"},
            **sections,
        },
    )


@dataclass
class Sent:
    key: str
    started: float
    ended: float = 0.0
    status: int | None = None
    error: str | None = None  # why the sender got no answer: refused, reset, timeout
    connected: float = 0.0  # when the connection it went on was opened

    def killed_by(self, kill: float) -> bool:
        """Interrupted by a kill -9 at `kill`: under way then, or sent on a
        kept-alive connection the killed process held (before its client saw
        it closed)."""
        return self.started <= kill <= self.ended or self.connected < kill <= self.started

    @property
    def waited(self) -> float:
        return self.ended - self.started


@dataclass
class Sender:
    """Posts one webhook after another to `url` and never retries one."""

    name: str
    url: str
    keep_alive: bool
    sent: list[Sent] = field(default_factory=list)

    async def run(self, stop: asyncio.Event) -> None:
        connector = aiohttp.TCPConnector(limit=1, force_close=not self.keep_alive)
        timeout = aiohttp.ClientTimeout(total=SENDER_TIMEOUT)
        # One connection at a time (limit=1): when the one in use was opened.
        connected = [0.0]
        tracing = aiohttp.TraceConfig()

        async def opened(*_: object) -> None:
            connected[0] = time.monotonic()

        tracing.on_connection_create_end.append(opened)
        async with aiohttp.ClientSession(
            connector=connector, timeout=timeout, trace_configs=[tracing]
        ) as http:
            n = 0
            while not stop.is_set():
                n += 1
                sent = Sent(f"{self.name}-{n}", time.monotonic())
                self.sent.append(sent)
                try:
                    async with http.post(
                        self.url, json={"key": sent.key}, headers={"Idempotency-Key": sent.key}
                    ) as answer:
                        await answer.read()
                        sent.status = answer.status
                except aiohttp.ClientConnectorError:
                    sent.error = "refused"
                except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
                    sent.error = "reset"
                except TimeoutError:
                    sent.error = "timeout"
                sent.ended = time.monotonic()
                sent.connected = connected[0]
                await asyncio.sleep(0.01)


def figures_of(senders: list[Sender], kills: list[float], stops: list[float]) -> dict[str, Any]:
    sent = [s for sender in senders for s in sender.sent]
    in_progress_at_a_kill = [s for s in sent if s.error and any(map(s.killed_by, kills))]
    answered = [s for s in sent if s.status is not None]
    return {
        "sent": len(sent),
        "acknowledged": sum(s.status == 200 for s in sent),
        "failed": dict(Counter(s.error for s in sent if s.error)),
        "failed_in_progress_at_a_kill": len(in_progress_at_a_kill),
        "longest_wait_s": round(max(s.waited for s in answered), 3),
        # Left out: those waiting while the killed relay was down (RestartSec=).
        "longest_wait_at_a_sigterm_s": round(
            max(
                s.waited
                for s in answered
                if not any(s.started <= kill + RESTART_SEC and s.ended >= kill for kill in kills)
            ),
            3,
        ),
        "waits_over_1s": sum(s.waited > 1 for s in answered),
        "by_sender": {
            sender.name: {
                "sent": len(sender.sent),
                "longest_wait_s": round(max(s.waited for s in sender.sent if s.status), 3),
                # The longest its requests were apart: a sender that paused
                # longer than relay's wait for idle connections was closed.
                "longest_pause_s": round(
                    max(b.started - a.ended for a, b in itertools.pairwise(sender.sent)), 3
                ),
            }
            for sender in senders
        },
        # When each request that failed began, from the SIGTERM nearest to it.
        "failed_after_a_stop_s": [
            round(min((s.started - stop for stop in stops), key=abs), 3)
            for s in sent
            if s.error and s not in in_progress_at_a_kill
        ],
    }


@pytest.mark.parametrize(
    "restarts",
    [pytest.param(2, id="2-restarts"), pytest.param(20, marks=pytest.mark.slow, id="20-restarts")],
)
@pytest.mark.timeout(300)
async def test_restarts_refuse_reset_and_lose_no_webhook(
    restarts: int, tmp_path: Path, units: SocketUnits, aiohttp_server: AiohttpServer
) -> None:
    rng = random.Random(54)
    delivered: set[str] = set()

    async def sometimes_slow(request: web.Request, number: int) -> web.StreamResponse:
        if rng.random() < 0.05:
            await asyncio.sleep(rng.uniform(0.2, 1.5))
        delivered.add((await request.json())["key"])  # the body, as sent (format "raw")
        return web.Response(status=200)

    server = await aiohttp_server(Sink(script=sometimes_slow).app())
    config = config_on(
        tmp_path / "relay.toml",
        units,
        retry={"unit": "50ms", "max_delay": "500ms", "retries": 100},
        targets={"crm": {"type": "http", "url": str(server.make_url("/crm")), "concurrency": 32}},
        routes={"orders": {"path": "/hooks/orders", "targets": ["crm"]}},
    )
    log = tmp_path / "relay.log"
    url = units.url("relay.socket") + "/hooks/orders"
    senders = [Sender("fresh", url, keep_alive=False), Sender("kept", url, keep_alive=True)]
    stop = asyncio.Event()
    kills: list[float] = []
    stops: list[float] = []
    relay: RelayProcess = await asyncio.to_thread(units.relay(config, log).start)
    try:
        sending = [asyncio.create_task(sender.run(stop)) for sender in senders]
        try:
            for restart in range(restarts):
                await asyncio.sleep(rng.uniform(0.3, 0.8))
                if restart == restarts // 2:  # a crash: the next one RestartSec= later
                    kills.append(time.monotonic())
                    await asyncio.to_thread(relay.kill, signal.SIGKILL)
                    await asyncio.sleep(RESTART_SEC)
                else:  # systemctl restart: SIGTERM, and the next one once it has exited
                    stops.append(time.monotonic())
                    assert await relay.astop() == 0, relay.log()[-3000:]
                relay = await asyncio.to_thread(units.relay(config, log).start)
            await asyncio.sleep(0.5)
        finally:
            stop.set()
            await asyncio.gather(*sending)
        figures = figures_of(senders, kills, stops)
        FIGURES.mkdir(parents=True, exist_ok=True)
        (FIGURES / f"{restarts}-restarts.json").write_text(json.dumps(figures, indent=2))
        print(f"\n{restarts} restarts: {json.dumps(figures)}")

        sent = [s for sender in senders for s in sender.sent]
        # At the kill -9 only the requests it interrupted may fail; at a SIGTERM none.
        failed = [s for s in sent if s.error or s.status != 200]
        allowed = [s for s in failed if s.error and any(map(s.killed_by, kills))]
        assert failed == allowed, figures
        acknowledged = {s.key for s in sent if s.status == 200}
        assert len(acknowledged) > 20 * (restarts + 1)

        async def all_delivered() -> bool:
            return acknowledged <= delivered

        await eventually(all_delivered, timeout=120)
        assert "Traceback" not in relay.log()
    finally:
        assert await relay.astop() == 0


async def test_a_route_failing_before_a_restart_says_recovered_after_it(
    tmp_path: Path, units: SocketUnits, aiohttp_server: AiohttpServer
) -> None:
    """A person restarts relay during a CRM outage (a changed relay.env): the
    "failing" alert came before, the "recovered" one must come after. Before:
    the route's streak lived in the process and was gone with it, so the
    recovery was never said."""
    crm_failing = True

    def crm(request: web.Request, number: int) -> web.StreamResponse:
        return web.Response(status=503 if crm_failing else 200)

    ops = Sink()
    crm_server = await aiohttp_server(Sink(script=crm).app())
    ops_server = await aiohttp_server(ops.app())
    config = config_on(
        tmp_path / "relay.toml",
        units,
        retry={"unit": "20ms", "max_delay": "200ms", "retries": 1000, "jitter": 0},
        targets={
            "crm": {"type": "http", "url": str(crm_server.make_url("/crm"))},
            "ops": {"type": "http", "url": str(ops_server.make_url("/alerts"))},
        },
        routes={"leads": {"path": "/hooks/leads", "targets": ["crm"]}},
        alerts={"target": "ops", "failing_after": 3, "group_window": "100ms"},
    )
    log = tmp_path / "relay.log"
    relay = await asyncio.to_thread(units.relay(config, log).start)
    try:
        async with (
            aiohttp.ClientSession() as http,
            http.post(units.url("relay.socket") + "/hooks/leads", json={"lead": 1}) as answer,
        ):
            assert answer.status == 200
        await ops.wait_for(1, timeout=20)
        first = json.loads(ops.requests[0].body)
        assert [(f["route"], f["target"]) for f in first["failing"]] == [("leads", "crm")]

        assert await relay.astop() == 0
        relay = await asyncio.to_thread(units.relay(config, log).start)
        crm_failing = False

        async def recovered() -> bool:
            bodies = [json.loads(r.body) for r in ops.requests]
            return any(body["recovered"] for body in bodies)

        await eventually(recovered, timeout=20)
        said = [json.loads(r.body) for r in ops.requests if json.loads(r.body)["recovered"]]
        [item] = said[0]["recovered"]
        assert (item["route"], item["target"]) == ("leads", "crm")
        assert item["failures_before"] >= 3
    finally:
        assert await relay.astop() == 0


async def test_down_held_and_paused_targets_stay_so_across_a_restart(
    tmp_path: Path, units: SocketUnits, aiohttp_server: AiohttpServer
) -> None:
    """What a person relies on while they act: a target down (its deliveries
    held, spending no retries), an ordering key held behind a dead delivery,
    a target paused by hand. Each is the store's, and a restart keeps it."""

    async def shop(request: web.Request, number: int) -> web.StreamResponse:
        body = await request.read()
        return web.Response(status=400 if b'"A"' in body else 200)

    down_server = await aiohttp_server(Sink(script=[503]).app())
    shop_server = await aiohttp_server(Sink(script=shop).app())
    mail_server = await aiohttp_server(Sink().app())
    config = config_on(
        tmp_path / "relay.toml",
        units,
        retry={"unit": "10ms", "max_delay": "100ms", "retries": 1000, "jitter": 0},
        targets={
            "crm": {
                "type": "http",
                "url": str(down_server.make_url("/crm")),
                "hold_when_down": True,
                "down_after": 2,
            },
            "shop": {"type": "http", "url": str(shop_server.make_url("/shop"))},
            "mail": {"type": "http", "url": str(mail_server.make_url("/mail"))},
        },
        routes={
            "leads": {"path": "/hooks/leads", "targets": ["crm"]},
            "orders": {
                "path": "/hooks/orders",
                "targets": [{"target": "shop", "order_by": "{{ json.order }}"}],
            },
            "notes": {"path": "/hooks/notes", "targets": ["mail"]},
        },
    )
    log = tmp_path / "relay.log"
    relay = await asyncio.to_thread(units.relay(config, log).start)
    try:
        await arelay_cli("pause", "mail", "--config", str(config))
        async with aiohttp.ClientSession() as http:
            for path, body in (
                ("leads", {"lead": 1}),
                ("orders", {"order": "A", "n": 1}),  # refused (400): dead, holds A
                ("orders", {"order": "A", "n": 2}),
                ("notes", {"note": 1}),
            ):
                async with http.post(f"{units.url('relay.socket')}/hooks/{path}", json=body) as a:
                    assert a.status == 200

        async def state() -> dict[str, Any]:
            stats = await arelay_json("stats", "--config", str(config))
            second_order = await arelay_json("show", "3", "--config", str(config))
            return {
                "targets": {
                    name: (target["paused"], target["down"], target["down_since"])
                    for name, target in stats["targets"].items()
                },
                "held": [d.get("held_behind") for d in second_order["deliveries"]],
            }

        async def settled() -> bool:
            now = await state()
            return now["targets"]["crm"][1] is True and now["held"] != [None]

        await eventually(settled, timeout=20)
        before = await state()
        assert before["targets"]["mail"][0] is True  # paused

        assert await relay.astop() == 0
        relay = await asyncio.to_thread(units.relay(config, log).start)
        await asyncio.sleep(0.5)  # a few turns of the new scheduler
        assert await state() == before
    finally:
        assert await relay.astop() == 0
