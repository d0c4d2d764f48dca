"""The Deliveries dashboard: server-rendered pages on the admin listener.

Sign in with the admin token for a signed session cookie (HttpOnly,
SameSite=Strict, Secure behind TLS); every form that changes something
carries a CSRF token. No build step, no CDN: the templates, a stylesheet and
one small script ship in the package.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import math
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode, urlsplit

import orjson
from aiohttp import web

from relay.admin.api import stream_export
from relay.admin.console import CONSOLE, Console
from relay.admin.session import LOGIN_COOKIE, SESSION_COOKIE, SESSION_SECONDS, Sessions
from relay.admin.throttle import AUTH_FAILURES, client, too_many
from relay.core.localtime import Zone, format_iso_local, format_local
from relay.core.payload import media_type, parse_form
from relay.core.secrets import MASK, Masker
from relay.ops.actions import BULK_LIMIT, selection_of
from relay.ops.export import export_of
from relay.ops.glance import glances, with_glance
from relay.ops.inputs import BadRequest, failing, instant, known_name, row_id, row_ids
from relay.ops.resend import (
    FORM,
    EditRejected,
    default_targets,
    editable_body,
    editable_fields,
    fields_body,
    plan_resend,
)
from relay.ops.search import SearchError, parse_search, searched_for
from relay.ops.views import (
    audit_view,
    delivery_summary,
    event_detail,
    event_summary,
    failing_view,
    mark_probes,
    not_indexed,
    preview_view,
    rejection_view,
    silent_view,
    stats_view,
)
from relay.store import (
    Conflict,
    EventDetail,
    EventQuery,
    EventView,
    NotFound,
    SearchTooSlow,
    Selection,
    Status,
    StoreError,
    verbs,
)
from relay.store.base import Shared

if TYPE_CHECKING:
    import jinja2

HERE = Path(__file__).parent
PAGE_SIZE = 50
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

SESSIONS = web.AppKey("sessions", Sessions)
STATIC = web.AppKey("static", dict[str, tuple[bytes, str]])
SESSION = web.RequestKey("session", str)

SECURITY_HEADERS = {
    # Scripts and styles only from here: no inline code, nothing from elsewhere.
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self';"
    " script-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    # Nothing leaves for other sites, and our own form posts carry our Origin
    # (under "no-referrer" a browser sends "Origin: null", which the origin guard doubts).
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}

MESSAGES = {
    "retried": "One more attempt is queued for delivery {id}.",
    "requeued": "Requeued {n}: each starts a fresh retry cycle.",
    "requeue_bulk": "Requeued {n}: each starts a fresh retry cycle.",
    "skip_bulk": "Skipped {n}: they will not be sent.",
    "retried_bulk": "Sent now: {n}, each one more attempt at its target's pace (counts kept,"
    " no new cycle).",
    "retried_down": "Sent now: {n}. Target {name} is down: its probe goes now, the rest once"
    " it answers.",
    "retried_held": "Sent now: {n}. Target {name} asked relay to wait: they go when its hold"
    " ends (see Targets).",
    "skipped": "Delivery {id} is skipped: it will not be sent; the next of its key may go.",
    "paused": "Target {name} is paused: its deliveries wait, no retries are spent.",
    "resumed": "Target {name} is resumed.",
    "signed_out": "Signed out.",
    "resent": "Corrected copy of event {id} sent: this is the new event.",
}


@functools.cache
def _templates() -> jinja2.Environment:
    # Loaded with the first page shown, not at start: most of the time nobody
    # looks, and Jinja2 is ~2 MiB of a relay's memory (relay/core/budget.py).
    import jinja2

    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )

    @jinja2.pass_context
    def local(context: jinja2.runtime.Context, text: str | None) -> str:
        """A view's UTC time in the config's zone, with its offset ("—" for none)."""
        return format_iso_local(text, context["zone"]) if text else "—"

    environment.filters["local"] = local
    return environment


def _load_static() -> dict[str, tuple[bytes, str]]:
    types = {".css": "text/css", ".js": "text/javascript"}
    return {
        path.name: (path.read_bytes(), types[path.suffix])
        for path in (HERE / "static").iterdir()
        if path.suffix in types
    }


def add_dashboard(app: web.Application, console: Console) -> None:
    """The dashboard's pages on the admin listener, each behind the dashboard's
    own rules (`signed_in`). They are routes of the listener, not a sub-app:
    aiohttp mounts no sub-app at "/" (aio-libs/aiohttp#2979, where its author
    advises guarding the handlers instead), and a domain-matched one is tried
    before every other path, so it would take /api and the probes too."""
    app[SESSIONS] = Sessions(lambda: console.config.admin.token)
    app[STATIC] = _load_static()
    router = app.router
    # What a signed-out browser may load: the sign-in and its stylesheet and script.
    router.add_get("/static/{name}", static_file)
    router.add_get("/login", login_page)
    router.add_post("/login", login)
    for method, path, page in PAGES:
        router.add_route(method, path, signed_in(page))
    # Any other GET is the dashboard's too: signed out, it leads to the sign-in
    # (which page exists is nobody's business before that); signed in, a 404.
    router.add_get("/{path:.*}", signed_in(no_such_page))


async def static_file(request: web.Request) -> web.Response:
    found = request.app[STATIC].get(request.match_info["name"])
    if found is None:
        raise web.HTTPNotFound()
    body, content_type = found
    return web.Response(
        body=body,
        content_type=content_type,
        headers={"Cache-Control": "max-age=3600", "X-Content-Type-Options": "nosniff"},
    )


# Sessions, CSRF, headers


def signed_in(page: Handler) -> Handler:
    """`page` for a signed-in session only, its forms with their CSRF token, its
    answer with the dashboard's security headers and store trouble said plainly."""

    async def guarded(request: web.Request) -> web.StreamResponse:
        return await guard(request, page)

    return guarded


