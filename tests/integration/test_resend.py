"""Resending a corrected copy, over real HTTP, against a real SQLite file and a real CRM stand-in.

The CRM validates the lead's phone and answers 400 naming the field, the way
CRM APIs refuse a bad field (Close answers "contacts: Invalid phone number",
https://integrately.com/integrations/close/error). A 400 is not retried: the
lead is dead. The operator corrects the phone and resends; the copy arrives,
the original stays exactly as it was.
"""

from __future__ import annotations

import asyncio
import html
import json
import re
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from relay.app import Relay
from relay.core.clock import FakeClock

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
    assert '"name": "Иван"' in crm_preview["request"]  # text as text, not \u escapes
    # The copy's id is drawn when it is stored; no CLI hint in a page or API answer.
    assert "X-Relay-Event-Id: (the copy's own event id)" in crm_preview["request"]
    assert "Idempotency-Key: (the delivery's own, once stored)" in crm_preview["request"]
    assert "--wire" not in crm_preview["request"]
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
    # Its own key, never the original's: a receiver that remembers keys takes it.
    [refused] = [r for r in sink.requests if r.headers["X-Relay-Event-Id"] == original]
    assert arrived.headers["Idempotency-Key"] != refused.headers["Idempotency-Key"]
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
    assert [h["kind"] for h in crm["history"]] == ["superseded", "resolved"]
    stats = await api(relay, http, "GET", "/api/v1/stats", 200)
    assert (stats["dead"], stats["targets"]["crm"]["resolved"]) == (0, 1)
    async with http.get(relay.admin_url + "/metrics") as answer:
        assert 'relay_deliveries{status="dead",target="crm"} 0.0' in await answer.text()


def gated(gate: asyncio.Future[int]) -> Any:
    """A CRM that answers its first request only when the test says how."""

    def respond(request: web.Request, number: int) -> Any:
        async def answer() -> web.Response:
            status = await gate if number == 0 else 200
            return web.json_response({"status": status}, status=status)

        return answer()

    return respond


async def corrected_copy(
    relay: Relay, http: aiohttp.ClientSession, original: str, targets: list[str] | None = None
) -> str:
    chosen = {} if targets is None else {"targets": targets}
    sent = await api(
        relay,
        http,
        "POST",
        f"/api/v1/events/{original}/resend",
        201,
        json={"body": edited(FIXED), "confirm": True, **chosen},
    )
    copy: str = sent["event_id"]
    return copy


async def test_a_copy_of_a_lead_still_retrying_is_the_only_one_the_crm_gets(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
) -> None:
    # The CRM is down (503) when the lead comes; the operator sees its wrong
    # phone and sends a corrected copy while the original waits for its
    # retry. Once the CRM is back it gets one lead: the copy. (Before, the
    # original was retried too, and the lead created twice.) The copy goes to
    # the CRM alone by default: the mail has the lead already.
    sink, url = await start_sink([503, 200])
    mail, mail_url = await start_sink([200])
    config = make_config(
        {"crm": {"type": "http", "url": url}, "mail": {"type": "http", "url": mail_url}},
        {"leads": {"path": "/hooks/leads", "targets": ["crm", "mail"]}},
        admin={"token": TOKEN},
    )
    relay = await start_relay(config, background=False, clock=FakeClock())
    async with http.post(relay.ingress_url + "/hooks/leads", json=LEAD) as response:
        original = (await response.json())["id"]
    await relay.scheduler.run_once()
    await relay.scheduler.wait_idle()
    copy = await corrected_copy(relay, http, original)
    await relay.scheduler.drain()
    assert [json.loads(r.body) for r in sink.requests] == [LEAD, FIXED]
    assert sink.requests[1].headers["X-Relay-Event-Id"] == copy
    assert len(mail.requests) == 1
    shown = await api(relay, http, "GET", f"/api/v1/events/{original}", 200)
    crm, _ = shown["deliveries"]
    copied = await api(relay, http, "GET", f"/api/v1/events/{copy}", 200)
    [copy_crm] = copied["deliveries"]
    assert (crm["status"], crm["resolved_by"], crm["attempts"]) == ("resolved", copy_crm["id"], 1)
    assert [h["kind"] for h in crm["history"]] == ["superseded", "resolved"]


