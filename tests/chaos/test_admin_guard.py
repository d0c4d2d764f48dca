"""Every admin route, without credentials: the API says 401, pages send to the
login, forms without a CSRF token are refused; and no secret shows anywhere."""

from __future__ import annotations

import re

import aiohttp
import pytest

from relay.admin import admin_application

from conftest import ConfigFactory, RelayFactory, SinkFactory
from figures import record_figures

pytestmark = pytest.mark.chaos

TOKEN = "guard-token-0123456789abcdef"
OPEN = {"/healthz", "/readyz", "/metrics", "/login", "/static/{name}"}
SECRETS = {"CRM_TOKEN": "crm-token-secret-42", "BOT": "77:AAbot-secret-77"}


def concrete(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "1", path).replace("/static/1", "/static/relay.css")


async def test_no_route_without_credentials_and_no_secret_anywhere(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
) -> None:
    sink, url = await start_sink(
        lambda request, n: __import__("aiohttp").web.Response(
            status=500, text=str(dict(request.headers))
        )
    )
    config = make_config(
        {
            "crm": {
                "type": "http",
                "url": url,
                "headers": {"Authorization": "Bearer ${CRM_TOKEN}"},
                "retry": {"retries": 0},
            },
            "bot": {
                "type": "telegram",
                "bot_token": "${BOT}",
                "chat_id": 1,
                "api_base": url.rsplit("/", 1)[0],
            },
        },
        {"orders": {"path": "/hooks/orders", "targets": ["crm", "bot"]}},
        admin={"token": TOKEN},
        environ=SECRETS,
        retry={"retries": 0},
    )
    relay = await start_relay(config)
    routes = sorted(
        {
            (route.method, route.resource.canonical)  # type: ignore[union-attr]
            for route in admin_application(relay.console).router.routes()
            if route.method in ("GET", "POST")
        }
    )
    checked = 0
    # The dashboard's cookies are for 127.0.0.1: a jar that keeps cookies of IP hosts.
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        async with http.post(
            relay.ingress_url + "/hooks/orders",
            json={"n": 1},
            headers={"Authorization": f"Bearer {SECRETS['CRM_TOKEN']}"},
        ) as r:
            assert r.status == 200
        await sink.wait_for(2)
        for method, path in routes:
            if path in OPEN:
                continue
            checked += 1
            async with http.request(
                method, relay.admin_url + concrete(path), allow_redirects=False
            ) as response:
                if path.startswith("/api/"):
                    assert response.status == 401, (method, path)
                elif method == "GET":
                    assert response.status == 302, (method, path)
                    assert response.headers["Location"].startswith("/login")
                else:
                    assert response.status == 403, (method, path)
        # Signed in: every page, every API answer, and not one secret in them.
        async with http.get(relay.admin_url + "/login") as page:
            csrf = re.search(r'name="csrf" value="([^"]+)"', await page.text()).group(1)  # type: ignore[union-attr]
        async with http.post(
            relay.admin_url + "/login", data={"csrf": csrf, "token": TOKEN, "next": "/"}
        ) as response:
            assert response.status == 200
        seen = []
        for method, path in routes:
            if method != "GET":
                continue
            headers = {"Authorization": f"Bearer {TOKEN}"} if path.startswith("/api/") else {}
            async with http.get(relay.admin_url + concrete(path), headers=headers) as response:
                seen.append(await response.text())
    everything = "\n".join(seen)
    assert "***" in everything
    for name, secret in {**SECRETS, "admin": TOKEN}.items():
        assert secret not in everything, f"{name} shows on a page or in an API answer"
    record_figures(
        "admin_guard",
        {"routes_checked_without_credentials": checked, "pages_and_answers_grepped": len(seen)},
    )
