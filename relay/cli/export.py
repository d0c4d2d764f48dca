"""`relay export`: the events, as NDJSON, or as CSV for a spreadsheet (relay.ops.export)."""

from __future__ import annotations

import argparse

from relay.cli.common import (
    acting,
    add_config_option,
    add_time_options,
    read_database_command_config,
    run,
    time_window,
    write_all,
)
from relay.ops.export import DEFAULT_FIELDS, EVENT_COLUMNS, FORMATS, export_of, exported
from relay.ops.inputs import optional_text
from relay.store import EventQuery, Status


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "export",
        help="every event as one JSON line (NDJSON), or as CSV for a spreadsheet",
        description="Print events, newest first. NDJSON (the default): each line the event"
        " as `relay show --json` has it (secrets masked), plus `data`, its body decoded."
        " CSV: the --fields chosen, one row an event, times in admin.timezone; a cell that"
        " a spreadsheet would run as a formula (=, +, -, @) is written as text. excel: the"
        " same CSV as Excel opens it where the list separator is `;` (a Russian locale):"
        " UTF-8 with a byte order mark, `;` between cells.",
        epilog="examples:\n"
        "  sudo relay export --since 2026-12-01 > leads.ndjson\n"
        "  sudo relay export --route tilda --since yesterday | jq -r '.data.Phone'\n"
        "  sudo relay export --route payments --since 2026-12-01 --format excel \\\n"
        "      --fields id,received_at,json.OrderId,json.Amount,json.Status > payments.csv",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_option(parser)
    parser.add_argument(
        "--json", action="store_true", help="accepted as by every command: NDJSON is JSON"
    )
    parser.add_argument(
        "--format", choices=FORMATS, default="ndjson", help="ndjson (default), csv or excel"
    )
    parser.add_argument(
        "--fields",
        metavar="F,F...",
        help=f"csv/excel columns: {', '.join(EVENT_COLUMNS)}, or payload paths such as"
        f" json.Amount, form.Name, query.utm_source, headers.X-Shop"
        f" (default: {','.join(DEFAULT_FIELDS)})",
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


def export_events(args: argparse.Namespace) -> int:
    config = read_database_command_config(args)
    since, until = time_window(args, config)
    export = export_of(args.format, args.fields, config.zone, prefix="--")
    query = EventQuery(
        status=Status(args.status) if args.status else None,
        route=optional_text(args.route, "--route"),
        target=optional_text(args.target, "--target"),
        since=since,
        until=until,
    )

    async def export_all() -> None:
        async with acting(config) as actions:
            await actions.check_names(args.route, args.target, prefix="--")
            async for chunk in exported(actions.store, query, config.masker, export):
                write_all(chunk)

    run(export_all())
    return 0
