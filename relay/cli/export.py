"""`relay export`: the events, one JSON object a line, for a person who wants
their data elsewhere (a spreadsheet, another CRM, jq)."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

import orjson

from relay.cli.common import (
    acting,
    add_config_option,
    add_time_options,
    read_operator_config,
    run,
    time_window,
    write_all,
)
from relay.core.payload import parse_form, parse_json
from relay.ops.views import event_detail
from relay.store import EventQuery, Status

# Events read and written per round: the memory of one page of details.
PAGE = 200


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "export",
        help="every event as one JSON line: body decoded, deliveries and attempts (NDJSON)",
        description="Print events as NDJSON, newest first: each line the event as"
        " `relay show --json` has it (secrets masked), plus `data`, its body decoded"
        " (JSON parsed, form fields as an object).",
        epilog="examples:\n"
        "  sudo relay export --since 2026-12-01 > leads.ndjson\n"
        "  sudo relay export --route tilda --since yesterday | jq -r '.data.Phone'",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_option(parser)
    parser.add_argument(
        "--json", action="store_true", help="accepted as by every command: the output is JSON"
    )
    parser.add_argument("--route", help="only events of this route")
    parser.add_argument("--target", help="only events with a delivery to this target")
    parser.add_argument(
        "--status",
        choices=[s.value for s in Status],
        help="only events with a delivery in this state",
    )
    add_time_options(parser)
    parser.set_defaults(handler=export_events)


def decoded(event: dict[str, Any]) -> Any:
    """The (masked) body as data: JSON parsed, form fields as an object, else None."""
    body = event.get("body")
    if body is None:
        return None
    parsed = parse_json(body.encode())
    if parsed is not None or body.strip() == "null":
        return parsed
    return parse_form(event.get("content_type"), body.encode())


def export_events(args: argparse.Namespace) -> int:
    config = read_operator_config(args)
    since, until = time_window(args, config)
    query = EventQuery(
        status=Status(args.status) if args.status else None,
        route=args.route,
        target=args.target,
        since=since,
        until=until,
        limit=PAGE,
    )

    async def export() -> None:
        masker = config.masker
        async with acting(config) as actions:
            await actions.check_names(args.route, args.target, prefix="--")
            page = query
            while True:
                events = await actions.store.list_events(page)
                lines = []
                for event in events:
                    detail = await actions.store.get_event(event.id)
                    if detail is None:  # purged since the page was read
                        continue
                    view = event_detail(detail, masker)
                    view["data"] = decoded(view)
                    lines.append(orjson.dumps(view, option=orjson.OPT_APPEND_NEWLINE))
                write_all(b"".join(lines))
                if len(events) < PAGE:
                    return
                page = dataclasses.replace(query, before_id=events[-1].id)

    run(export())
    return 0
