"""Attacks on the admin listener, each replayed over real HTTP against a running
relay: a web page driving the API (no-cors writes, DNS rebinding, forms from
another origin), an open redirect after sign-in, session theft after sign-out,
token guessing, weak tokens, a reload that would leave a public listener
without a token, and inputs that once gave 500 or a misleading 503."""

from __future__ import annotations

import logging
import re
import sqlite3
from typing import Any

import aiohttp
import pytest

from relay.app import Relay
from relay.config import ConfigError
from relay.core.clock import FakeClock

from conftest import ConfigFactory, RelayFactory, SinkFactory

TOKEN = "attack-token-9f8e7d6c5b4a3210"
ROUTES = {"orders": {"path": "/hooks/orders", "targets": ["crm"]}}
JSON = {"Content-Type": "application/json"}


async def dead_relay(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
    **admin: Any,
) -> Relay:
    """A relay (no admin token unless given) with one dead delivery to requeue."""
    _, url = await start_sink([400])
    config = make_config({"crm": {"type": "http", "url": url}}, ROUTES, admin=admin)
    relay = await start_relay(config, background=False, clock=FakeClock())
    async with http.post(relay.ingress_url + "/hooks/orders", json={"n": 1}) as response:
        assert response.status == 200
    await relay.scheduler.drain()
    return relay


async def dead_count(relay: Relay, http: aiohttp.ClientSession) -> int:
    async with http.get(relay.admin_url + "/api/v1/stats") as response:
        assert response.status == 200
        return int((await response.json())["dead"])


async def test_a_web_page_cannot_drive_the_api_without_a_token(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
) -> None:
    relay = await dead_relay(make_config, start_relay, start_sink, http)
    api = relay.admin_url + "/api/v1"
    assert await dead_count(relay, http) == 1
    # What `fetch(url, {method: "POST", mode: "no-cors", body})` sends from any page.
    for content_type in ("text/plain", "application/x-www-form-urlencoded", None):
        headers = {"Content-Type": content_type} if content_type else {}
        async with http.post(api + "/requeue", data=b"{}", headers=headers) as response:
            assert response.status == 415, content_type
        async with http.post(api + "/targets/crm/pause", headers=headers) as response:
            assert response.status == 415, content_type
    # A page that sets the type must pass a preflight relay never grants; and its
    # Origin (or Sec-Fetch-Site) gives it away in any case.
    evil = {**JSON, "Origin": "http://evil.example"}
    async with http.post(api + "/requeue", json={}, headers=evil) as response:
        assert response.status == 403
    for origin in ("null", "http://127.0.0.1:1", "http://evil.example@127.0.0.1"):
        async with http.post(
            api + "/targets/crm/pause", headers={**JSON, "Origin": origin}
        ) as response:
            assert response.status == 403, origin
    for site in ("cross-site", "same-site"):
        async with http.post(
            api + "/requeue", json={}, headers={"Sec-Fetch-Site": site}
        ) as response:
            assert response.status == 403, site
    assert await dead_count(relay, http) == 1  # nothing was requeued
    async with http.get(api + "/targets") as response:
        assert (await response.json())["targets"][0]["paused"] is False
    # The operator's own tools: curl/scripts (no Origin) and the same origin.
    same = {"Origin": relay.admin_url, "Sec-Fetch-Site": "same-origin"}
    async with http.post(api + "/targets/crm/pause", headers={**JSON, **same}) as response:
        assert response.status == 200
    async with http.post(api + "/requeue", json={}) as response:
        assert response.status == 200
        assert (await response.json())["requeued"] == 1


async def test_dns_rebinding_is_refused_on_every_path(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
) -> None:
    relay = await dead_relay(
        make_config, start_relay, start_sink, http, allowed_hosts=["Relay.Example.COM"]
    )
    port = relay.admin_url.rsplit(":", 1)[1]
    for path in ("/api/v1/events", "/", "/deliveries", "/metrics", "/login", "/healthz"):
        for host in ("evil.example", f"evil.example:{port}", "127.0.0.1.evil.example"):
            async with http.get(
                relay.admin_url + path, headers={"Host": host}, allow_redirects=False
            ) as response:
                assert response.status == 421, (path, host)
                assert "events" not in await response.text()
    for host in (
        f"127.0.0.1:{port}",
        f"localhost:{port}",
        f"[::1]:{port}",
        "relay.example.com",
        f"relay.example.com.:{port}",
    ):
        async with http.get(relay.admin_url + "/api/v1/events", headers={"Host": host}) as r:
            assert r.status == 200, host


