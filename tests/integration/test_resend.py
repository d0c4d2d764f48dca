"""Resending a corrected copy, over real HTTP, against a real SQLite file and a real CRM stand-in.

The CRM validates the lead's phone and answers 400 naming the field, the way
CRM APIs refuse a bad field (Close answers "contacts: Invalid phone number",
https://integrately.com/integrations/close/error). A 400 is not retried: the
lead is dead. The operator corrects the phone and resends; the copy arrives,
the original stays exactly as it was.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from relay.app import Relay
from relay.clock import FakeClock

from conftest import ConfigFactory, RelayFactory, SinkFactory
from helpers import Sink, arelay_cli, write_config

TOKEN = "admin-token-0123456789"
CRM_KEY = "crm-key-5551234"  # a configured secret that the lead carries in its body
PHONE = re.compile(r"^\+7\d{10}$")
LEAD = {"name": "Иван", "phone": "8 (999) 123-45-67", "api_key": CRM_KEY}
FIXED = {**LEAD, "phone": "+79991234567"}


def crm(request: web.Request, number: int) -> Any:
    async def answer() -> web.Response:
        lead = await request.json()
        if not PHONE.match(str(lead.get("phone", ""))):
            return web.json_response(
                {"field": "phone", "error": "invalid phone number"}, status=400
            )
        return web.json_response({"id": 1000 + number})

    return answer()


@pytest.fixture
async def setup(
    make_config: ConfigFactory, start_relay: RelayFactory, start_sink: SinkFactory
) -> tuple[Relay, Sink, Sink]:
    sink, url = await start_sink(crm)
    audit, audit_url = await start_sink([200])
    config = make_config(
        {
            "crm": {"type": "http", "url": url, "headers": {"X-Key": "${CRM_KEY}"}},
            "audit": {"type": "http", "url": audit_url},
        },
        {"leads": {"path": "/hooks/leads", "targets": ["crm", "audit"], "max_body_size": 2048}},
        admin={"token": TOKEN},
        environ={"CRM_KEY": CRM_KEY},
    )
    relay = await start_relay(config, background=False, clock=FakeClock())
    return relay, sink, audit


async def api(
    relay: Relay, http: aiohttp.ClientSession, method: str, path: str, expect: int, **kw: Any
) -> Any:
    headers = {"Authorization": f"Bearer {TOKEN}", **kw.pop("headers", {})}
    async with http.request(method, relay.admin_url + path, headers=headers, **kw) as response:
        assert response.status == expect, await response.text()
        return await response.json()


async def dead_lead(relay: Relay, http: aiohttp.ClientSession, sink: Sink) -> str:
    async with http.post(relay.ingress_url + "/hooks/leads", json=LEAD) as response:
        assert response.status == 200
        event_id: str = (await response.json())["id"]
    await relay.scheduler.drain()
    assert (
        sink.requests[-1].body == json.dumps(LEAD).encode()
        or json.loads(sink.requests[-1].body) == LEAD
    )
    return event_id


def edited(body: dict[str, Any]) -> str:
    """The body as the operator edits it: the view they see masks the secret."""
    return json.dumps(body, ensure_ascii=False).replace(CRM_KEY, "***")


async def test_a_rejected_lead_is_corrected_resent_and_arrives_original_untouched(
    setup: tuple[Relay, Sink, Sink], http: aiohttp.ClientSession
) -> None:
    relay, sink, audit = setup
    original = await dead_lead(relay, http, sink)
    before = await api(relay, http, "GET", f"/api/v1/events/{original}", 200)
    assert [d["status"] for d in before["deliveries"]] == ["dead", "delivered"]
    assert CRM_KEY not in before["body"]
    stored_before = await relay.store.get_event(int(original))

    # Preview first: nothing is stored, the CRM's request is shown, secrets masked.
    preview = await api(
        relay,
        http,
        "POST",
        f"/api/v1/events/{original}/resend",
        200,
        json={"body": edited(FIXED)},
    )
    assert preview["sent"] is False
    assert preview["targets"] == ["crm"]  # the dead one, by default
    [crm_preview] = preview["previews"]
    assert "+79991234567" in crm_preview["request"]
    assert CRM_KEY not in json.dumps(preview)
    assert (await relay.store.search_progress()).newest == int(original)

    sent = await api(
        relay,
        http,
        "POST",
        f"/api/v1/events/{original}/resend",
        201,
        json={"body": edited(FIXED), "confirm": True},
    )
    copy = sent["event_id"]
    assert sent["resent_from"] == original
    await relay.scheduler.drain()

    arrived = sink.requests[-1]
    assert json.loads(arrived.body) == FIXED  # the secret is back in its place
    assert arrived.headers["Idempotency-Key"] == copy  # its own key: the copy's id
    assert arrived.headers["X-Relay-Event-Id"] == copy
    assert len(audit.requests) == 1  # audit had it already and was not chosen

    after = await api(relay, http, "GET", f"/api/v1/events/{original}", 200)
    assert [link["event_id"] for link in after["resent_as"]] == [copy]
    assert after["resent_as"][0]["by"].startswith("admin API from 127.0.0.1")
    for key in ("body", "headers", "idempotency_key", "received_at"):
        assert after[key] == before[key], key
    stored_after = await relay.store.get_event(int(original))
    assert stored_after is not None
    assert stored_before is not None
    assert stored_after.payload == stored_before.payload  # its request never changes
    assert stored_after.attempts == stored_before.attempts

    copied = await api(relay, http, "GET", f"/api/v1/events/{copy}", 200)
    assert copied["resent_from"]["event_id"] == original
    assert [(d["target"], d["status"]) for d in copied["deliveries"]] == [("crm", "delivered")]
    assert copied["idempotency_key"] is None
    # The delivered copy resolves the original's dead delivery to the CRM,
    # linked both ways; nothing is dead any more.
    [copy_crm] = copied["deliveries"]
    crm, audit_delivery = after["deliveries"]
    assert (crm["status"], crm["resolved_by"]) == ("resolved", copy_crm["id"])
    assert copy_crm["resolves"] == crm["id"]
    assert audit_delivery["status"] == "delivered"
    assert after["status"] == "resolved"
    assert [h["kind"] for h in crm["history"]] == ["resolved"]
    stats = await api(relay, http, "GET", "/api/v1/stats", 200)
    assert (stats["dead"], stats["targets"]["crm"]["resolved"]) == (0, 1)
    async with http.get(relay.admin_url + "/metrics") as answer:
        assert 'relay_deliveries{status="dead",target="crm"} 0.0' in await answer.text()


@pytest.mark.parametrize(
    ("payload", "status", "message"),
    [
        ({"body": '{"api_key": "***", "phone": '}, 400, "body is not valid JSON"),
        ({"body": edited(LEAD)}, 400, "the body is unchanged"),
        ({"body": edited(FIXED).replace("***", "key")}, 400, "keep each *** where it was"),
        ({"body": edited({**FIXED, "pad": "x" * 3000})}, 413, "max_body_size (2048 bytes)"),
        ({"body": edited(FIXED), "content_type": "json"}, 415, "expected a type like"),
        ({"body": edited(FIXED), "targets": ["mail"]}, 400, "target mail: event"),
        ({"body": 5}, 400, "body: expected the edited body as a string"),
        ({"body": "{}", "by": "me"}, 400, "by: unknown key"),
    ],
)
async def test_an_edit_passes_the_checks_of_ingress_or_is_refused_with_the_reason(
    setup: tuple[Relay, Sink, Sink],
    http: aiohttp.ClientSession,
    payload: dict[str, Any],
    status: int,
    message: str,
) -> None:
    relay, sink, _ = setup
    original = await dead_lead(relay, http, sink)
    answer = await api(
        relay,
        http,
        "POST",
        f"/api/v1/events/{original}/resend",
        status,
        json={**payload, "confirm": True},
    )
    assert message in answer["error"]
    assert (await relay.store.search_progress()).newest == int(original)  # nothing stored


async def test_resend_needs_the_token_json_and_an_event(
    setup: tuple[Relay, Sink, Sink], http: aiohttp.ClientSession
) -> None:
    relay, sink, _ = setup
    original = await dead_lead(relay, http, sink)
    url = relay.admin_url + f"/api/v1/events/{original}/resend"
    body = {"body": edited(FIXED), "confirm": True}
    async with http.post(url, json=body) as response:
        assert response.status == 401
    await api(relay, http, "POST", f"/api/v1/events/{original}/resend", 415, data="body=x")
    await api(relay, http, "POST", "/api/v1/events/999/resend", 404, json=body)
    assert (await relay.store.search_progress()).newest == int(original)


async def test_cli_resend_from_a_file_and_from_the_editor(
    setup: tuple[Relay, Sink, Sink], http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    relay, sink, _ = setup
    original = await dead_lead(relay, http, sink)
    config = write_config(
        tmp_path / "cli.toml",
        {
            "storage": {"path": str(relay.config.storage.path)},
            "targets": {
                "crm": {
                    "type": "http",
                    "url": "http://127.0.0.1:9/",
                    "headers": {"X": "${CRM_KEY}"},
                },
                "audit": {"type": "http", "url": "http://127.0.0.1:9/"},
            },
            "routes": {"leads": {"path": "/hooks/leads", "targets": ["crm", "audit"]}},
        },
    )
    env = {"CRM_KEY": CRM_KEY, "USER": "anna", "SUDO_USER": ""}
    fixed = tmp_path / "fixed.json"
    fixed.write_text(edited(FIXED), encoding="utf-8")
    cli = ("resend", original, "--config", str(config))

    refused = await arelay_cli(*cli, "--body", str(fixed), check=False, env=env)
    assert refused.returncode == 2
    assert "pass --yes" in refused.stderr
    assert "+79991234567" in refused.stdout  # the preview came first
    assert CRM_KEY not in refused.stdout

    done = await arelay_cli(*cli, "--body", str(fixed), "--yes", "--target", "crm", env=env)
    copy = re.search(r"resent as event (\d+) to crm", done.stdout)
    assert copy is not None, done.stdout

    # --edit: $EDITOR is a script that corrects the phone in the file it is given.
    editor = tmp_path / "editor.py"
    editor.write_text(
        "import sys, pathlib\n"
        "p = pathlib.Path(sys.argv[1])\n"
        "p.write_text(p.read_text().replace('8 (999) 123-45-67', '+79990000000'))\n"
    )
    env["EDITOR"] = f"{sys.executable} {editor}"
    edit = await arelay_cli(*cli, "--edit", "--yes", "--json", env=env)
    second = json.loads(edit.stdout)
    assert second["by"] == "cli user anna"

    await relay.scheduler.drain()
    bodies = [json.loads(r.body) for r in sink.requests[-2:]]
    assert bodies == [FIXED, {**FIXED, "phone": "+79990000000"}]
    stored = await relay.store.get_event(int(original))
    assert stored is not None
    assert [link.copy_id for link in stored.resent_as] == [
        int(copy.group(1)),
        int(second["event_id"]),
    ]
    assert json.loads(stored.payload.body) == LEAD  # the original never changes

    shown = await arelay_cli("show", original, "--config", str(config), env=env)
    assert f"resent as event {second['event_id']} (a corrected copy), by cli user anna" in (
        shown.stdout
    )
    copied = await arelay_cli("show", second["event_id"], "--config", str(config), env=env)
    assert f"corrected copy of event {original}, sent by cli user anna" in copied.stdout

    unchanged = await arelay_cli(
        *cli, "--edit", "--yes", check=False, env={**env, "EDITOR": "true"}
    )
    assert unchanged.returncode == 2
    assert "the body is unchanged" in unchanged.stderr


async def test_a_form_lead_keeps_its_own_credential_field_which_no_view_shows(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
) -> None:
    # Tilda may post its API key as a form field, api_key (masked by name in every view).
    sink, url = await start_sink([400, 200])
    config = make_config(
        {"crm": {"type": "http", "url": url}},
        {"tilda": {"path": "/hooks/tilda", "targets": ["crm"]}},
        admin={"token": TOKEN},
    )
    relay = await start_relay(config, background=False, clock=FakeClock())
    lead = b"Name=Anna&Phone=8+999+123-45-67&api_key=tilda-key-4242&formid=f1"
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    async with http.post(relay.ingress_url + "/hooks/tilda", data=lead, headers=form) as answer:
        original = (await answer.json())["id"]
    await relay.scheduler.drain()
    shown = (await api(relay, http, "GET", f"/api/v1/events/{original}", 200))["body"]
    assert shown == "Name=Anna&Phone=8+999+123-45-67&api_key=***&formid=f1"
    fixed = shown.replace("8+999+123-45-67", "%2B79991234567")
    preview = await api(
        relay, http, "POST", f"/api/v1/events/{original}/resend", 200, json={"body": fixed}
    )
    assert "tilda-key-4242" not in json.dumps(preview)
    await api(
        relay,
        http,
        "POST",
        f"/api/v1/events/{original}/resend",
        201,
        json={"body": fixed, "confirm": True},
    )
    await relay.scheduler.drain()
    assert sink.requests[-1].body == (
        b"Name=Anna&Phone=%2B79991234567&api_key=tilda-key-4242&formid=f1"
    )
