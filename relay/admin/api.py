"""The admin JSON API: a sub-application mounted at /api, whose every route
needs the bearer token (and nothing else: a dashboard session is no key here)."""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any

import orjson
from aiohttp import web

from relay.admin.console import CONSOLE, Console
from relay.admin.origin import SAFE_METHODS
from relay.admin.throttle import AUTH_FAILURES, client, too_many
from relay.core.localtime import Zone
from relay.core.payload import media_type
from relay.ops.export import Export, export_of, exported
from relay.ops.glance import glances, with_glance
from relay.ops.inputs import (
    BadRequest,
    failing,
    instant,
    known_name,
    optional_text,
    row_id,
    row_ids,
    whole_number,
)
from relay.ops.resend import EditRejected, plan_resend
from relay.ops.search import SearchError, parse_search
from relay.ops.views import (
    audit_view,
    delivery_summary,
    event_detail,
    event_summary,
    iso,
    mark_probes,
    preview_view,
    rejection_view,
    search_view,
    stats_view,
)
from relay.store import (
    Conflict,
    DeliveryView,
    EventQuery,
    NotFound,
    SearchTooSlow,
    Selection,
    Status,
    StoreError,
)
from relay.store.base import Shared
from relay.store.verbs import REQUEUED, RETRIED

MAX_PAGE = 500
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def json_response(payload: Any, status: int = 200) -> web.Response:
    return web.Response(
        status=status,
        body=orjson.dumps(payload, option=orjson.OPT_NON_STR_KEYS),
        content_type="application/json",
    )


def error(status: int, message: str) -> web.Response:
    return json_response({"error": message}, status)


def token_matches(header: str | None, token: str | None) -> bool:
    """Constant-time: the comparison takes as long whatever part of the token is right."""
    if token is None:
        return True
    if not header or not header.startswith("Bearer "):
        return False
    return hmac.compare_digest(header[7:].strip().encode(), token.encode())


@web.middleware
async def api_guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every API call needs the bearer token, even to a path that does not exist;
    store trouble becomes 503, bad input 400."""
    console = request.config_dict[CONSOLE]
    token = console.config.admin.token
    if token is not None:
        failures = request.config_dict[AUTH_FAILURES]
        address = client(request)
        wait = failures.retry_after(address)
        if wait is not None:
            return too_many(wait)
        header = request.headers.get("Authorization")
        if not token_matches(header, token):
            if header:  # a token was tried (a missing one is no guess)
                where = f"{request.method} {request.rel_url.raw_path[:200]}"
                failures.failed(address, f"admin API: wrong bearer token for {where}")
            response = error(401, "missing or wrong bearer token")
            response.headers["WWW-Authenticate"] = 'Bearer realm="relay"'
            return response
    if request.method not in SAFE_METHODS and request.content_type != "application/json":
        # What a web page can send without a CORS preflight is never accepted.
        return error(415, "Content-Type: expected application/json for an API change")
    try:
        return await handler(request)
    except BadRequest as problem:
        return error(400, str(problem))
    except NotFound as problem:
        return error(404, str(problem))
    except Conflict as problem:
        return error(409, str(problem))
    except StoreError as problem:
        return error(503, f"store unavailable: {problem}")


def _console(request: web.Request) -> Console:
    return request.config_dict[CONSOLE]


def caller(request: web.Request) -> str:
    """Who acts through the API: the holder of the admin token ([admin] token,
    the only one there is), and from where."""
    token = "admin token" if _console(request).config.admin.token else "no token set"
    return f"admin API from {request.remote or 'unknown address'} ({token})"


def _status(value: Any, name: str = "status") -> Status | None:
    if value in (None, ""):
        return None
    known = known_name(value, name, "status", (s.value for s in Status))
    return Status(known) if known else None


def event_query(
    params: Mapping[str, str], now: float, zone: Zone, failing_after: int
) -> EventQuery:
    """A listing's filters from a request's parameters (`failing_after`: what
    `failing=true` means, [alerts] delivery_failing_after)."""
    limit = whole_number(params.get("limit") or "50", "limit", maximum=MAX_PAGE)
    cursor = row_id(params["cursor"], "cursor") if params.get("cursor") else None
    text = (params.get("q") or "").strip()
    try:
        search = parse_search(text) if text else None
    except SearchError as problem:
        raise BadRequest(f"q: {problem}") from None
    return EventQuery(
        status=_status(params.get("status")),
        route=optional_text(params.get("route"), "route"),
        target=optional_text(params.get("target"), "target"),
        since=instant(params.get("since"), "since", now, zone),
        until=instant(params.get("until"), "until", now, zone),
        key=optional_text(params.get("key"), "key"),
        search=search,
        limit=limit,
        before_id=cursor,
        failing=failing(params.get("failing"), "failing", failing_after),
    )


async def list_events(request: web.Request) -> web.Response:
    console = _console(request)
    config = console.config
    query = event_query(
        request.query, console.clock.now(), config.zone, config.alerts.delivery_failing_after
    )
    await console.check_names(query.route, query.target)
    try:
        events = await console.store.list_events(query)
    except SearchTooSlow as problem:
        raise BadRequest(f"q: {problem}") from None
    masker = console.masker
    next_cursor = str(events[-1].id) if len(events) == query.limit else None
    found = await glances(console.store, events, masker, query.search)
    page: dict[str, Any] = {
        "events": [with_glance(event_summary(e, masker), found.get(e.id)) for e in events],
        "next_cursor": next_cursor,
    }
    if query.search is not None:
        page["search"] = search_view(query.search, await console.store.search_progress())
    return json_response(page)


async def export_events(request: web.Request) -> web.StreamResponse:
    """GET /v1/export: the events GET /v1/events would list (its filters), all
    of them, as ?format=ndjson (the default), csv or excel, with ?fields= for
    csv's columns (relay.ops.export). Streamed a page at a time."""
    console = _console(request)
    params = request.query
    config = console.config
    query = event_query(
        params, console.clock.now(), config.zone, config.alerts.delivery_failing_after
    )
    await console.check_names(query.route, query.target)
    export = export_of(params.get("format"), params.get("fields"), console.config.zone)
    return await stream_export(request, console, query, export)