async def csrf_of(http: aiohttp.ClientSession, url: str) -> str:
    async with http.get(url) as page:
        assert page.status == 200
        found = re.search(r'name="csrf" value="([^"]+)"', await page.text())
    assert found is not None
    return found.group(1)


async def test_dashboard_forms_from_another_origin_are_refused(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
) -> None:
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        relay = await dead_relay(make_config, start_relay, start_sink, http)
        csrf = await csrf_of(http, relay.admin_url + "/targets")
        pause = relay.admin_url + "/targets/crm/pause"
        for headers in (
            {"Origin": "http://evil.example"},
            {"Origin": "null"},
            {"Sec-Fetch-Site": "cross-site"},
        ):
            async with http.post(
                pause, data={"csrf": csrf}, headers=headers, allow_redirects=False
            ) as response:
                assert response.status == 403, headers
        async with http.post(
            pause,
            data={"csrf": csrf},
            headers={"Origin": relay.admin_url, "Sec-Fetch-Site": "same-origin"},
            allow_redirects=False,
        ) as response:
            assert response.status == 303


OFF_SITE = [
    "/\t/evil.example",  # next=/%09/evil.example once gave Location: //evil.example
    "/\n/evil.example",
    "/\r\n/evil.example",
    "/ /evil.example",
    "/\x0b/evil.example",
    "/\\evil.example",
    "//evil.example",
    "https://evil.example/",
    "javascript:alert(1)",
    "/\u3000/evil.example",
]


async def test_sign_in_never_redirects_off_site(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
) -> None:
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        relay = await dead_relay(make_config, start_relay, start_sink, http, token=TOKEN)
        for next_path in OFF_SITE:
            async with http.get(relay.admin_url + "/login", params={"next": next_path}) as page:
                html = await page.text()
            assert 'name="next" value="/"' in html, repr(next_path)
            csrf = await csrf_of(http, relay.admin_url + "/login")
            async with http.post(
                relay.admin_url + "/login",
                data={"csrf": csrf, "token": TOKEN, "next": next_path},
                allow_redirects=False,
            ) as response:
                assert response.status == 303
                assert response.headers["Location"] == "/", repr(next_path)
        csrf = await csrf_of(http, relay.admin_url + "/login")
        async with http.post(
            relay.admin_url + "/login",
            data={"csrf": csrf, "token": TOKEN, "next": "/dead?route=orders"},
            allow_redirects=False,
        ) as response:
            assert response.headers["Location"] == "/dead?route=orders"


async def sign_in(http: aiohttp.ClientSession, relay: Relay) -> None:
    csrf = await csrf_of(http, relay.admin_url + "/login")
    async with http.post(
        relay.admin_url + "/login",
        data={"csrf": csrf, "token": TOKEN, "next": "/"},
        allow_redirects=False,
    ) as response:
        assert response.status == 303


async def test_sign_out_revokes_the_session_everywhere(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
) -> None:
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        relay = await dead_relay(make_config, start_relay, start_sink, http, token=TOKEN)
        await sign_in(http, relay)
        stolen = {c.key: c.value for c in http.cookie_jar}["relay_session"]
        csrf = await csrf_of(http, relay.admin_url + "/targets")
        async with http.post(
            relay.admin_url + "/logout", data={"csrf": csrf}, allow_redirects=False
        ) as response:
            assert response.status == 303
    # A copy of the cookie taken before signing out is worth nothing now.
    async with (
        aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as thief,
        thief.get(
            relay.admin_url + "/dead",
            headers={"Cookie": f"relay_session={stolen}"},
            allow_redirects=False,
        ) as response,
    ):
        assert response.status == 302
        assert response.headers["Location"].startswith("/login")