async def guard(request: web.Request, page: Handler) -> web.StreamResponse:
    console = request.config_dict[CONSOLE]
    sessions = request.app[SESSIONS]
    session = sessions.valid(request.cookies.get(SESSION_COOKIE), time.time())
    fresh: str | None = None
    if session is None:
        if console.config.admin.token is not None:
            if request.method != "GET":
                return _plain(403, "Sign in first.")
            target = "/login?" + urlencode({"next": request.path_qs})
            raise web.HTTPFound(target)
        # No token (loopback only): everyone is signed in, but forms still
        # need a session to bind their CSRF token to.
        fresh = sessions.issue(time.time())
        session = sessions.valid(fresh, time.time())
        assert session is not None
    if request.method == "POST":
        form = await request.post()
        given = form.get("csrf")
        if not sessions.csrf_matches(session, given if isinstance(given, str) else None):
            return _plain(403, "This form has expired or did not come from this dashboard.")
    request[SESSION] = session
    response = await store_errors(request, page)
    if fresh is not None:
        _set_cookie(request, response, SESSION_COOKIE, fresh, SESSION_SECONDS)
    response.headers.update(SECURITY_HEADERS)
    return response


def _secure(request: web.Request) -> bool:
    return request.secure or request.headers.get("X-Forwarded-Proto") == "https"


def _set_cookie(
    request: web.Request, response: web.StreamResponse, name: str, value: str, max_age: int
) -> None:
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        path="/",
        httponly=True,
        samesite="Strict",
        secure=_secure(request),
    )


def _sentence(message: str) -> str:
    """A message of relay's ("no event 5") as the dashboard shows it: "No event 5." """
    return message[:1].upper() + message[1:] + "."


def _plain(status: int, text: str) -> web.Response:
    return web.Response(status=status, text=text, headers=SECURITY_HEADERS)


def _render(request: web.Request, name: str, **context: Any) -> web.Response:
    template, values, status = _prepared(request, name, context)
    return _html(template.render(**values), status)


async def _render_body(request: web.Request, name: str, **context: Any) -> web.Response:
    """`_render` for a page that shows a webhook's body (up to a route's
    max_body_size, and again pretty-printed): rendered in a worker thread, as
    its masking is, so that no page holds the event loop."""
    template, values, status = _prepared(request, name, context)
    return _html(await asyncio.to_thread(template.render, **values), status)


def _html(html: str, status: int) -> web.Response:
    return web.Response(
        text=html, content_type="text/html", status=status, headers=SECURITY_HEADERS
    )


def _prepared(
    request: web.Request, name: str, context: dict[str, Any]
) -> tuple[jinja2.Template, dict[str, Any], int]:
    console = request.config_dict[CONSOLE]
    session = request.get(SESSION)
    done = request.query.get("done", "")
    message = MESSAGES.get(done, "")
    if message:
        values = {key: request.query.get(key, "") for key in ("id", "n", "name")}
        message = message.format(**values)
    base = {
        "title": context.get("title", "relay"),
        "page": context.get("page", ""),
        "signed_in": session is not None,
        "token_set": console.config.admin.token is not None,
        "csrf": request.app[SESSIONS].csrf(session) if session else "",
        "dead_total": context.pop("dead_total", None),
        "done": message,
        "problem": context.pop("problem", ""),
        "zone": console.config.zone,
        # The page keeps itself up to date in place (relay.js): its parts marked data-live.
        "auto_refresh": False,
    }
    http_status = context.pop("http_status", None)
    status = http_status or context.get("status", 200)
    return _templates().get_template(name), {**base, **context}, status


def _back(path: str, **params: object) -> web.HTTPSeeOther:
    query = urlencode({k: v for k, v in params.items() if v is not None})
    return web.HTTPSeeOther(f"{path}?{query}" if query else path)


# Sign in and out


async def login_page(request: web.Request) -> web.StreamResponse:
    console = request.config_dict[CONSOLE]
    if console.config.admin.token is None:
        raise web.HTTPFound("/")
    login_csrf = request.cookies.get(LOGIN_COOKIE) or secrets.token_urlsafe(24)
    response = _render(
        request,
        "login.html",
        title="Sign in",
        login_csrf=login_csrf,
        next=_safe_next(request.query.get("next")),
        problem="Wrong token." if request.query.get("failed") else "",
    )
    _set_cookie(request, response, LOGIN_COOKIE, login_csrf, 3600)
    return response