@pytest.mark.parametrize(("answer", "leads"), [(200, 1), (503, 2)])
async def test_a_copy_made_during_the_originals_attempt_waits_for_how_it_ends(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
    answer: int,
    leads: int,
) -> None:
    # The copy is made while the CRM is still answering the original: it is
    # not sent beside it; the original's answer decides (200: the copy is not
    # needed and is skipped; 503: the original stops, the copy goes).
    gate: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    sink, url = await start_sink(gated(gate))
    config = make_config(
        {"crm": {"type": "http", "url": url}},
        {"leads": {"path": "/hooks/leads", "targets": ["crm"]}},
        admin={"token": TOKEN},
    )
    relay = await start_relay(config, background=False, clock=FakeClock())
    async with http.post(relay.ingress_url + "/hooks/leads", json=LEAD) as response:
        original = (await response.json())["id"]
    await relay.scheduler.run_once()
    await sink.wait_for(1)
    copy = await corrected_copy(relay, http, original)
    waiting = await api(relay, http, "GET", f"/api/v1/events/{copy}", 200)
    assert "waits for the attempt of delivery" in waiting["deliveries"][0]["note"]
    assert await relay.scheduler.run_once() == 0  # the copy waits
    gate.set_result(answer)
    await relay.scheduler.drain()
    assert len(sink.requests) == leads
    shown = await api(relay, http, "GET", f"/api/v1/events/{original}", 200)
    copied = await api(relay, http, "GET", f"/api/v1/events/{copy}", 200)
    [crm], [copy_crm] = shown["deliveries"], copied["deliveries"]
    if answer == 200:
        assert (crm["status"], copy_crm["status"]) == ("delivered", "skipped")
        assert f"delivery {crm['id']}, the original, was delivered" in copy_crm["last_error"]
    else:
        assert (crm["status"], copy_crm["status"]) == ("resolved", "delivered")
        assert json.loads(sink.requests[1].body) == FIXED


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
            # Each host's own listeners, from the service's environment: a
            # shell has none of it, and a resend does not listen.
            "server": {"listen": "${RELAY_LISTEN}"},
            "admin": {"listen": "${RELAY_ADMIN_LISTEN}"},
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
    # The second copy of the original stopped the first, still waiting: one
    # lead reaches the CRM, the last correction.
    bodies = [json.loads(r.body) for r in sink.requests[1:]]
    assert bodies == [{**FIXED, "phone": "+79990000000"}]
    first_copy = await relay.store.get_event(int(copy.group(1)))
    assert first_copy is not None
    assert [d.status.value for d in first_copy.event.deliveries] == ["resolved"]
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


async def dead_form_lead(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
    lead: bytes,
) -> tuple[Relay, Sink, str]:
    """A form lead the CRM refused once (it takes the next request): relay, the
    CRM, the event's id."""
    sink, url = await start_sink([400, 200])
    config = make_config(
        {"crm": {"type": "http", "url": url}},
        {"tilda": {"path": "/hooks/tilda", "targets": ["crm"]}},
        admin={"token": TOKEN},
    )
    relay = await start_relay(config, background=False, clock=FakeClock())
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    async with http.post(relay.ingress_url + "/hooks/tilda", data=lead, headers=form) as answer:
        original: str = (await answer.json())["id"]
    await relay.scheduler.drain()
    return relay, sink, original


async def test_a_form_lead_keeps_its_own_credential_field_which_no_view_shows(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
) -> None:
    # Tilda may post its API key as a form field, api_key (masked by name in every view).
    relay, sink, original = await dead_form_lead(
        make_config,
        start_relay,
        start_sink,
        http,
        b"Name=Anna&Phone=8+999+123-45-67&api_key=tilda-key-4242&formid=f1",
    )
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