async def test_token_guessing_is_logged_and_throttled_per_address(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="relay.admin")
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        relay = await dead_relay(make_config, start_relay, start_sink, http, token=TOKEN)
        events = relay.admin_url + "/api/v1/events"
        for n in range(10):
            wrong = {"Authorization": f"Bearer guess-{n:04d}-0123456789abcdef"}
            async with http.get(events, headers=wrong) as response:
                assert response.status == 401
        lines = [r.getMessage() for r in caplog.records if r.name == "relay.admin"]
        assert len(lines) == 10
        assert all("wrong bearer token" in line and "127.0.0.1" in line for line in lines)
        assert not any("guess-" in line for line in lines)  # never the value tried
        # Past the limit even the right token waits: guessing cannot go on in parallel.
        right = {"Authorization": f"Bearer {TOKEN}"}
        async with http.get(events, headers=right) as response:
            assert response.status == 429
            assert int(response.headers["Retry-After"]) >= 1
        csrf = await csrf_of(http, relay.admin_url + "/login")
        async with http.post(
            relay.admin_url + "/login",
            data={"csrf": csrf, "token": TOKEN, "next": "/"},
            allow_redirects=False,
        ) as response:
            assert response.status == 429
        # Without a token at all nothing is guessed, and nothing is counted.
        async with http.get(relay.admin_url + "/healthz") as response:
            assert response.status == 200


async def test_a_wrong_sign_in_is_logged_in_one_line(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="relay.admin")
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        relay = await dead_relay(make_config, start_relay, start_sink, http, token=TOKEN)
        csrf = await csrf_of(http, relay.admin_url + "/login")
        async with http.post(
            relay.admin_url + "/login",
            data={"csrf": csrf, "token": "not-the-token-0123456789", "next": "/"},
            allow_redirects=False,
        ) as response:
            assert response.status == 303
            assert "failed=1" in response.headers["Location"]
    [line] = [r.getMessage() for r in caplog.records if r.name == "relay.admin"]
    assert "sign-in" in line
    assert "127.0.0.1" in line
    assert "not-the-token" not in line


@pytest.mark.parametrize(
    "token",
    ["a" * 32, "ab" * 16, "abcabcabcabcabcabcabcabc", "0000000000000000000000000001"],
)
def test_a_guessable_admin_token_is_refused_at_load(make_config: ConfigFactory, token: str) -> None:
    with pytest.raises(ConfigError, match=r"^admin\.token: too easy to guess") as raised:
        make_config({"crm": {"type": "file", "path": "out"}}, ROUTES, admin={"token": token})
    assert token not in str(raised.value)


def test_a_random_admin_token_is_accepted(make_config: ConfigFactory) -> None:
    config = make_config(
        {"crm": {"type": "file", "path": "out"}},
        ROUTES,
        admin={"token": "kq3V9_Xw-2bLr7TzN4pYc"},
    )
    assert config.admin.token == "kq3V9_Xw-2bLr7TzN4pYc"


async def test_a_reload_cannot_leave_a_public_admin_listener_without_a_token(
    make_config: ConfigFactory,
) -> None:
    """The listener bound at start stays until a restart: the rule "a token off
    loopback" holds for it, whatever the new file says about `listen`."""
    public = make_config(
        {"crm": {"type": "file", "path": "out"}},
        ROUTES,
        admin={"listen": "0.0.0.0:18081", "token": TOKEN},
    )
    relay = Relay(public)  # not started: nothing is bound to 0.0.0.0 by this test
    moved = make_config({"crm": {"type": "file", "path": "out"}}, ROUTES)
    assert moved.admin.token is None
    with pytest.raises(ConfigError, match=r"admin\.token: is required while the admin listener"):
        await relay.reload(moved)
    assert relay.config.admin.token == TOKEN
    assert relay.console.config.admin.token == TOKEN