def _safe_next(value: str | None) -> str:
    """Only a path on this dashboard: never an open redirect to another site.

    Browsers drop tabs and newlines from a URL and read a backslash as a slash,
    so "/%09/evil.example" (decoded: a tab) would go to //evil.example: anything but printable,
    non-space characters is refused, then the value is parsed as a URL and must
    have neither a scheme nor a host."""
    if not value or "\\" in value or any(c.isspace() or not c.isprintable() for c in value):
        return "/"
    parts = urlsplit(value)
    if parts.scheme or parts.netloc or not parts.path.startswith("/") or value.startswith("//"):
        return "/"
    return value


async def login(request: web.Request) -> web.StreamResponse:
    form = await request.post()
    sessions = request.app[SESSIONS]
    cookie = request.cookies.get(LOGIN_COOKIE)
    given_csrf = form.get("csrf")
    if (
        not cookie
        or not isinstance(given_csrf, str)
        or not secrets.compare_digest(cookie, given_csrf)
    ):
        return _plain(403, "This form has expired: open the sign-in page again.")
    failures = request.config_dict[AUTH_FAILURES]
    address = client(request)
    wait = failures.retry_after(address)
    if wait is not None:
        return too_many(wait)
    token = form.get("token")
    next_path = _safe_next(str(form.get("next") or "/"))
    if not isinstance(token, str) or not sessions.token_matches(token):
        failures.failed(address, "dashboard: wrong admin token at sign-in")
        await asyncio.sleep(0.5)  # guessing tokens stays slow
        raise web.HTTPSeeOther("/login?" + urlencode({"failed": "1", "next": next_path}))
    response = web.HTTPSeeOther(next_path)
    _set_cookie(request, response, SESSION_COOKIE, sessions.issue(time.time()), SESSION_SECONDS)
    response.del_cookie(LOGIN_COOKIE, path="/")
    raise response


async def logout(request: web.Request) -> web.StreamResponse:
    # Revoked here, not only deleted in this browser: a copy of the cookie is dead too.
    request.app[SESSIONS].revoke(request[SESSION])
    response = web.HTTPSeeOther("/login?done=signed_out")
    response.del_cookie(SESSION_COOKIE, path="/")
    raise response


# Pages


def _by(request: web.Request) -> str:
    """Who acts from the dashboard: the session (its first characters, enough
    to tell sessions apart, too few to use one) and the browser's address."""
    session = request.get(SESSION, "")
    where = request.remote or "unknown address"
    # No admin token set, the dashboard has no sessions: only the address tells.
    return f"dashboard session {session[:8]} from {where}" if session else f"dashboard from {where}"


def _console(request: web.Request) -> Console:
    return request.config_dict[CONSOLE]


# When this browser last looked at Dead letter: the Overview counts what
# went dead since (a cookie: each person's own last look, no account needed).
SEEN_COOKIE = "relay_dead_seen"
SEEN_SECONDS = 365 * 24 * 3600
# Held keys, and deliveries that keep failing, the Overview lists at most.
HELD_SHOWN = 20
FAILING_SHOWN = 10


def _last_look(request: web.Request) -> float | None:
    try:
        seen = float(request.cookies.get(SEEN_COOKIE, ""))
    except ValueError:
        return None
    return seen if math.isfinite(seen) else None


async def overview(request: web.Request) -> web.Response:
    console = _console(request)
    now = console.clock.now()
    store = console.store
    masker = console.masker
    instances = await store.instances() if isinstance(store, Shared) else None
    stats = stats_view(await store.stats(), now, console.scheduler.paused, masker, instances)
    activity = await console.store.activity(now - 23 * 3600, now)
    pending = sum(info["pending"] for info in stats["targets"].values())
    last_look = _last_look(request)
    attention = await console.store.attention(last_look or 0.0, HELD_SHOWN)
    flagged = await console.store.flagged_events(HELD_SHOWN)
    failing = await store.failing_deliveries(
        console.config.alerts.delivery_failing_after, FAILING_SHOWN
    )
    watches = (await store.route_watches()).routes
    silent_routes = [
        silent_view(name, watch, now)
        for name, watch in sorted(watches.items())
        if name in console.config.routes and watch.silent_since is not None
    ]
    failing_routes = [
        {"route": route, "target": target, "failures": failures, "error": masker.text(error)}
        for (route, target), (failures, error) in sorted(console.route_health().items())
        # A down target is listed as such: its routes need no line of their own.
        if route in console.config.routes and not stats["targets"].get(target, {}).get("down")
    ]
    return _render(
        request,
        "overview.html",
        title="Overview",
        page="overview",
        stats=stats,
        pending_total=pending,
        chart=_chart(activity, console.config.zone),
        dead_total=stats["dead"],
        last_look=format_local(last_look, console.config.zone) if last_look is not None else None,
        dead_since=attention.dead_since,
        held=attention.held,
        flagged=[event_summary(event, masker) for event in flagged],
        failing_routes=failing_routes,
        failing_deliveries=[failing_view(found, masker) for found in failing.first],
        failing_total=failing.total,
        silent_routes=silent_routes,
        failing_after=console.config.alerts.delivery_failing_after,
        auto_refresh=True,
    )