@pytest.mark.parametrize(
    "moved",
    [
        # The *** of password moved into name: the secret would go to the CRM
        # in the name field, and the copy's views would show it in clear.
        "Name=***&Phone=%2B79991234567&password=x&formid=f1",
        "Name=Anna&Phone=%2B79991234567&formid=***",
        "Name=Anna&Phone=%2B79991234567&note=***&formid=f1",
    ],
)
async def test_a_masked_secret_goes_back_only_where_it_was(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
    moved: str,
) -> None:
    relay, sink, original = await dead_form_lead(
        make_config,
        start_relay,
        start_sink,
        http,
        b"Name=Anna&Phone=8+999&password=hunter2-secret&formid=f1",
    )
    shown = (await api(relay, http, "GET", f"/api/v1/events/{original}", 200))["body"]
    assert shown == "Name=Anna&Phone=8+999&password=***&formid=f1"
    for confirm in (False, True):
        refused = await api(
            relay,
            http,
            "POST",
            f"/api/v1/events/{original}/resend",
            400,
            json={"body": moved, "confirm": confirm},
        )
        assert "hunter2-secret" not in json.dumps(refused)
        assert "goes back only in its own place" in refused["error"] or (
            "in clear" in refused["error"]
        )
    assert len(sink.requests) == 1  # only the original's attempt: nothing sent
    assert (await relay.store.search_progress()).newest == int(original)  # no copy stored

    # Where it was, it goes back (whitespace and other fields may change).
    fixed = "Name=Anna&Phone=%2B79991234567&password=***&formid=f1"
    await api(
        relay,
        http,
        "POST",
        f"/api/v1/events/{original}/resend",
        201,
        json={"body": fixed, "confirm": True},
    )
    await relay.scheduler.drain()
    assert (
        sink.requests[-1].body
        == b"Name=Anna&Phone=%2B79991234567&password=hunter2-secret&formid=f1"
    )


# Tilda posts its form percent-encoded, UTF-8 (tests/fixtures/tilda/SOURCE.md),
# here with its API key as a field, which every view masks.
TILDA_LEAD = (
    Path(__file__).resolve().parents[1] / "fixtures" / "tilda" / "lead-default-fields.txt"
).read_text().strip() + "&api_key=tilda-key-4242"
TILDA_PHONE = "Phone=%2B7+%28999%29+000-00-01"


def textarea(page: str) -> str:
    found = re.search(r'<textarea id="resend-body" name="body"[^>]*>(.*?)</textarea>', page, re.S)
    assert found is not None, page
    return html.unescape(found.group(1))


def hidden(page: str, name: str) -> str:
    found = re.search(rf'name="{name}" value="([^"]*)"', page)
    assert found is not None, (name, page)
    return html.unescape(found.group(1))