BAD_API = [
    ("GET", "/api/v1/events?limit=%C2%B2", "limit"),  # "²": isdigit() but not int()
    ("GET", "/api/v1/events?cursor=%C2%B2", "cursor"),
    ("GET", "/api/v1/events?cursor=" + "9" * 30, "cursor"),
    ("GET", "/api/v1/events/%C2%B2", "event_id"),
    ("GET", "/api/v1/events/" + "9" * 30, "event_id"),
    ("POST", "/api/v1/deliveries/" + "9" * 30 + "/retry", "delivery_id"),
    ("POST", "/api/v1/deliveries/%C2%B2/retry", "delivery_id"),
    ("GET", "/api/v1/rejections?limit=%C2%B2", "limit"),
    ("POST", "/api/v1/events/" + "9" * 30 + "/resend", "event_id"),
    # Python's float() reads these; no time is any of them (they were a 503).
    ("GET", "/api/v1/events?since=nan", "since"),
    ("GET", "/api/v1/events?until=inf", "until"),
    ("GET", "/api/v1/events?since=1e300", "since"),
    ("GET", "/api/v1/events?since=1_000", "since"),  # was read as Unix time 1000
    ("GET", "/api/v1/events?since=2026-12-06T10:00%00", "since"),  # the NUL was read past
    ("GET", "/api/v1/events?key=a%00b", "key"),  # a NUL reached the database: 503
    ("GET", "/api/v1/events?q=ab%00cd", "q"),
    ("GET", "/api/v1/events?route=a%1Bb", "route"),
]
BAD_REQUEUE = [
    ({"route": ["x"]}, "route"),
    ({"target": {"a": 1}}, "target"),
    ({"ids": ["²"]}, "ids[0]"),
    ({"ids": [1, 10**30]}, "ids[1]"),
    ({"ids": [True]}, "ids[0]"),
    ({"ids": "1,2"}, "ids"),
    ({"status": ["dead"]}, "status"),
    ({"since": "yesterday-ish"}, "since"),
    ({"since": "nan"}, "since"),
    # 120,000 ids held the event loop 140-183 ms: at most MAX_IDS a request.
    ({"ids": list(range(1, 120_001))}, "ids"),
    ({"key": "a\x00b"}, "key"),
    ({"q": "ab\x00cd"}, "q"),
]
BAD_PAGES = [
    ("GET", "/deliveries?cursor=%C2%B2", "cursor"),
    ("GET", "/dead?cursor=" + "9" * 30, "cursor"),
    ("GET", "/deliveries?since=soon", "since"),
    ("GET", "/events/%C2%B2", "event id"),
    ("GET", "/events/" + "9" * 30, "event id"),
    ("POST", "/deliveries/%C2%B2/retry", "delivery id"),
    ("POST", "/deliveries/" + "9" * 30 + "/requeue", "delivery id"),
    ("POST", "/dead/requeue", "since"),
    ("POST", "/retry", "since"),
    ("GET", "/events/%C2%B2/resend", "event id"),
]


async def test_bad_admin_inputs_are_400_naming_the_field(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
) -> None:
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        relay = await dead_relay(make_config, start_relay, start_sink, http)
        for method, path, field in BAD_API:
            async with http.request(method, relay.admin_url + path, headers=JSON) as response:
                assert response.status == 400, (path, await response.text())
                assert (await response.json())["error"].startswith(field + ":"), path
        for body, field in BAD_REQUEUE:
            async with http.post(relay.admin_url + "/api/v1/requeue", json=body) as response:
                assert response.status == 400, (body, await response.text())
                assert (await response.json())["error"].startswith(field + ":"), body
        csrf = await csrf_of(http, relay.admin_url + "/dead")
        for method, path, field in BAD_PAGES:
            form = {"csrf": csrf, "since": "next tuesday", "confirm": "yes"}
            async with http.request(
                method, relay.admin_url + path, data=form if method == "POST" else None
            ) as response:
                assert response.status == 400, (path, await response.text())
                assert field in await response.text(), path
        # A bad filter is said beside the form, which keeps what was typed: the
        # page stays a page (it was a bare "Bad request: since: …" text).
        for params, said in [
            ({"since": "soon"}, "Since: not a time: &#39;soon&#39;"),
            ({"route": "ordres"}, "Route: no route ordres"),
            ({"status": "ded"}, "Status: no status ded (did you mean dead?)"),
        ]:
            async with http.get(relay.admin_url + "/deliveries", params=params) as response:
                assert response.status == 400
                page = await response.text()
                assert response.content_type == "text/html"
                assert said in page, page
                assert 'class="filters"' in page
                field, value = next(iter(params.items()))
                if field == "since":
                    assert f'name="since" value="{value}"' in page
        async with http.get(relay.admin_url + "/rejections", params={"since": "soon"}) as response:
            page = await response.text()
            assert response.status == 400
            assert "Since: not a time: &#39;soon&#39;" in page
            assert 'name="since" value="soon"' in page
        async with http.get(
            relay.admin_url + "/rejections", params={"since": "yesterday", "until": "now"}
        ) as response:
            assert response.status == 200
        # A search for "²" is a search, not an id: it answers, and finds nothing.
        async with http.get(relay.admin_url + "/deliveries", params={"q": "²"}) as response:
            assert response.status == 200
        assert await dead_count(relay, http) == 1  # the bad requeue requeued nothing