def _chart(activity: list[Any], zone: Zone) -> dict[str, Any]:
    width, height, gap = 960, 120, 4
    bar_width = width / max(len(activity), 1) - gap
    peak = max((hour.attempts for hour in activity), default=0) or 1
    bars = []
    for index, hour in enumerate(activity):
        ok = hour.attempts - hour.failed
        bars.append(
            {
                "x": round(index * (bar_width + gap), 1),
                "ok_height": round(height * ok / peak, 1),
                "failed_height": round(height * hour.failed / peak, 1),
                "attempts": hour.attempts,
                "failed": hour.failed,
                "dead": hour.dead,
                "label": format_local(hour.hour, zone)[11:16],
            }
        )
    return {
        "width": width,
        "height": height,
        "bar_width": round(bar_width, 1),
        "bars": bars,
        "first": bars[0]["label"] if bars else "",
        "total_attempts": sum(hour.attempts for hour in activity),
        "total_dead": sum(hour.dead for hour in activity),
    }


FILTERS = ("q", "status", "route", "target", "since", "until", "failing")


def _filters(request: web.Request) -> dict[str, str]:
    return {name: request.query.get(name, "").strip() for name in FILTERS}


async def _listing(
    request: web.Request, *, status: Status | None, template: str, **extra: Any
) -> web.Response:
    console = _console(request)
    filters = _filters(request)
    search = filters["q"]
    cursor = request.query.get("cursor", "")
    before_id = row_id(cursor, "cursor") if cursor else None
    try:
        query = await _event_filters(console, filters, status, before_id)
    except BadRequest as bad:
        # Said beside the form, which keeps what was typed: never a bare text page.
        query, problem = None, _sentence(str(bad))
        extra["http_status"] = 400
    if query is not None:
        events, search_note, problem = await _search(console, query, search)
    else:
        events, search_note = [], ""
    terms = None
    if search and search_note:  # a content search: its words around each match
        with contextlib.suppress(SearchError):
            terms = parse_search(search)
    found = await glances(console.store, events, console.masker, terms)
    event_id = search.removeprefix("#")
    if not events and _is_id(event_id) and await console.store.get_event(int(event_id)):
        raise web.HTTPFound(f"/events/{int(event_id)}")  # the search was an event id
    masker = console.masker
    next_page = None
    if len(events) == PAGE_SIZE:
        params = {k: v for k, v in filters.items() if v} | {"cursor": str(events[-1].id)}
        next_page = f"{request.path}?{urlencode(params)}"
    config = console.config
    return _render(
        request,
        template,
        events=[with_glance(event_summary(e, masker), found.get(e.id)) for e in events],
        filters=filters,
        next_page=next_page,
        export=f"/export?{urlencode({k: v for k, v in filters.items() if v})}",
        statuses=[s.value for s in Status],
        routes=sorted(config.routes),
        targets=sorted(config.targets),
        failing_after=config.alerts.delivery_failing_after,
        search_note=search_note,
        problem=problem,
        **{"selectable": False, **extra},
    )


async def _event_filters(
    console: Console, filters: Mapping[str, str], status: Status | None, before_id: int | None
) -> EventQuery:
    """The listing's filters, each checked: an unknown route, target or status
    or a time that does not parse is a BadRequest naming the field."""
    now, zone = console.clock.now(), console.config.zone
    threshold = console.config.alerts.delivery_failing_after
    named = known_name(filters["status"], "status", "status", [s.value for s in Status])
    if status is None and named:
        status = Status(named)
    query = EventQuery(
        status=status,
        route=filters["route"] or None,
        target=filters["target"] or None,
        since=instant(filters["since"], "since", now, zone),
        until=instant(filters["until"], "until", now, zone),
        limit=PAGE_SIZE,
        before_id=before_id,
        failing=failing(filters["failing"], "failing", threshold),
    )
    await console.check_names(query.route, query.target)
    return query


async def _search(
    console: Console, query: EventQuery, text: str
) -> tuple[list[EventView], str, str]:
    """Events for the search box: an exact idempotency key first, else content.

    Returns the events, a note on how far the index has got, and a problem
    with the search text (too short) when there is one.
    """
    try:
        query = await console.searched(query, text)
    except SearchError as problem:
        return [], "", str(problem).capitalize() + "."
    try:
        events = await console.store.list_events(query)
    except SearchTooSlow as problem:
        return [], "", str(problem).capitalize() + "."
    if query.search is None:
        return events, "", ""
    terms = query.search
    progress = await console.store.search_progress()
    note = f"Searched for {searched_for(terms)} in bodies, queries and headers"
    if progress.behind:
        note += f"; the newest {not_indexed(progress)} are not indexed yet and were not searched."
    else:
        note += "; every stored event is indexed."
    return events, note, ""


async def export_listing(request: web.Request) -> web.StreamResponse:
    """The Deliveries listing's events, all of them, as a download (Export):
    the same filters, search included, as ?format= and ?fields= say
    (relay.ops.export; excel by default, for a spreadsheet)."""
    console = _console(request)
    filters = _filters(request)
    query = await _event_filters(console, filters, None, None)
    if filters["q"]:
        try:
            query = await console.searched(query, filters["q"])
        except SearchError as problem:
            raise BadRequest(f"q: {problem}") from None
    params = request.query
    export = export_of(params.get("format") or "excel", params.get("fields"), console.config.zone)
    return await stream_export(request, console, query, export)


