"""`relay show` in text mode says what happened, readably: the body decoded,
every attempt with the target's answer, and what people did, in order."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlencode

import aiohttp

from relay.core.clock import FakeClock
from relay.store import EventQuery, Selection

from conftest import ConfigFactory, RelayFactory, SinkFactory
from helpers import relay_cli, write_config


async def test_show_tells_the_whole_story(
    tmp_path: Path,
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
) -> None:
    crm, crm_url = await start_sink([503, 503, 503, 200])
    targets = {"crm": {"type": "http", "url": crm_url, "retry": {"retries": 1, "unit": "1ms"}}}
    routes = {"leads": {"path": "/hooks/leads", "targets": ["crm"]}}
    relay = await start_relay(make_config(targets, routes), background=False, clock=FakeClock())
    form = urlencode({"Name": "Анна Петрова", "Phone": "+7 999 123-45-67", "api_key": "k-123456"})
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            relay.ingress_url + "/hooks/leads",
            data=form,
            headers={"Content-Type": "application/x-www-form-urlencoded", "Idempotency-Key": "L1"},
        ) as response,
    ):
        assert response.status == 200
    await relay.scheduler.drain()  # #1 503, #2 503: dead
    [event] = await relay.store.list_events(EventQuery())
    delivery = event.deliveries[0].id
    relay.clock.advance(60)  # type: ignore[attr-defined]
    await relay.store.retry_now(delivery, relay.clock.now())
    await relay.scheduler.drain()  # #3 503: still dead
    relay.clock.advance(60)  # type: ignore[attr-defined]
    await relay.store.requeue(Selection(ids=(delivery,)), relay.clock.now())
    await relay.scheduler.drain()  # #4 200: delivered
    assert len(crm.requests) == 4

    config = write_config(
        tmp_path / "cli.toml",
        {"storage": {"path": str(tmp_path / "relay.db")}, "targets": targets, "routes": routes},
    )
    out = relay_cli("show", "1", "--config", str(config)).stdout
    assert "body (application/x-www-form-urlencoded, fields decoded):" in out
    assert "  Name = Анна Петрова\n  Phone = +7 999 123-45-67\n  api_key = ***\n" in out
    assert "%D0" not in out  # nothing percent-encoded
    assert "k-123456" not in out
    lines = out.splitlines()
    start = next(index for index, line in enumerate(lines) if line.startswith("delivery "))
    story = [line.strip() for line in lines[start:]]
    assert story[0].startswith("delivery 1 → crm: delivered, 4 attempts (1 in this cycle)")
    numbered = [line for line in story if line.startswith("#")]
    assert [line.split()[0] for line in numbered] == ["#1", "#2", "#3", "#4"]
    # Each says what it was: a step of its cycle (the requeue's started again), a person's retry.
    assert [line.split(" 20")[0] for line in numbered] == [
        "#1 (cycle step 1)",
        "#2 (cycle step 2)",
        "#3 (manual retry)",
        "#4 (cycle step 1)",
    ]
    assert "answer: answer 0: 503" in story
    # What each attempt sent, beside its answer: the form decoded, its credential masked.
    sent = [line for line in story if line.startswith("sent:")]
    assert len(sent) == 4
    assert sent[0].startswith("sent: POST http://127.0.0.1:")
    first = story.index(sent[0])
    assert story[first + 1 : first + 4] == [
        "Name = Анна Петрова",
        "Phone = +7 999 123-45-67",
        "api_key = ***",
    ]
    assert "answer: answer 3: 200" in story
    # The retry and the requeue sit between the attempts they caused.
    kinds = [
        line
        for line in story
        if not line.startswith(("#", "answer:", "delivery", "last")) and " = " not in line
    ]
    assert len(kinds) >= 2, story
    position = {line: index for index, line in enumerate(story)}
    retry_line = next(line for line in kinds if "retry" in line)
    requeue_line = next(line for line in kinds if "requeue" in line)
    assert position[numbered[1]] < position[retry_line] < position[numbered[2]]
    assert position[numbered[2]] < position[requeue_line] < position[numbered[3]]


async def test_what_a_sender_or_a_filter_wrote_never_drives_the_terminal(
    tmp_path: Path,
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
) -> None:
    # OSC 52 (write the clipboard), a title, clear screen, a carriage return
    # and a bidi override from a sender reached `relay events` and `relay
    # show` as they came; a line break in a bulk action's filter (the API's
    # key) forged a row of `relay audit`'s table.
    _, crm_url = await start_sink([422])
    targets = {"crm": {"type": "http", "url": crm_url}}
    routes = {"leads": {"path": "/hooks/leads", "targets": ["crm"]}}
    relay = await start_relay(make_config(targets, routes), background=False, clock=FakeClock())
    # C1's CSI and OSC (U+009B, U+009D) too, which JSON leaves as they are.
    hostile = (
        "Anna\x1b]52;c;cm0gLXJmIH4=\x07\x1b]0;pwned\x07\x1b[2J\rEve\u202egnp.exe"
        "\x9b2J\x9d52;c;ZXZpbA==\x9c"
    )
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            relay.ingress_url + "/hooks/leads",
            json={"name": hostile},
            headers={"Idempotency-Key": "K1"},
        ) as response,
    ):
        assert response.status == 200
    await relay.scheduler.drain()  # dead: 422
    await relay.store.requeue(
        Selection(key="K\nreal-looking  row  forged"), relay.clock.now(), by="api caller"
    )
    config = write_config(
        tmp_path / "cli.toml",
        {"storage": {"path": str(tmp_path / "relay.db")}, "targets": targets, "routes": routes},
    )
    for command in (
        ["events"],
        ["show", "1"],
        ["audit"],
        ["show", "1", "--json"],
        ["events", "--json"],
        ["export"],
    ):
        out = relay_cli(*command, "--config", str(config)).stdout
        for control in ("\x1b", "\x07", "\r", "\u202e", "\x9b", "\x9d", "\x9c"):
            assert control not in out, (command, control)
    shown = json.loads(relay_cli("show", "1", "--json", "--config", str(config)).stdout)
    assert json.loads(shown["body"])["name"] == hostile  # the same JSON, escaped
    audit = relay_cli("audit", "--config", str(config)).stdout
    assert "forged" in audit
    assert not any(line.startswith("real-looking") for line in audit.splitlines())
    events = relay_cli("events", "--config", str(config)).stdout
    assert "\\x1b]52;c;" in events  # the name decoded, its controls said as escapes


async def test_show_of_a_delivery_id_says_whose_event_it_is(
    tmp_path: Path, make_config: ConfigFactory, start_relay: RelayFactory
) -> None:
    # `relay requeue` printed delivery 2; `relay show 2` said only "no event 2".
    targets = {name: {"type": "file", "path": f"{name}.jsonl"} for name in ("crm", "mail")}
    routes = {"leads": {"path": "/hooks/leads", "targets": ["crm", "mail"]}}
    relay = await start_relay(make_config(targets, routes), background=False, clock=FakeClock())
    async with (
        aiohttp.ClientSession() as http,
        http.post(relay.ingress_url + "/hooks/leads", json={"n": 1}) as answer,
    ):
        assert answer.status == 200
    config = write_config(
        tmp_path / "cli.toml",
        {"storage": {"path": str(tmp_path / "relay.db")}, "targets": targets, "routes": routes},
    )
    said = relay_cli("show", "2", "--config", str(config), check=False)
    assert said.returncode == 2
    assert said.stderr.strip() == "relay: no event 2; delivery 2 is of event 1"