async def stream_export(
    request: web.Request, console: Console, query: EventQuery, export: Export
) -> web.StreamResponse:
    """An export as a download, written as it is read: a failure half-way
    closes the connection (the file is seen cut, never taken for whole)."""
    response = web.StreamResponse(
        headers={
            "Content-Type": f"{export.media_type}; charset=utf-8",
            "Content-Disposition": f'attachment; filename="{export.filename}"',
        }
    )
    await response.prepare(request)
    async for chunk in exported(console.store, query, console.masker, export):
        await response.write(chunk)
    await response.write_eof()
    return response


async def get_event(request: web.Request) -> web.Response:
    console = _console(request)
    event_id = row_id(request.match_info["event_id"], "event_id")
    detail = await console.event(event_id)
    states = await console.store.target_states()
    # Masking is linear in the body, and a body may be a MiB: off the loop.
    view = await asyncio.to_thread(event_detail, detail, console.masker)
    return json_response(mark_probes(view, states))


async def retry_delivery(request: web.Request) -> web.Response:
    console = _console(request)
    delivery_id = row_id(request.match_info["delivery_id"], "delivery_id")
    delivery = await console.retry(delivery_id, by=caller(request))
    view = event_summary_delivery(delivery, console)
    return json_response({"delivery": view})


async def skip_delivery(request: web.Request) -> web.Response:
    console = _console(request)
    delivery_id = row_id(request.match_info["delivery_id"], "delivery_id")
    delivery = await console.skip(delivery_id, by=caller(request))
    return json_response({"delivery": event_summary_delivery(delivery, console)})


def event_summary_delivery(delivery: DeliveryView, console: Console) -> dict[str, Any]:
    view = delivery_summary(delivery, console.masker)
    view["event_id"] = str(delivery.event_id)
    if delivery.target in console.scheduler.paused:
        view["note"] = "target is paused: the attempt waits for resume"
    elif delivery.target in console.scheduler.down:
        view["note"] = "target is down: deliveries wait for a probe to find it up"
    return view


def _json_object(raw: bytes, keys: frozenset[str]) -> dict[str, Any]:
    """A request's JSON object (no body: an empty one), naming the first key it
    does not know; anything else is a BadRequest."""
    try:
        body = orjson.loads(raw or b"{}")
    except orjson.JSONDecodeError:
        raise BadRequest("expected a JSON object") from None
    if not isinstance(body, dict):
        raise BadRequest("expected a JSON object")
    unknown = set(body) - keys
    if unknown:
        raise BadRequest(
            f"{sorted(unknown)[0]}: unknown key (expected one of: {', '.join(sorted(keys))})"
        )
    return body


BULK_KEYS = frozenset({"status", "route", "target", "since", "until", "ids", "q", "key", "dry_run"})