async def deliveries(request: web.Request) -> web.Response:
    console = _console(request)
    filters = _filters(request)
    # Filtered to pending (or dead): those it shows can be sent now.
    waiting = 0
    if filters["status"] in [status.value for status in verbs.RETRIED]:
        with contextlib.suppress(BadRequest):  # the listing says what is wrong
            shown = await _shown(console, filters, Status(filters["status"]))
            waiting = await console.store.count(replace(shown, sendable=True))
    return await _listing(
        request,
        status=None,
        template="deliveries.html",
        title="Deliveries",
        page="deliveries",
        heading="Deliveries",
        action="/deliveries",
        show_status=True,
        auto_refresh=True,
        waiting=waiting,
        filter_fields=[(k, v) for k, v in filters.items() if v and k in (*BULK_FIELDS, "status")],
    )


def _query(
    fields: Mapping[str, str], now: float, zone: Zone, status: Status = Status.DEAD
) -> EventQuery:
    """The listing's filters (the search box apart) from a page's fields."""
    return EventQuery(
        status=status,
        route=fields.get("route") or None,
        target=fields.get("target") or None,
        since=instant(fields.get("since", ""), "since", now, zone),
        until=instant(fields.get("until", ""), "until", now, zone),
    )


async def _shown(
    console: Console, fields: Mapping[str, str], status: Status = Status.DEAD
) -> Selection:
    """The deliveries in `status` a listing shows for these fields (Dead
    letter's, or Deliveries' with that status), search box included: what
    its bulk actions take, no more."""
    query = _query(fields, console.clock.now(), console.config.zone, status)
    try:
        query = await console.searched(query, fields.get("q", ""))
    except SearchError as problem:
        raise BadRequest(f"q: {problem}") from None
    return selection_of(query, status)


BULK_FIELDS = ("q", "route", "target", "since", "until")


async def dead_letter(request: web.Request) -> web.Response:
    console = _console(request)
    filters = _filters(request)
    try:
        total = await console.store.count(await _shown(console, filters))
    except BadRequest:
        total = 0  # the listing says what is wrong with the search
    fields = [(k, v) for k, v in filters.items() if v and k in BULK_FIELDS]
    response = await _dead_listing(request, total, fields)
    # Looked at: the Overview's "dead since your last look" starts again here.
    seen = repr(console.clock.now())
    _set_cookie(request, response, SEEN_COOKIE, seen, SEEN_SECONDS)
    return response


async def _dead_listing(
    request: web.Request, total: int, fields: list[tuple[str, str]]
) -> web.Response:
    return await _listing(
        request,
        status=Status.DEAD,
        template="dead.html",
        title="Dead letter",
        page="dead",
        heading="Dead letter",
        action="/dead",
        show_status=False,
        auto_refresh=True,
        total=total,
        filter_fields=fields,
        selectable=True,
        dead_total=total if not fields else None,
    )


# A bulk action: what the confirmation says, what is done, the flash after it.
BULK = {
    "requeue": ("Requeue", "requeue", "each starts a fresh retry cycle; their history is kept"),
    "skip": (
        "Skip",
        "skip",
        "none of them will ever be sent, and the next delivery of each ordering key may go",
    ),
}


async def requeue_dead(request: web.Request) -> web.StreamResponse:
    return await _bulk(request, "requeue")


async def skip_dead(request: web.Request) -> web.StreamResponse:
    return await _bulk(request, "skip")


async def _bulk(request: web.Request, verb: str) -> web.StreamResponse:
    """A bulk action on dead deliveries: the ones ticked, else every one the page
    shows (its filters and search). First a confirmation that states the count
    and carries the very ids counted; confirmed, it acts on those ids alone
    (any that stopped being dead meanwhile are left as they are)."""
    console = _console(request)
    form = await request.post()
    fields = {k: str(form.get(k, "")).strip() for k in BULK_FIELDS}
    await console.check_names(fields["route"] or None, fields["target"] or None)
    kept = [(k, v) for k, v in fields.items() if v]
    back = ("?" + urlencode(kept)) if kept else ""
    if form.get("confirm") != "yes":
        ticked = row_ids([str(v) for v in form.getall("ids", [])], "ids")
        selection = (
            Selection(status=Status.DEAD, ids=ticked) if ticked else await _shown(console, fields)
        )
        ids = await console.select(selection, BULK_LIMIT + 1)
        matching = await console.store.count(selection) if len(ids) > BULK_LIMIT else len(ids)
        ids = ids[:BULK_LIMIT]
        title, doing, effect = BULK[verb]
        return _render(
            request,
            "confirm.html",
            title=title,
            page="dead",
            verb=verb,
            label=title,
            doing=doing,
            state="dead",
            effect=effect,
            action=f"/dead/{verb}",
            cancel=f"/dead{back}",
            count=len(ids),
            matching=matching,
            ids=" ".join(str(i) for i in ids),
            ticked=bool(ticked),
            filter_fields=kept,
            description=", ".join(f"{k} {v}" for k, v in kept),
        )
    named = row_ids(str(form.get("ids", "")).split(), "ids")
    if not named:
        raise _back("/dead", **dict(kept))
    selection = Selection(status=Status.DEAD, ids=named)
    if verb == "requeue":
        done = await console.requeue(selection, by=_by(request))
    else:
        done = await console.skip_selected(selection, by=_by(request))
    raise _back("/dead", done=f"{verb}_bulk", n=len(done), **dict(kept))


