"""`relay requeue` and `relay skip` by filter, search included: a dry run says
how many and which; the action takes exactly those; a bulk skip needs --yes."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp

from relay.core.clock import FakeClock
from relay.store import EventQuery, Resend, Selection, Status

from conftest import ConfigFactory, RelayFactory, SinkFactory
from helpers import relay_cli, write_config


async def test_bulk_commands_take_what_their_filters_and_search_name(
    tmp_path: Path,
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
) -> None:
    _, crm_url = await start_sink([422])  # a wrong field mapping: every lead dead
    targets = {"crm": {"type": "http", "url": crm_url}}
    routes = {"leads": {"path": "/hooks/leads", "targets": ["crm"]}}
    relay = await start_relay(make_config(targets, routes), background=False, clock=FakeClock())
    phones = ["+7 999 123-45-67", "+7 912 000-00-01", "8 999 123 45 67", "+7 913 000-00-02"]
    async with aiohttp.ClientSession() as http:
        for n, phone in enumerate(phones):
            async with http.post(
                relay.ingress_url + "/hooks/leads",
                json={"phone": phone},
                headers={"Idempotency-Key": f"L{n}"},
            ) as answer:
                assert answer.status == 200
    await relay.scheduler.drain()
    await relay.indexer.catch_up()
    events = await relay.store.list_events(EventQuery(route="leads"))
    delivery = {e.idempotency_key: str(e.deliveries[0].id) for e in events}

    config = write_config(
        tmp_path / "cli.toml",
        {"storage": {"path": str(tmp_path / "relay.db")}, "targets": targets, "routes": routes},
    )
    cli = ("--config", str(config))

    def json_of(*args: str) -> dict[str, object]:
        result: dict[str, object] = json.loads(relay_cli(*args, "--json", *cli).stdout)
        return result

    dry = json_of("requeue", "--search", "79991234567", "--dry-run")
    assert dry == {
        "dry_run": True,
        "would_requeue": 2,
        "status": "dead",
        "ids": [delivery["L0"], delivery["L2"]],
        "complete": True,
    }
    # A bulk skip by filter without --yes is a dry run, and says so.
    said = relay_cli("skip", "--route", "leads", *cli).stdout
    assert said.startswith("would skip 4 deliveries")
    assert "add --yes" in said
    assert (await relay.store.stats()).dead == 4
    assert json_of("skip", "--key", "L3", "--yes") == {"skipped": 1, "ids": [delivery["L3"]]}
    done = json_of("requeue", "--route", "leads", "--search", "79991234567")
    assert done == {"requeued": 2, "ids": dry["ids"]}
    stats = await relay.store.stats()
    assert stats.counts_by_target["crm"] == {
        Status.PENDING: 2,
        Status.DEAD: 1,
        Status.SKIPPED: 1,
    }
    # Both actions recorded with who did them; a dry run is no action.
    audit = json.loads(relay_cli("audit", "--json", *cli).stdout)
    assert [(a["action"], a["count"]) for a in audit] == [("requeue", 2), ("skip", 1)]
    assert all(a["by"].startswith("cli user ") for a in audit)
    assert audit[0]["subject"] == "dead, route leads, search 79991234567"
    failed = relay_cli("requeue", "--search", "x", *cli, check=False)
    assert failed.returncode != 0
    assert "--search" in failed.stderr


async def test_a_dry_run_is_a_plan_and_the_real_run_takes_only_what_it_planned(
    tmp_path: Path,
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
) -> None:
    # The dry run showed 2, the real run with the same filters took 3: one
    # more died in between. A plan is what the dry run listed; the run takes
    # those still in the planned state and says which are not (Hookdeck's
    # bulk retry: plan, then run).
    _, crm_url = await start_sink([422])
    targets = {"crm": {"type": "http", "url": crm_url}}
    routes = {"leads": {"path": "/hooks/leads", "targets": ["crm"]}}
    relay = await start_relay(make_config(targets, routes), background=False, clock=FakeClock())

    async def lead(n: int) -> None:
        async with (
            aiohttp.ClientSession() as http,
            http.post(relay.ingress_url + "/hooks/leads", json={"n": n}) as answer,
        ):
            assert answer.status == 200

    for n in range(2):
        await lead(n)
    await relay.scheduler.drain()  # two dead
    config = write_config(
        tmp_path / "cli.toml",
        {"storage": {"path": str(tmp_path / "relay.db")}, "targets": targets, "routes": routes},
    )
    cli = ("--config", str(config))
    plan = tmp_path / "plan.json"
    plan.write_text(relay_cli("requeue", "--route", "leads", "--dry-run", "--json", *cli).stdout)
    planned = json.loads(plan.read_text())
    assert (planned["would_requeue"], planned["complete"]) == (2, True)
    await lead(2)  # a third dies after the plan
    await relay.scheduler.drain()
    first = planned["ids"][0]
    await relay.store.skip(int(first), relay.clock.now())  # and a planned one is skipped
    done = json.loads(relay_cli("requeue", "--plan", str(plan), "--json", *cli).stdout)
    assert done == {
        "requeued": 1,
        "ids": [planned["ids"][1]],
        "not_taken": [first],
        "not_taken_why": {first: "skipped"},
    }
    said = relay_cli("requeue", "--plan", str(plan), *cli).stdout
    assert "of the plan no longer dead" in said
    assert (await relay.store.stats()).dead == 1  # the third: never planned, never taken
    refused = relay_cli("requeue", "--plan", str(plan), "--route", "leads", *cli, check=False)
    assert refused.returncode == 2
    assert "give no filters" in refused.stderr

    # The third is corrected and resent: the original is superseded, and a
    # requeue of it says which copy goes instead, and takes nothing.
    [third] = await relay.store.select(Selection(route="leads"), 1)
    view = await relay.store.get_delivery(third)
    assert view is not None
    copy_id = await relay.store.resend(
        Resend(view.event_id, (), b'{"n": 3}', "application/json", ("crm",), "cli user anna"),
        relay.clock.now(),
    )
    copy = await relay.store.get_event(copy_id)
    assert copy is not None
    [instead] = copy.event.deliveries
    said = relay_cli("requeue", str(third), *cli).stdout
    assert said.startswith("requeued 0 deliveries\n1 of those named, left as they are:")
    assert f"delivery {third}: superseded by delivery {instead.id}, a corrected copy" in said