def _bulk_selection(
    body: Mapping[str, Any], now: float, zone: Zone, default: Status = Status.DEAD
) -> Selection:
    """The deliveries a bulk action names: the same filters as GET /v1/events
    (`q` a content search, `key` an idempotency key), or ids; in `default`
    when the body names no status."""
    ids = body.get("ids") or []
    if not isinstance(ids, list):
        raise BadRequest("ids: expected a list of delivery ids")
    text = optional_text(body.get("q"), "q")
    try:
        search = parse_search(text) if text else None
    except SearchError as problem:
        raise BadRequest(f"q: {problem}") from None
    return Selection(
        status=_status(body.get("status")) or default,
        route=optional_text(body.get("route"), "route"),
        target=optional_text(body.get("target"), "target"),
        since=instant(body.get("since"), "since", now, zone),
        until=instant(body.get("until"), "until", now, zone),
        ids=row_ids(ids, "ids", indexed=True),
        key=optional_text(body.get("key"), "key"),
        search=search,
    )


async def _bulk(request: web.Request, verb: str) -> web.Response:
    """POST /v1/requeue, /v1/skip, /v1/retry: act on every delivery the body
    names, or with "dry_run": true only say which (at most BULK_LIMIT ids,
    the count in full)."""
    console = _console(request)
    body = _json_object(await request.read() if request.can_read_body else b"", BULK_KEYS)
    dry_run = body.get("dry_run", False)
    if not isinstance(dry_run, bool):
        raise BadRequest("dry_run: expected true or false")
    retry = verb == "retry"
    selection = _bulk_selection(
        body,
        console.clock.now(),
        console.config.zone,
        Status.PENDING if retry else Status.DEAD,
    )
    if retry:
        if selection.status not in RETRIED:
            raise BadRequest("status: a retry now takes pending or dead deliveries")
        # A line's waiting ones are not taken: their head goes first.
        selection = replace(selection, sendable=True)
    await console.check_names(selection.route, selection.target)
    if verb == "skip" and selection.status not in (Status.DEAD, Status.PENDING):
        raise BadRequest("status: a skip takes dead or pending deliveries")
    if verb == "requeue" and selection.status not in REQUEUED:
        raise BadRequest(
            "status: a requeue takes dead, delivered or skipped deliveries"
            " (for a superseded one, requeue the corrected copy that goes instead)"
        )
    if dry_run:
        ids = await console.select(selection)
        count = await console.store.count(selection)
        return json_response(
            {"dry_run": True, f"would_{verb}": count, "ids": [str(i) for i in ids]}
        )
    if retry:
        sent = await console.retry_selected(selection, by=caller(request))
        done = sent.ids
        answer = {
            "retried": len(done),
            "ids": [str(i) for i in done],
            "probed": sent.probed,
            "held": {name: iso(until) for name, until in sent.held.items()},
        }
    elif verb == "requeue":
        done = await console.requeue(selection, by=caller(request))
        answer = {"requeued": len(done), "ids": [str(i) for i in done]}
    else:
        done = await console.skip_selected(selection, by=caller(request))
        answer = {"skipped": len(done), "ids": [str(i) for i in done]}
    return json_response(answer | await _not_taken(console, selection.ids, done))


async def _not_taken(console: Console, named: tuple[int, ...], done: list[int]) -> dict[str, Any]:
    """The ids a bulk action named but left, each with why (a superseded one
    names the corrected copy that goes instead)."""
    if not named:
        return {}
    taken = set(done)
    why = await console.not_taken(named, taken)
    return {
        "not_taken": [str(i) for i in named if i not in taken],
        "not_taken_why": {str(i): said for i, said in why.items()},
    }


async def requeue(request: web.Request) -> web.Response:
    return await _bulk(request, "requeue")


async def skip_selected(request: web.Request) -> web.Response:
    return await _bulk(request, "skip")


async def retry_selected(request: web.Request) -> web.Response:
    return await _bulk(request, "retry")


RESEND_KEYS = frozenset({"body", "content_type", "targets", "confirm"})