# What "Send now" does, as its confirmation says it.
SEND_NOW = (
    "one more attempt each, now, at its target's pace (its rate and concurrency, and any"
    " wait the receiver asked for); the attempt count is kept and no new cycle starts;"
    " a line's waiting ones keep their turn; a down target is probed first"
)


async def retry_waiting(request: web.Request) -> web.StreamResponse:
    """Send the waiting ones now (a retry now by filter): the pending (or dead)
    deliveries the Deliveries page shows with its filters, or a target's from
    the Targets page. First a confirmation that states the count and carries
    the very ids counted; confirmed, it acts on those ids alone. A paused
    target is refused with how to resume it."""
    console = _console(request)
    form = await request.post()
    fields = {k: str(form.get(k, "")).strip() for k in (*BULK_FIELDS, "status")}
    status = Status(
        known_name(
            fields["status"] or "pending", "status", "status", [s.value for s in verbs.RETRIED]
        )
        or "pending"
    )
    fields["status"] = status.value
    await console.check_names(fields["route"] or None, fields["target"] or None)
    kept = [(k, v) for k, v in fields.items() if v]
    cancel = "/targets" if form.get("from") == "targets" else f"/deliveries?{urlencode(kept)}"
    if form.get("from") == "targets":
        kept.append(("from", "targets"))
    page: dict[str, Any] = {
        "title": "Send now",
        "page": "deliveries",
        "verb": "retry",
        "label": "Send now",
        "doing": "send now",
        "state": status.value,
        "effect": SEND_NOW,
        "action": "/retry",
        "cancel": cancel,
        "filter_fields": kept,
        "description": ", ".join(f"{k} {v}" for k, v in kept if k not in ("from", "status")),
        "ticked": False,
    }
    if form.get("confirm") != "yes":
        selection = replace(await _shown(console, fields, status), sendable=True)
        ids = await console.select(selection, BULK_LIMIT + 1)
        matching = await console.store.count(selection) if len(ids) > BULK_LIMIT else len(ids)
        ids = ids[:BULK_LIMIT]
        paused = sorted(console.scheduler.paused & {fields["target"]})
        return _render(
            request,
            "confirm.html",
            **page,
            count=len(ids),
            matching=matching,
            ids=" ".join(str(i) for i in ids),
            problem=_sentence(verbs.paused(paused)) if paused else "",
        )
    named = row_ids(str(form.get("ids", "")).split(), "ids")
    if not named:
        raise web.HTTPSeeOther(cancel)
    selection = Selection(status=status, ids=named, sendable=True)
    try:
        done = await console.retry_selected(selection, by=_by(request))
    except Conflict as refused:
        return _render(
            request,
            "confirm.html",
            **page,
            count=len(named),
            matching=len(named),
            ids=" ".join(map(str, named)),
            problem=_sentence(str(refused)),
            http_status=409,
        )
    said = "retried_bulk"
    names = done.probed or sorted(done.held)
    if done.probed:
        said = "retried_down"
    elif done.held:
        said = "retried_held"
    raise web.HTTPSeeOther(
        f"{cancel}{'&' if '?' in cancel else '?'}"
        + urlencode({"done": said, "n": len(done.ids), "name": ", ".join(names)})
    )


async def event_page(request: web.Request) -> web.Response:
    console = _console(request)
    detail = await _detail(request)
    states = await console.store.target_states()
    # Masking is linear in the body, and a body may be a MiB: off the loop.
    event, pretty_json, form_fields = await asyncio.to_thread(_event_view, detail, console.masker)
    event = mark_probes(event, states)
    return await _render_body(
        request,
        "event.html",
        title=f"Event {event['id']}",
        page="deliveries",
        event=event,
        pretty_json=pretty_json,
        form_fields=form_fields,
        down=frozenset(console.scheduler.down),
        auto_refresh=True,
    )


def _event_view(
    detail: EventDetail, masker: Masker
) -> tuple[dict[str, Any], str | None, list[tuple[str, str]] | None]:
    """An event as its page shows it: masked, and its body as JSON or form fields."""
    event = event_detail(detail, masker)
    pretty_json = None
    form_fields = None
    if event["body"] is not None:
        try:
            pretty_json = orjson.dumps(
                orjson.loads(event["body"]), option=orjson.OPT_INDENT_2
            ).decode()
        except orjson.JSONDecodeError:
            fields = parse_form(event["content_type"], event["body"].encode())
            form_fields = list(fields.items()) if fields else None
    return event, pretty_json, form_fields


