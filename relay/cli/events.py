"""`relay events` and `relay show`: what came in and what became of it."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import orjson

from relay.cli.common import (
    CommandError,
    acting,
    add_config_option,
    add_json_option,
    add_time_options,
    count_type,
    emit,
    read_database_command_config,
    run,
    table,
    time_window,
)
from relay.core.localtime import Zone, format_iso_local, format_local
from relay.core.payload import media_type, parse_form, parse_json
from relay.core.units import count
from relay.ops.glance import glances, shortened, who_text, with_glance
from relay.ops.inputs import failing, optional_text, row_id
from relay.ops.search import SearchError, parse_search
from relay.ops.views import event_detail, event_summary, mark_probes, rejection_view, search_view
from relay.store import EventQuery, SearchProgress, Status


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    events = commands.add_parser("events", help="list events, newest first")
    add_config_option(events)
    add_json_option(events)
    events.add_argument(
        "--status",
        choices=[s.value for s in Status],
        help="only events with a delivery in this state",
    )
    events.add_argument("--route", help="only events of this route")
    events.add_argument("--target", help="only events with a delivery to this target")
    events.add_argument("--key", help="only the event with this idempotency key")
    events.add_argument(
        "--search",
        metavar="TEXT",
        help="only events whose body, query or header values contain TEXT"
        " (any case; a phone number in any spelling)",
    )
    events.add_argument(
        "--failing",
        nargs="?",
        const="true",
        metavar="N",
        help="only events with a delivery that keeps failing: pending after [alerts]"
        " delivery_failing_after attempts of its cycle (5 by default), or after N",
    )
    add_time_options(events)
    events.add_argument(
        "--limit", type=count_type(), default=50, help="at most this many (default 50)"
    )
    events.set_defaults(handler=list_events)

    rejections = commands.add_parser(
        "rejections", help="requests relay refused (bad signature, address not allowed...)"
    )
    add_config_option(rejections)
    add_json_option(rejections)
    rejections.add_argument("--route", help="only this route")
    add_time_options(rejections, "requests refused")
    rejections.add_argument(
        "--limit", type=count_type(), default=100, help="at most this many (default 100)"
    )
    rejections.set_defaults(handler=list_rejections)

    show = commands.add_parser("show", help="one event: headers, body, deliveries, attempts")
    add_config_option(show)
    add_json_option(show)
    show.add_argument("event_id", metavar="EVENT_ID")
    show.set_defaults(handler=show_event)


def list_events(args: argparse.Namespace) -> int:
    config = read_database_command_config(args)
    try:
        search = parse_search(args.search) if args.search is not None else None
    except SearchError as problem:
        raise CommandError(f"--search: {problem}") from None
    since, until = time_window(args, config)
    query = EventQuery(
        status=Status(args.status) if args.status else None,
        route=args.route,
        target=args.target,
        since=since,
        until=until,
        key=optional_text(args.key, "--key"),
        search=search,
        limit=args.limit,
        failing=failing(args.failing, "--failing", config.delivery_failing_after),
    )

    async def fetch() -> tuple[list[dict[str, Any]], SearchProgress | None]:
        async with acting(config) as actions:
            await actions.check_names(args.route, args.target, prefix="--")
            store = actions.store
            events = await store.list_events(query)
            progress = await store.search_progress() if search is not None else None
            masker = config.masker
            found = await glances(store, events, masker, search)
        views = [with_glance(event_summary(e, masker), found.get(e.id)) for e in events]
        return views, progress

    found, progress = run(fetch())
    if search is not None and progress is not None:
        view = search_view(search, progress)
        if progress.behind:
            # On stderr: the listing itself (text or --json) stays what it was.
            print(f"relay: note: {view['note']}", file=sys.stderr)
    emit(args, found, lambda events: _events_text(events, config.zone))
    return 0


def list_rejections(args: argparse.Namespace) -> int:
    config = read_database_command_config(args)
    since, until = time_window(args, config)

    async def fetch() -> list[dict[str, Any]]:
        async with acting(config) as actions:
            await actions.check_names(args.route, None, prefix="--")
            found = await actions.store.list_rejections(
                args.route, args.limit, since=since, until=until
            )
        masker = config.masker
        return [rejection_view(r, masker) for r in found]

    emit(args, run(fetch()), lambda found: _rejections_text(found, config.zone))
    return 0


def _rejections_text(rejections: list[dict[str, Any]], zone: Zone) -> str:
    lines = []
    for item in rejections:
        detail = f" ({item['detail']})" if item["detail"] else ""
        lines.append(
            f"{format_iso_local(item['at'], zone)}  {item['route']}"
            f"  from {item['remote_addr'] or '-'}:"
            f" {item['reason']}{detail}"
        )
        lines += [f"    {name}: {value}" for name, value in item["headers"]]
    return "\n".join(lines) if lines else "(none)"


def show_event(args: argparse.Namespace) -> int:
    config = read_database_command_config(args)
    event_id = row_id(args.event_id, "event id")

    async def fetch() -> dict[str, Any]:
        async with acting(config) as actions:
            detail = await actions.event(event_id)
            states = await actions.store.target_states()
        return mark_probes(event_detail(detail, config.masker), states)

    emit(args, run(fetch()), lambda event: _event_text(event, config.zone))
    return 0


# A column's text, this long at most: one event a line, whatever a sender put
# in a key (T-Bank's are ~100 characters). --json and `relay show` have it whole.
KEY_CHARS = 24
WHO_CHARS = 48
ERROR_CHARS = 40


def _deliveries_text(event: dict[str, Any], zone: Zone, now: float) -> str:
    """Each delivery as `crm#431:pending(3) next 15:00:03`: its id, for `relay
    retry`, `skip` or `show`, and what it waits for (its next attempt, its
    turn, the copy that superseded it) or, dead, why."""
    said = []
    for d in event["deliveries"]:
        text = f"{d['target']}#{d['id']}:{d['status']}({d['attempts']})"
        held = d.get("held_behind")
        if d["status"] == "pending" and d["next_attempt_at"]:
            text += f" next {_when(d['next_attempt_at'], zone, now)}"
        elif d["status"] == "pending" and held:
            text += f" behind #{held['delivery_id']}"
        elif d["status"] in ("superseded", "resolved") and d.get("resolved_by"):
            text += f" by #{d['resolved_by']}"
        elif d["status"] == "dead" and d["last_error"]:
            text += f" {shortened(d['last_error'], ERROR_CHARS)}"
        said.append(text)
    return " ".join(said)


def _when(text: str, zone: Zone, now: float) -> str:
    """A time in a listing's column: the time of day when it falls on today's
    local date, else the date and the minute."""
    shown = format_iso_local(text, zone)
    return shown[11:19] if shown[:10] == format_local(now, zone)[:10] else shown[:16]


def _events_text(events: list[dict[str, Any]], zone: Zone) -> str:
    searched = any(event.get("snippet") for event in events)
    now = time.time()
    rows = [
        [
            event["id"],
            format_iso_local(event["received_at"], zone),
            event["route"],
            event["status"],
            shortened(_key_text(event), KEY_CHARS),
            shortened(who_text(event), WHO_CHARS) or "-",
            _deliveries_text(event, zone, now),
            *([shortened(event.get("snippet") or "-", 2 * WHO_CHARS)] if searched else []),
        ]
        for event in events
    ]
    headers = ["ID", "RECEIVED", "ROUTE", "STATUS", "KEY", "WHO", "DELIVERIES"]
    return table(rows, [*headers, *(["MATCH"] if searched else [])])


# An answer is shown on one line, this long at most (--json has it whole).
ANSWER_CHARS = 300


def _one_line(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= ANSWER_CHARS else flat[: ANSWER_CHARS - 1] + "…"


def _body_lines(event: dict[str, Any]) -> list[str]:
    """The body as a person reads it: JSON indented, form fields decoded one a
    line; any other text as it is. --json has it exactly as received."""
    body = event["body"]
    content_type = event["content_type"] or ""
    if body is None:
        return [f"body ({content_type or 'binary'}, base64): {event['body_base64']}"]
    parsed = parse_json(body.encode())
    if parsed is not None or body.strip() == "null":
        pretty = orjson.dumps(parsed, option=orjson.OPT_INDENT_2).decode()
        return [f"body ({content_type or 'JSON'}):", *pretty.splitlines()]
    fields = parse_form(content_type, body.encode())
    if fields:
        return [
            f"body ({media_type(content_type)}, fields decoded):",
            *(f"  {name} = {value}" for name, value in fields.items()),
        ]
    return [f"body ({content_type or 'no content type'}):", body]


def _key_text(event: dict[str, Any]) -> str:
    key = event["idempotency_key"] or "-"
    conflict = event.get("key_conflict_of")
    return f"{key} (KEY CONFLICT: differs from event {conflict})" if conflict else key


def _in_cycle(delivery: dict[str, Any]) -> str:
    """How many of its attempts are steps of its current cycle, when not all."""
    steps = delivery.get("attempts_in_cycle", delivery["attempts"])
    return f" ({steps} in this cycle)" if steps != delivery["attempts"] else ""


def _sent_lines(request: dict[str, Any]) -> list[str]:
    """What an attempt sent, as a person reads it, under the attempt: a mail
    with its headers, a form's fields decoded one a line, JSON indented, any
    other text as it is (what is kept of it: its first 2 KiB)."""
    head = f"      sent: {request['method']} {request['url']}"
    size, body = request.get("size"), request["body"]
    if size is not None and size > len(body.encode()):
        head += f" ({size:,} bytes, the first kept)"
    lines = [head]
    if request["method"] == "SMTP":
        lines += [f"{name}: {value}" for name, value in request["headers"]]
        lines.append("")
    content_type = next(
        (value for name, value in request["headers"] if name.lower() == "content-type"), ""
    )
    fields = parse_form(content_type, body.encode())
    parsed = parse_json(body.encode()) if not fields else None
    if fields:
        lines += [f"{name} = {value}" for name, value in fields.items()]
    elif parsed is not None:
        lines += orjson.dumps(parsed, option=orjson.OPT_INDENT_2).decode().splitlines()
    elif body:
        lines += body.splitlines()
    return [lines[0], *(f"        {line}" if line else "" for line in lines[1:])]


def _attempt_label(attempt: dict[str, Any]) -> str:
    """What kind of attempt: its step of the retry cycle, a person's retry, a probe."""
    kind = attempt.get("kind", "cycle")
    if kind == "cycle":
        number = attempt.get("cycle_number")
        return f" (cycle step {number})" if number else ""
    return " (manual retry)" if kind == "manual" else " (probe of a down target)"


