"""Exporting events for a spreadsheet: CSV with chosen columns and payload
paths, in the operator's zone, never a formula, and a file a Russian-locale
Excel opens as it is (UTF-8 with a byte order mark, `;` between cells: Excel
reads CSV in the system's ANSI code page and splits cells on the locale's
list separator, which is `;` where `,` is the decimal separator)."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from relay.app import Relay
from relay.core.clock import FakeClock
from relay.ops.export import cell

from conftest import ConfigFactory, RelayFactory
from helpers import arelay_cli, write_config

TOKEN = "admin-token-0123456789"
# T-Bank's notification fields (tests/fixtures/tbank), a refund among them,
# and a payer name that a spreadsheet would run as a formula.
PAYMENTS = [
    {"OrderId": "1001", "Amount": 129900, "Status": "CONFIRMED", "Name": "Анна"},
    {"OrderId": "1002", "Amount": -250.5, "Status": "REFUNDED", "Name": '=HYPERLINK("x")'},
    {"OrderId": "1003", "Amount": 5000, "Status": "CONFIRMED", "Name": "@SUM(A1)", "Extra": [1]},
]


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("=1+1", "'=1+1"),
        ("+7 999 123-45-67", "'+7 999 123-45-67"),
        ("-2+3+cmd|' /C calc'!A0", "'-2+3+cmd|' /C calc'!A0"),
        ("@SUM(A1)", "'@SUM(A1)"),
        ("\tx", "'\tx"),
        ("-250.50", "-250.50"),  # a number stays a number
        (-250.5, "-250.5"),
        ("Анна", "Анна"),
        (None, ""),
        ({"a": 1}, '{"a":1}'),
    ],
)
def test_a_cell_is_never_a_formula(value: Any, shown: str) -> None:
    assert cell(value) == shown


@pytest.fixture
async def relay(make_config: ConfigFactory, start_relay: RelayFactory) -> Relay:
    config = make_config(
        {"books": {"type": "file", "path": "books.jsonl"}},
        {"payments": {"path": "/hooks/payments", "targets": ["books"]}},
        admin={"token": TOKEN, "timezone": "Europe/Moscow"},
    )
    relay = await start_relay(config, background=False, clock=FakeClock(1_800_000_000))
    async with aiohttp.ClientSession() as http:
        for payment in PAYMENTS:
            async with http.post(relay.ingress_url + "/hooks/payments", json=payment) as answer:
                assert answer.status == 200
    return relay


async def download(relay: Relay, path: str, **params: str) -> tuple[dict[str, str], bytes]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(
            relay.admin_url + path,
            params=params,
            headers={"Authorization": f"Bearer {TOKEN}"},
        ) as answer,
    ):
        assert answer.status == 200, await answer.text()
        return dict(answer.headers), await answer.read()


FIELDS = "id,received_at,json.OrderId,json.Amount,json.Name,json.Extra,json.Missing"


async def test_the_api_exports_csv_with_payload_paths_in_the_operators_zone(relay: Relay) -> None:
    headers, body = await download(relay, "/api/v1/export", format="csv", fields=FIELDS)
    assert headers["Content-Type"].startswith("text/csv")
    assert 'filename="relay-events.csv"' in headers["Content-Disposition"]
    rows = list(csv.reader(io.StringIO(body.decode("utf-8"))))
    assert rows[0] == FIELDS.split(",")
    # Newest first; 1_800_000_000 is 2027-01-15 08:00 UTC, 11:00 in Moscow.
    assert rows[1:] == [
        ["3", "2027-01-15 11:00:00 +03:00", "1003", "5000", "'@SUM(A1)", "[1]", ""],
        ["2", "2027-01-15 11:00:00 +03:00", "1002", "-250.5", '\'=HYPERLINK("x")', "", ""],
        ["1", "2027-01-15 11:00:00 +03:00", "1001", "129900", "Анна", "", ""],
    ]
    assert b"\r\n" in body


async def test_excel_gets_a_byte_order_mark_and_semicolons(relay: Relay) -> None:
    _, body = await download(
        relay, "/api/v1/export", format="excel", fields="id,json.Name", route="payments"
    )
    assert body.startswith("\ufeff".encode())
    text = body.decode("utf-8-sig")
    assert text.splitlines()[:2] == ["id;json.Name", "3;'@SUM(A1)"]
    assert "1;Анна" in text


async def test_ndjson_is_the_whole_event_and_the_default(relay: Relay) -> None:
    _, body = await download(relay, "/api/v1/export")
    lines = [json.loads(line) for line in body.splitlines()]
    assert [line["data"]["OrderId"] for line in lines] == ["1003", "1002", "1001"]


async def test_a_bad_export_is_a_400_naming_the_field(relay: Relay) -> None:
    async with aiohttp.ClientSession() as http:
        for params, field in [
            ({"format": "xlsx"}, "format"),
            ({"format": "csv", "fields": "id,secret_column"}, "fields"),
            ({"fields": "id"}, "fields"),  # ndjson has no columns
        ]:
            async with http.get(
                relay.admin_url + "/api/v1/export",
                params=params,
                headers={"Authorization": f"Bearer {TOKEN}"},
            ) as answer:
                assert answer.status == 400
                assert (await answer.json())["error"].startswith(field + ":")


async def test_the_dashboard_exports_what_its_listing_shows(relay: Relay) -> None:
    await relay.indexer.catch_up()
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        async with http.get(relay.admin_url + "/login") as login:
            found = re.search(r'name="csrf" value="([^"]+)"', await login.text())
        assert found is not None
        form = {"csrf": found.group(1), "token": TOKEN, "next": "/"}
        async with http.post(relay.admin_url + "/login", data=form) as signed_in:
            assert signed_in.status == 200
        async with http.get(relay.admin_url + "/deliveries", params={"q": "1002"}) as page:
            text = await page.text()
        assert 'href="/export?q=1002"' in text
        async with http.get(relay.admin_url + "/export", params={"q": "1002"}) as answer:
            assert answer.status == 200
            body = (await answer.read()).decode("utf-8-sig")
    header, *rows = body.splitlines()
    assert header == "id;received_at;route;status;idempotency_key"
    assert [row.split(";")[:3] for row in rows] == [["2", "2027-01-15 11:00:00 +03:00", "payments"]]


async def test_the_cli_exports_the_same(relay: Relay, tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "cli.toml",
        {
            "storage": {"path": str(tmp_path / "relay.db")},
            "admin": {"timezone": "Europe/Moscow"},
            "targets": {"books": {"type": "file", "path": "books.jsonl"}},
            "routes": {"payments": {"path": "/hooks/payments", "targets": ["books"]}},
        },
    )
    out = await arelay_cli(
        "export", "--config", str(config), "--format", "excel", "--fields", "id,json.Name"
    )
    assert out.stdout.startswith("\ufeffid;json.Name")
    refused = await arelay_cli("export", "--config", str(config), "--fields", "id", check=False)
    assert refused.returncode == 2
    assert "--fields: only for csv and excel" in refused.stderr