async def test_each_part_of_the_admin_listener_takes_only_its_own_key(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
) -> None:
    """The API and the dashboard keep their own rules: a dashboard session is no
    key to the API, a bearer token none to a page, and the probes need neither."""
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as browser:
        relay = await dead_relay(make_config, start_relay, start_sink, browser, token=TOKEN)
        await sign_in(browser, relay)
        csrf = await csrf_of(browser, relay.admin_url + "/dead")
        for path in ("/api/v1/stats", "/api/v1/no-such-call"):
            async with browser.get(relay.admin_url + path, allow_redirects=False) as response:
                assert response.status == 401, path
                assert response.headers["WWW-Authenticate"].startswith("Bearer")
        async with browser.post(
            relay.admin_url + "/api/v1/requeue", json={"csrf": csrf}, allow_redirects=False
        ) as response:
            assert response.status == 401
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession(headers=bearer) as script:
        for path in ("/dead", "/no-such-page"):
            async with script.get(relay.admin_url + path, allow_redirects=False) as response:
                assert response.status == 302, path
                assert response.headers["Location"].startswith("/login")
        async with script.post(
            relay.admin_url + "/dead/requeue", data={"confirm": "yes"}, allow_redirects=False
        ) as response:
            assert response.status == 403
        async with script.get(relay.admin_url + "/api/v1/stats") as response:
            assert (await response.json())["dead"] == 1  # neither requeue went through
    async with aiohttp.ClientSession() as anyone:
        for path in ("/healthz", "/metrics"):
            async with anyone.get(relay.admin_url + path) as response:
                assert response.status == 200, path


async def test_a_locked_database_is_a_503_in_each_parts_own_words(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
) -> None:
    """Store trouble is never a bare 500: JSON for the API, a sentence for a page."""
    _, url = await start_sink([400])
    config = make_config(
        {"crm": {"type": "http", "url": url}}, ROUTES, storage={"busy_timeout": "200ms"}
    )
    relay = await start_relay(config, background=False, clock=FakeClock())
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        async with http.post(relay.ingress_url + "/hooks/orders", json={"n": 1}) as response:
            assert response.status == 200
        await relay.scheduler.drain()
        csrf = await csrf_of(http, relay.admin_url + "/dead")
        locker = sqlite3.connect(config.storage.path, isolation_level=None)
        locker.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        try:
            async with http.post(
                relay.admin_url + "/api/v1/deliveries/1/retry", headers=JSON
            ) as response:
                assert response.status == 503
                assert (await response.json())["error"].startswith("store unavailable")
            async with http.post(
                relay.admin_url + "/deliveries/1/retry", data={"csrf": csrf}
            ) as response:
                assert response.status == 503
                assert response.content_type == "text/plain"
                assert "The database cannot be read right now" in await response.text()
                assert "Content-Security-Policy" in response.headers
        finally:
            locker.execute("ROLLBACK")
            locker.close()


async def test_a_missing_event_delivery_or_target_is_a_404_in_the_same_words(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
) -> None:
    """relay.ops.actions says what is missing; the API, the dashboard (and the CLI:
    tests/e2e/test_cli_inputs.py) say it in those words."""
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        relay = await dead_relay(make_config, start_relay, start_sink, http)
        api = relay.admin_url + "/api/v1"
        for method, path, said in [
            ("GET", "/events/404", "no event 404"),
            ("POST", "/events/404/resend", "no event 404"),
            ("POST", "/deliveries/404/retry", "no delivery 404"),
            ("POST", "/deliveries/404/skip", "no delivery 404"),
            ("POST", "/targets/nowhere/pause", "no target nowhere; the targets are: crm"),
        ]:
            body = {"body": "{}"} if path.endswith("resend") else {}
            async with http.request(method, api + path, json=body) as response:
                assert response.status == 404, path
                assert (await response.json())["error"] == said, path
        csrf = await csrf_of(http, relay.admin_url + "/dead")
        for method, path, said in [
            ("GET", "/events/404", "No event 404."),
            ("GET", "/events/404/resend", "No event 404."),
            ("POST", "/deliveries/404/retry", "No delivery 404."),
            ("POST", "/deliveries/404/requeue", "No delivery 404."),
            ("POST", "/deliveries/404/skip", "No delivery 404."),
            ("POST", "/targets/nowhere/resume", "No target nowhere; the targets are: crm."),
        ]:
            form = {"csrf": csrf} if method == "POST" else None
            async with http.request(method, relay.admin_url + path, data=form) as response:
                assert response.status == 404, path
                assert await response.text() == said, path