async def resend_event(request: web.Request) -> web.Response:
    """An edited copy of an event as a new event: previewed, then sent with confirm: true."""
    console = _console(request)
    event_id = row_id(request.match_info["event_id"], "event_id")
    if media_type(request.content_type) != "application/json":
        return error(415, "expected a JSON object (Content-Type: application/json)")
    body = _json_object(await request.read(), RESEND_KEYS)
    text, content_type, targets = body.get("body"), body.get("content_type"), body.get("targets")
    if not isinstance(text, str):
        raise BadRequest("body: expected the edited body as a string")
    if content_type is not None and not isinstance(content_type, str):
        raise BadRequest("content_type: expected a string such as application/json")
    if targets is None:
        targets = []
    if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
        raise BadRequest("targets: expected a list of target names")
    confirm = body.get("confirm", False)
    if not isinstance(confirm, bool):
        raise BadRequest("confirm: expected true or false")
    detail = await console.event(event_id)
    masker = console.masker
    try:
        plan = await asyncio.to_thread(
            plan_resend,
            console.config,
            detail,
            text.encode("utf-8"),
            content_type,
            targets,
            caller(request),
            masker,
        )
    except EditRejected as problem:
        return error(problem.status, str(problem))
    previews = [preview_view(preview) for preview in plan.previews]
    if not confirm:
        return json_response(
            {"previews": previews, "targets": list(plan.resend.targets), "sent": False}
        )
    if plan.failures:
        failed = ", ".join(f"{p.target}: {p.error}" for p in plan.failures)
        return json_response({"error": f"would be dead: {failed}", "previews": previews}, 422)
    copy_id = await console.resend(plan.resend)
    return json_response(
        {
            "sent": True,
            "event_id": str(copy_id),
            "resent_from": str(event_id),
            "targets": list(plan.resend.targets),
            "previews": previews,
        },
        201,
    )


async def list_targets(request: web.Request) -> web.Response:
    return json_response({"targets": await _console(request).target_views()})


async def set_paused(request: web.Request, paused: bool) -> web.Response:
    console = _console(request)
    name = request.match_info["name"]
    await console.set_paused(name, paused, by=caller(request))
    return json_response({"target": name, "paused": paused})


async def pause_target(request: web.Request) -> web.Response:
    return await set_paused(request, True)


async def resume_target(request: web.Request) -> web.Response:
    return await set_paused(request, False)


async def stats(request: web.Request) -> web.Response:
    console = _console(request)
    store = console.store
    result = await store.stats()
    instances = await store.instances() if isinstance(store, Shared) else None
    return json_response(
        stats_view(result, console.clock.now(), console.scheduler.paused, console.masker, instances)
    )


async def list_rejections(request: web.Request) -> web.Response:
    console = _console(request)
    limit = whole_number(request.query.get("limit") or "100", "limit", maximum=MAX_PAGE)
    route = optional_text(request.query.get("route"), "route")
    await console.check_names(route, None)
    now, zone = console.clock.now(), console.config.zone
    found = await console.store.list_rejections(
        route,
        limit,
        since=instant(request.query.get("since"), "since", now, zone),
        until=instant(request.query.get("until"), "until", now, zone),
    )
    masker = console.masker
    return json_response({"rejections": [rejection_view(r, masker) for r in found]})


async def list_audit(request: web.Request) -> web.Response:
    """Operator actions, newest first: ?limit= (50), ?cursor= (the last id seen)."""
    console = _console(request)
    limit = whole_number(request.query.get("limit") or "50", "limit", maximum=MAX_PAGE)
    cursor = request.query.get("cursor")
    entries = await console.audit(limit, row_id(cursor, "cursor") if cursor else None)
    next_cursor = str(entries[-1].id) if len(entries) == limit else None
    return json_response({"audit": [audit_view(e) for e in entries], "next_cursor": next_cursor})


def api_application() -> web.Application:
    """The API's routes under their version; the admin listener mounts it at /api."""
    app = web.Application(middlewares=[api_guard])
    app.router.add_get("/v1/events", list_events)
    app.router.add_get("/v1/events/{event_id}", get_event)
    app.router.add_get("/v1/export", export_events)
    app.router.add_post("/v1/events/{event_id}/resend", resend_event)
    app.router.add_post("/v1/deliveries/{delivery_id}/retry", retry_delivery)
    app.router.add_post("/v1/deliveries/{delivery_id}/skip", skip_delivery)
    app.router.add_post("/v1/requeue", requeue)
    app.router.add_post("/v1/skip", skip_selected)
    app.router.add_post("/v1/retry", retry_selected)
    app.router.add_get("/v1/targets", list_targets)
    app.router.add_post("/v1/targets/{name}/pause", pause_target)
    app.router.add_post("/v1/targets/{name}/resume", resume_target)
    app.router.add_get("/v1/stats", stats)
    app.router.add_get("/v1/rejections", list_rejections)
    app.router.add_get("/v1/audit", list_audit)
    return app