async def test_a_form_lead_is_edited_as_its_fields_decoded_and_sent_back_encoded(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    tmp_path: Path,
) -> None:
    """The dashboard's box and `relay resend --edit` showed `Name=%D0%90%D0%BD…`:
    now `Name = Анна Петрова`, one field a line; what is left as it was goes
    out byte for byte as Tilda sent it, the masked api_key included."""
    sink, url = await start_sink([400, 200, 200])
    config = make_config(
        {"crm": {"type": "http", "url": url}},
        {"tilda": {"path": "/hooks/tilda", "targets": ["crm"]}},
    )
    relay = await start_relay(config, background=False, clock=FakeClock())
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        async with http.post(
            relay.ingress_url + "/hooks/tilda", data=TILDA_LEAD, headers=form
        ) as r:
            original = (await r.json())["id"]
        await relay.scheduler.drain()
        page_url = f"{relay.admin_url}/events/{original}/resend"
        async with http.get(page_url) as response:
            page = await response.text()
        fields = textarea(page)
        assert fields.splitlines() == [
            "Name = Анна Петрова",
            "Email = anna@example.com",
            "Phone = +7 (999) 000-00-01",
            "tranid = 3516279:4213568",
            "formid = form438829563",
            "api_key = ***",
        ]
        assert hidden(page, "format") == "fields"
        assert f'href="/events/{original}/resend?wire=1"' in page  # the wire form, one click
        async with http.get(page_url + "?wire=1") as response:
            wire_page = await response.text()
        assert textarea(wire_page).startswith("Name=%D0%90%D0%BD%D0%BD%D0%B0+%D0%9F")
        assert 'name="format"' not in wire_page

        fixed = fields.replace("Phone = +7 (999) 000-00-01", "Phone = +79990000001")
        post = {
            "csrf": hidden(page, "csrf"),
            "body": fixed,
            "format": "fields",
            "content_type": "application/x-www-form-urlencoded",
            "target": "crm",
            "action": "preview",
        }
        async with http.post(page_url, data=post) as response:
            preview = await response.text()
        assert response.status == 200, preview
        assert "Phone = +79990000001" in html.unescape(preview)  # the CRM's form, decoded
        assert "tilda-key-4242" not in preview
        async with http.post(
            page_url, data={**post, "action": "send", "previewed": hidden(preview, "previewed")}
        ) as response:
            assert response.status == 200  # followed to the copy's page
        # A *** moved to another field would carry the secret there: refused, said.
        moved = fixed.replace("api_key = ***", "api_key = x").replace(
            "Name = Анна Петрова", "Name = ***"
        )
        async with http.post(page_url, data={**post, "body": moved}) as response:
            refused = html.unescape(await response.text())
        assert response.status == 400
        assert "not where a masked secret was" in refused
        assert textarea(refused) == moved  # the box keeps what was typed
    await relay.scheduler.drain()
    # Only the phone's bytes changed; the rest (and the key) as Tilda sent them.
    assert sink.requests[-1].body.decode() == TILDA_LEAD.replace(
        TILDA_PHONE, "Phone=%2B79990000001"
    )

    # The CLI's editor gets the same lines.
    cli_config = write_config(
        tmp_path / "cli.toml",
        {
            "storage": {"path": str(relay.config.storage.path)},
            "targets": {"crm": {"type": "http", "url": url}},
            "routes": {"tilda": {"path": "/hooks/tilda", "targets": ["crm"]}},
        },
    )
    editor = tmp_path / "editor.py"
    editor.write_text(
        "import sys, pathlib\n"
        "p = pathlib.Path(sys.argv[1])\n"
        "text = p.read_text()\n"
        "assert 'Name = Анна Петрова' in text and 'api_key = ***' in text, text\n"
        "p.write_text(text.replace('Email = anna@example.com', 'Email = anna@example.org'))\n"
    )
    env = {"EDITOR": f"{sys.executable} {editor}", "SUDO_USER": "", "USER": "anna"}
    await arelay_cli(
        "resend",
        original,
        "--edit",
        "--yes",
        "--target",
        "crm",
        "--config",
        str(cli_config),
        env=env,
    )
    await relay.scheduler.drain()
    assert sink.requests[-1].body.decode() == TILDA_LEAD.replace(
        "Email=anna%40example.com", "Email=anna%40example.org"
    )


async def test_a_copy_of_another_content_type_never_shows_a_masked_secret(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
) -> None:
    # The copy's views mask it by its own content type: a JSON lead's
    # password (masked by its name in JSON) sent again as a form would be
    # shown in clear by the copy's page, `relay show` and `relay export`.
    sink, url = await start_sink([400, 200])
    config = make_config(
        {"crm": {"type": "http", "url": url}},
        {"leads": {"path": "/hooks/leads", "targets": ["crm"]}},
        admin={"token": TOKEN},
    )
    relay = await start_relay(config, background=False, clock=FakeClock())
    lead = {"name": "Anna", "password": "hunter2-secret"}
    async with http.post(relay.ingress_url + "/hooks/leads", json=lead) as answer:
        original = (await answer.json())["id"]
    await relay.scheduler.drain()
    shown = (await api(relay, http, "GET", f"/api/v1/events/{original}", 200))["body"]
    assert "hunter2-secret" not in shown
    fixed = shown.replace("Anna", "Anna K")
    form = "application/x-www-form-urlencoded"
    for confirm in (False, True):
        refused = await api(
            relay,
            http,
            "POST",
            f"/api/v1/events/{original}/resend",
            400,
            json={"body": fixed, "content_type": form, "confirm": confirm},
        )
        assert "in clear" in refused["error"]
        assert "hunter2-secret" not in json.dumps(refused)
    assert (await relay.store.search_progress()).newest == int(original)  # no copy stored
    # A type whose views still read the body as JSON keeps it masked: stored.
    sent = await api(
        relay,
        http,
        "POST",
        f"/api/v1/events/{original}/resend",
        201,
        json={"body": fixed, "content_type": "text/plain", "confirm": True},
    )
    copy = await api(relay, http, "GET", f"/api/v1/events/{sent['event_id']}", 200)
    assert "hunter2-secret" not in json.dumps(copy)
    await relay.scheduler.drain()
    assert b"hunter2-secret" in sink.requests[-1].body  # the CRM gets it, as it came