async def _detail(request: web.Request) -> EventDetail:
    event_id = row_id(request.match_info["event_id"], "event id")
    return await _console(request).event(event_id)


async def resend_page(request: web.Request) -> web.Response:
    """The edit form: the body as shown (secrets masked), the event's targets."""
    console = _console(request)
    detail = await _detail(request)
    fields: str | None = None
    if request.query.get("wire") != "1":  # the form's fields decoded, unless asked
        fields = await asyncio.to_thread(editable_fields, detail, console.masker)
    try:
        body: str = (
            fields
            if fields is not None
            else await asyncio.to_thread(editable_body, detail, console.masker)
        )
    except EditRejected as problem:
        return _plain(problem.status, str(problem))
    chosen = default_targets(detail)
    return await _resend_form(
        request,
        detail,
        body,
        detail.payload.content_type or "",
        chosen,
        as_fields=fields is not None,
    )


async def resend_post(request: web.Request) -> web.StreamResponse:
    """Preview (action=preview), then send (action=send) exactly what was previewed."""
    console = _console(request)
    detail = await _detail(request)
    form = await request.post()
    text = str(form.get("body", ""))
    if b"\r" not in detail.payload.body:  # a textarea sends CRLF; keep the original's line ends
        text = text.replace("\r\n", "\n")
    content_type = str(form.get("content_type", "")).strip()
    wanted = [str(name) for name in form.getall("target", [])]
    by = _by(request)
    as_fields = form.get("format") == "fields"
    try:
        if not wanted:  # an empty choice is not "the default targets" here
            raise EditRejected(400, "choose at least one target")
        if as_fields:
            edited = await asyncio.to_thread(fields_body, text, detail, console.masker)
        else:
            edited = text.encode("utf-8")
        plan = await asyncio.to_thread(
            plan_resend,
            console.config,
            detail,
            edited,
            content_type or None,
            wanted,
            by,
            console.masker,
        )
    except EditRejected as rejected:
        return await _resend_form(
            request,
            detail,
            text,
            content_type,
            wanted,
            as_fields=as_fields,
            problem=_sentence(str(rejected)),
            status=rejected.status,
        )
    digest = _previewed(
        text, plan.resend.content_type, plan.resend.targets, "fields" if as_fields else "wire"
    )
    confirmed = form.get("action") == "send" and form.get("previewed") == digest
    if confirmed and not plan.failures:
        copy_id = await console.resend(plan.resend)
        raise _back(f"/events/{copy_id}", done="resent", id=detail.event.id)
    problem = ""
    if form.get("action") == "send" and not confirmed:
        problem = "The body or targets changed since the preview: check the preview, then send."
    return await _resend_form(
        request,
        detail,
        text,
        plan.resend.content_type,
        list(plan.resend.targets),
        as_fields=as_fields,
        previews=[preview_view(p) for p in plan.previews],
        failed=bool(plan.failures),
        previewed=digest,
        problem=problem,
    )


def _previewed(text: str, content_type: str, targets: Sequence[str], form: str) -> str:
    """A fingerprint of what a preview showed (the masked text: no secret is hashed)."""
    material = "\0".join([text, content_type, form, *targets]).encode("utf-8", "surrogatepass")
    return hashlib.sha256(material).hexdigest()


async def _resend_form(
    request: web.Request,
    detail: EventDetail,
    body: str,
    content_type: str,
    chosen: Sequence[str],
    **context: Any,
) -> web.Response:
    own = {d.target: d.status.value for d in detail.event.deliveries}
    masked = MASK in body
    as_fields: bool = context.pop("as_fields", False)
    # The other form of the same body is one click away (a link, not re-parsed here).
    can_decode = as_fields or media_type(detail.payload.content_type) == FORM
    return await _render_body(
        request,
        "resend.html",
        title=f"Edit and resend event {detail.event.id}",
        page="deliveries",
        event={"id": str(detail.event.id)},
        body=body,
        content_type=content_type,
        targets=[(name, name in chosen, state) for name, state in own.items()],
        chosen=list(chosen),
        masked=masked,
        as_fields=as_fields,
        can_decode=can_decode,
        previews=context.pop("previews", None),
        failed=context.pop("failed", False),
        previewed=context.pop("previewed", ""),
        **context,
    )


async def retry_delivery(request: web.Request) -> web.StreamResponse:
    console = _console(request)
    delivery_id = _delivery_id(request)
    try:
        delivery = await console.retry(delivery_id, by=_by(request))
    except Conflict as problem:
        return _plain(409, str(problem))
    raise _back(f"/events/{delivery.event_id}", done="retried", id=delivery_id)


async def requeue_delivery(request: web.Request) -> web.StreamResponse:
    console = _console(request)
    delivery_id = _delivery_id(request)
    delivery = await console.delivery(delivery_id)
    requeued = await console.requeue(Selection(ids=(delivery_id,)), by=_by(request))
    raise _back(f"/events/{delivery.event_id}", done="requeued", n=len(requeued))