def _event_text(event: dict[str, Any], zone: Zone) -> str:
    def at(text: str | None) -> str:
        return format_iso_local(text, zone)

    lines = [
        f"event {event['id']}  route {event['route']}  {event['status']}",
        f"received {at(event['received_at'])} from {event['remote_addr'] or '-'}",
        f"idempotency key: {_key_text(event)}",
        f"{event['method']} {event['path']}{'?' + event['query'] if event['query'] else ''}",
    ]
    if event.get("flagged"):
        lines.append(f"FLAGGED: {event['flagged']}")
    if event.get("resent_from"):
        link = event["resent_from"]
        lines.append(
            f"corrected copy of event {link['event_id']}, sent by {link['by']} at {at(link['at'])}"
        )
    for link in event.get("resent_as", ()):
        lines.append(
            f"resent as event {link['event_id']} (a corrected copy),"
            f" by {link['by']} at {at(link['at'])}"
        )
    lines += [f"  {name}: {value}" for name, value in event["headers"]]
    lines += ["", *_body_lines(event), ""]
    for delivery in event["deliveries"]:
        lines.append(
            f"delivery {delivery['id']} → {delivery['target']}: {delivery['status']},"
            f" {count(delivery['attempts'], 'attempt')}"
            + _in_cycle(delivery)
            + (
                f", next at {at(delivery['next_attempt_at'])}"
                if delivery["next_attempt_at"]
                else ""
            )
        )
        if delivery["status"] == "resolved" and delivery.get("resolved_by"):
            lines.append(
                f"  resolved: delivery {delivery['resolved_by']} of a corrected copy was delivered"
            )
        if delivery.get("resolves"):
            lines.append(
                f"  a corrected copy: stands in for delivery {delivery['resolves']}"
                " (which is not sent again), and resolves it once delivered"
            )
        if delivery["last_error"]:
            lines.append(f"  last error: {delivery['last_error']}")
        if delivery.get("note"):
            lines.append(f"  {delivery['note']}")
        probe = delivery.get("probe")
        if probe:
            lines.append(
                f"  target {delivery['target']} is down since {probe['target_down_since']}:"
                + (
                    f" this delivery is its next probe, at {probe['next_probe_at']}"
                    if probe["is_next_probe"]
                    else " this delivery waits for a probe to find it up"
                )
            )
        # Attempts and what people did, in the order they happened.
        happened: list[tuple[str, int, list[str]]] = []
        for attempt in delivery["attempts_log"]:
            said = [
                f"  #{attempt['number']}{_attempt_label(attempt)} {at(attempt['started_at'])}"
                f" {attempt['outcome']}"
                f" {attempt['http_status'] or '-'} {attempt['duration_ms']}ms"
                + (f" {attempt['error']}" if attempt["error"] else "")
            ]
            request = attempt.get("request")
            if request:
                said += _sent_lines(request)
            answer = _one_line(attempt.get("response") or "")
            if answer:
                said.append(f"      answer: {answer}")
            happened.append((attempt["started_at"] or "", 1, said))
        for entry in delivery.get("history", ()):
            detail = f": {entry['detail']}" if entry.get("detail") else ""
            # At the same instant, what a person did comes before the attempt it caused.
            by = f" (by {entry['by']})" if entry.get("by") else ""
            said = [f"  {at(entry['at'])} {entry['kind']}{detail}{by}"]
            happened.append((entry["at"] or "", 0, said))
        for _, _, said in sorted(happened, key=lambda item: item[:2]):
            lines += said
    return "\n".join(lines)