async def skip_delivery(request: web.Request) -> web.StreamResponse:
    """Skip asks first: a skipped delivery is never sent, and it lets the next
    delivery of its ordering key go."""
    console = _console(request)
    delivery_id = _delivery_id(request)
    delivery = await console.delivery(delivery_id)
    form = await request.post()
    if form.get("confirm") != "yes":
        return _render(
            request,
            "confirm_skip.html",
            title="Skip",
            page="deliveries",
            delivery=delivery_summary(delivery, console.masker),
            event_id=delivery.event_id,
        )
    try:
        await console.skip(delivery_id, by=_by(request))
    except Conflict as problem:
        return _plain(409, str(problem))
    raise _back(f"/events/{delivery.event_id}", done="skipped", id=delivery_id)


async def delivery_page(request: web.Request) -> web.StreamResponse:
    """A delivery is shown on its event's page: links name deliveries (a
    down target's probe, a held key's head), this finds the event."""
    delivery = await _console(request).delivery(_delivery_id(request))
    raise web.HTTPFound(f"/events/{delivery.event_id}#delivery-{delivery.id}")


def _delivery_id(request: web.Request) -> int:
    return row_id(request.match_info["delivery_id"], "delivery id")


def _is_id(text: str) -> bool:
    try:
        row_id(text, "id")
    except BadRequest:
        return False
    return True


async def targets_page(request: web.Request) -> web.Response:
    targets = await _console(request).target_views()
    for target in targets:
        target["schedule"] = target["schedule"].split("\n")[0]  # the full one is in the API
    return _render(
        request, "targets.html", title="Targets", page="targets", targets=targets, auto_refresh=True
    )


async def _set_paused(request: web.Request, paused: bool) -> web.StreamResponse:
    console = _console(request)
    name = request.match_info["name"]
    await console.set_paused(name, paused, by=_by(request))
    raise _back("/targets", done="paused" if paused else "resumed", name=name)


async def pause_target(request: web.Request) -> web.StreamResponse:
    return await _set_paused(request, True)


async def resume_target(request: web.Request) -> web.StreamResponse:
    return await _set_paused(request, False)


async def rejections_page(request: web.Request) -> web.Response:
    console = _console(request)
    route = request.query.get("route", "").strip() or None
    since, until = (request.query.get(k, "").strip() for k in ("since", "until"))
    now, zone = console.clock.now(), console.config.zone
    found, problem, status = [], "", 200
    try:
        await console.check_names(route, None)
        found = await console.store.list_rejections(
            route,
            200,
            since=instant(since, "since", now, zone),
            until=instant(until, "until", now, zone),
        )
    except BadRequest as bad:  # said beside the form, which keeps what was typed
        problem, status = _sentence(str(bad)), 400
    masker = console.masker
    return _render(
        request,
        "rejections.html",
        title="Rejections",
        page="rejections",
        rejections=[rejection_view(r, masker) for r in found],
        routes=sorted(console.config.routes),
        route=route or "",
        since=since,
        until=until,
        problem=problem,
        http_status=status,
    )


AUDIT_PAGE = 100


async def audit_page(request: web.Request) -> web.Response:
    console = _console(request)
    cursor = request.query.get("cursor", "")
    before_id = row_id(cursor, "cursor") if cursor else None
    entries = await console.audit(AUDIT_PAGE, before_id)
    next_page = f"/audit?cursor={entries[-1].id}" if len(entries) == AUDIT_PAGE else None
    return _render(
        request,
        "audit.html",
        title="Audit",
        page="audit",
        entries=[audit_view(entry) for entry in entries],
        next_page=next_page,
    )


async def store_errors(request: web.Request, page: Handler) -> web.StreamResponse:
    """Bad input, a missing event, delivery or target (in relay.ops.actions' words),
    or a store that cannot be read: a sentence instead of a bare 500."""
    try:
        return await page(request)
    except BadRequest as problem:
        return _plain(400, f"Bad request: {problem}.")
    except NotFound as problem:
        return _plain(404, _sentence(str(problem)))
    except StoreError as problem:
        return _plain(503, f"The database cannot be read right now: {problem}")


async def no_such_page(request: web.Request) -> web.Response:
    raise web.HTTPNotFound()


PAGES: tuple[tuple[str, str, Handler], ...] = (
    ("POST", "/logout", logout),
    ("GET", "/", overview),
    ("GET", "/deliveries", deliveries),
    ("GET", "/export", export_listing),
    ("GET", "/dead", dead_letter),
    ("POST", "/dead/requeue", requeue_dead),
    ("POST", "/dead/skip", skip_dead),
    ("POST", "/retry", retry_waiting),
    ("GET", "/events/{event_id}", event_page),
    ("GET", "/events/{event_id}/resend", resend_page),
    ("POST", "/events/{event_id}/resend", resend_post),
    ("GET", "/deliveries/{delivery_id}", delivery_page),
    ("POST", "/deliveries/{delivery_id}/retry", retry_delivery),
    ("POST", "/deliveries/{delivery_id}/requeue", requeue_delivery),
    ("POST", "/deliveries/{delivery_id}/skip", skip_delivery),
    ("GET", "/targets", targets_page),
    ("POST", "/targets/{name}/pause", pause_target),
    ("POST", "/targets/{name}/resume", resume_target),
    ("GET", "/rejections", rejections_page),
    ("GET", "/audit", audit_page),
)
