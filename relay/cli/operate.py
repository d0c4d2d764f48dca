"""The database commands: retry, requeue, pause, resume, stats, purge.

They work with the daemon stopped; a running daemon picks their changes up
within its poll interval (a second).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson

from relay.background import retention
from relay.cli.common import (
    CommandError,
    acting,
    add_config_option,
    add_json_option,
    add_time_options,
    emit,
    opened_store,
    read_database_command_config,
    run,
    table,
    time_window,
    who,
)
from relay.core.localtime import Zone, format_iso_local
from relay.core.units import count, format_duration
from relay.loader import DatabaseCommandConfig
from relay.ops.actions import BULK_LIMIT, Actions
from relay.ops.inputs import MAX_IDS, optional_text, row_ids
from relay.ops.search import SearchError, parse_search
from relay.ops.views import audit_view, delivery_summary, iso, stats_view
from relay.store import Conflict, DeliveryView, NotFound, RetriedNow, Selection, Status, verbs
from relay.store.base import Shared

# The states each bulk command takes deliveries from.
SKIPPED = ["dead", "pending"]
REQUEUED = [status.value for status in verbs.REQUEUED]
RETRIED = [status.value for status in verbs.RETRIED]


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    retry = commands.add_parser(
        "retry",
        help="one more attempt now, by id or filter (the waiting ones sent now, at the"
        " target's pace; the attempt count is kept; no new cycle)",
    )
    add_config_option(retry)
    add_json_option(retry)
    _add_filters(retry, RETRIED, default="pending")
    retry.add_argument("delivery_ids", metavar="DELIVERY_ID", nargs="*")
    retry.set_defaults(handler=retry_deliveries)

    skip = commands.add_parser(
        "skip",
        help="never send these deliveries (pending or dead, by id or filter);"
        " the next of their ordering key goes",
    )
    add_config_option(skip)
    add_json_option(skip)
    _add_filters(skip, SKIPPED)
    skip.add_argument(
        "--yes", action="store_true", help="skip what the filters take (without it: a dry run)"
    )
    skip.add_argument("delivery_ids", metavar="DELIVERY_ID", nargs="*")
    skip.set_defaults(handler=skip_deliveries)

    requeue = commands.add_parser(
        "requeue", help="a fresh retry cycle for dead deliveries (by filter or id)"
    )
    add_config_option(requeue)
    add_json_option(requeue)
    _add_filters(requeue, REQUEUED)
    requeue.add_argument("delivery_ids", metavar="DELIVERY_ID", nargs="*")
    requeue.set_defaults(handler=requeue_deliveries)

    for name, paused in (("pause", True), ("resume", False)):
        parser = commands.add_parser(
            name,
            help="stop attempts to a target (its deliveries wait, no retries burned)"
            if paused
            else "let a paused target's deliveries flow again",
        )
        add_config_option(parser)
        add_json_option(parser)
        parser.add_argument("target")
        parser.set_defaults(handler=pause_target, paused=paused)

    audit = commands.add_parser(
        "audit", help="what people did (pause, resume, retry, skip, requeue, resend): who, when"
    )
    add_config_option(audit)
    add_json_option(audit)
    audit.add_argument("--limit", type=int, default=50, help="how many, newest first (50)")
    audit.set_defaults(handler=show_audit)

    stats = commands.add_parser("stats", help="counts by status per route and target, health")
    add_config_option(stats)
    add_json_option(stats)
    stats.set_defaults(handler=show_stats)

    purge = commands.add_parser("purge", help="remove finished events older than the retention now")
    add_config_option(purge)
    add_json_option(purge)
    purge.add_argument("--dry-run", action="store_true", help="only count what would go")
    purge.set_defaults(handler=purge_events)


def _add_filters(
    parser: argparse.ArgumentParser, statuses: list[str], default: str = "dead"
) -> None:
    """A bulk command's filters: the same as `relay events` (search included),
    and --dry-run to see what they take before anything is done."""
    parser.add_argument("--route", help="only deliveries of this route")
    parser.add_argument("--target", help="only deliveries to this target")
    add_time_options(parser, "deliveries of events received")
    parser.add_argument("--key", help="only the event(s) with this idempotency key")
    parser.add_argument("--search", help="only events whose content holds this text or number")
    parser.add_argument(
        "--status",
        default=default,
        choices=statuses,
        help=f"which deliveries to take (default {default}; one of {', '.join(statuses)})",
    )
    parser.set_defaults(default_status=default)
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="only say how many and which it would take; with --json, a plan for --plan",
    )
    parser.add_argument(
        "--plan",
        metavar="FILE",
        help="act on the deliveries a dry run listed (--dry-run --json > FILE), only those"
        " still in the state it planned for; the others are reported",
    )


def _selection(args: argparse.Namespace, config: DatabaseCommandConfig) -> Selection:
    since, until = time_window(args, config)
    try:
        search = parse_search(args.search) if args.search is not None else None
    except SearchError as problem:
        raise CommandError(f"--search: {problem}") from None
    return Selection(
        status=Status(args.status),
        route=args.route,
        target=args.target,
        since=since,
        until=until,
        ids=row_ids(args.delivery_ids, "delivery id"),
        key=optional_text(args.key, "--key"),
        search=search,
    )


def _filtered(args: argparse.Namespace) -> bool:
    return any(
        getattr(args, name) is not None
        for name in ("route", "target", "since", "until", "key", "search")
    ) or (args.status != args.default_status)


def _dry_run(
    args: argparse.Namespace, verb: str, selection: Selection, config: DatabaseCommandConfig
) -> int:
    """Say how many deliveries `selection` takes, and which: a plan that
    `--plan` can take (every id, up to MAX_IDS; past it the first BULK_LIMIT,
    and the plan says it is not complete)."""

    async def look() -> tuple[int, list[int]]:
        async with acting(config) as actions:
            await actions.check_names(args.route, args.target, prefix="--")
            total = await actions.store.count(selection)
            return total, await actions.select(selection, total if total <= MAX_IDS else BULK_LIMIT)

    total, ids = run(look())
    emit(
        args,
        {
            "dry_run": True,
            f"would_{verb}": total,
            "status": selection.status.value,
            "ids": [str(i) for i in ids],
            "complete": len(ids) == total,
        },
        lambda data: (
            f"would {verb} {count(total, 'delivery', 'deliveries')}"
            + (f": {' '.join(data['ids'])}" if 0 < len(data["ids"]) <= 50 else "")
            + (
                f": {' '.join(data['ids'][:20])} … (all of them: --dry-run --json,"
                " a plan --plan takes)"
                if len(data["ids"]) > 50
                else ""
            )
            + ("" if verb != "skip" or args.dry_run else " (add --yes to skip them)")
        ),
    )
    return 0


def _planned(args: argparse.Namespace, statuses: list[str], verb: str) -> Selection:
    """The deliveries a saved dry run of `verb` lists, in the state it planned for."""
    if _filtered(args) or args.delivery_ids:
        raise CommandError("--plan: the plan names the deliveries; give no filters or ids")
    try:
        plan = orjson.loads(Path(args.plan).read_bytes())
    except OSError as error:
        raise CommandError(f"--plan: {args.plan}: {error.strerror or error}") from None
    except orjson.JSONDecodeError:
        raise CommandError(
            f"--plan: {args.plan}: not JSON (relay ... --dry-run --json > FILE)"
        ) from None
    if (
        not isinstance(plan, dict)
        or plan.get("status") not in statuses
        or f"would_{verb}" not in plan
    ):
        raise CommandError(
            f"--plan: {args.plan}: not a dry run of this command (--dry-run --json > FILE)"
        )
    if plan.get("complete") is False:
        raise CommandError(
            f"--plan: {args.plan}: it lists {len(plan.get('ids') or [])} of the deliveries"
            " its filters took: narrow them (--since, --route...) and plan again"
        )
    ids = plan.get("ids")
    if not isinstance(ids, list):
        raise CommandError(f"--plan: {args.plan}: no list of ids")
    return Selection(status=Status(plan["status"]), ids=row_ids(ids, "--plan ids"))


def retry_deliveries(args: argparse.Namespace) -> int:
    """By filter or plan, the waiting ones (or dead ones) sent now, each a
    person's retry; by id alone, each retried and said."""
    if args.plan is not None:
        config = read_database_command_config(args)
        planned = replace(_planned(args, RETRIED, "retry"), sendable=True)
        return _retried(args, config, planned, planned)
    if _filtered(args) or args.dry_run:
        config = read_database_command_config(args)
        selection = replace(_selection(args, config), sendable=True)
        if args.dry_run:
            return _dry_run(args, "retry", selection, config)
        return _retried(args, config, selection)
    if not args.delivery_ids:
        raise CommandError(
            "name delivery ids, or filters (--target crm: every delivery to crm"
            " waiting for its retry; --dry-run first says which)"
        )
    paused: set[str] | None = None  # read with the first retry

    async def retry(actions: Actions, delivery_id: int, by: str) -> DeliveryView:
        nonlocal paused
        if paused is None:
            states = await actions.store.target_states()
            paused = {name for name, state in states.items() if state.paused}
        return await actions.retry(delivery_id, by=by)

    def said(d: dict[str, Any]) -> str:
        line = f"delivery {d['id']} → {d['target']}: one more attempt queued"
        line += f" ({d['attempts']} made so far)"
        if paused and d["target"] in paused:  # queued, and held until then
            line += f"; target {d['target']} is paused: it goes once resumed (relay resume"
            line += f" {d['target']})"
        return line

    return _each_delivery(args, retry, said)


def skip_deliveries(args: argparse.Namespace) -> int:
    """By id, each is skipped and said; by filter, only with --yes (else a dry
    run): a bulk skip is not undone by a requeue of the same filter."""
    if args.plan is not None:
        config = read_database_command_config(args)
        planned = _planned(args, SKIPPED, "skip")
        return _bulk(args, config, "skipped", lambda a: a.skip_selected(planned, by=who()), planned)
    if _filtered(args) or args.dry_run:
        config = read_database_command_config(args)
        selection = _selection(args, config)
        if args.dry_run or not args.yes:
            return _dry_run(args, "skip", selection, config)
        return _bulk(
            args, config, "skipped", lambda actions: actions.skip_selected(selection, by=who())
        )
    if not args.delivery_ids:
        raise CommandError("name delivery ids, or filters (--route, --target, --search...)")
    return _each_delivery(
        args,
        lambda actions, delivery_id, by: actions.skip(delivery_id, by=by),
        lambda d: f"delivery {d['id']} → {d['target']}: skipped, it will not be sent",
    )


def _each_delivery(
    args: argparse.Namespace,
    verb: Callable[[Actions, int, str], Awaitable[DeliveryView]],
    line: Callable[[dict[str, Any]], str],
) -> int:
    """One operator verb on each delivery named; those it does not apply to are
    reported together at the end (and make the exit status 1)."""
    config = read_database_command_config(args)
    ids = row_ids(args.delivery_ids, "delivery id")

    async def act() -> tuple[list[dict[str, Any]], list[str]]:
        done, problems = [], []
        masker = config.masker
        async with acting(config) as actions:
            for delivery_id in ids:
                try:
                    delivery = await verb(actions, delivery_id, who())
                except (NotFound, Conflict) as error:
                    problems.append(str(error))
                    continue
                done.append(delivery_summary(delivery, masker))
        return done, problems

    done, problems = run(act())
    emit(args, done, lambda rows: "\n".join(line(d) for d in rows))
    if problems:
        raise CommandError("; ".join(problems))
    return 0


def requeue_deliveries(args: argparse.Namespace) -> int:
    config = read_database_command_config(args)
    if args.plan is not None:
        planned = _planned(args, REQUEUED, "requeue")
        return _bulk(args, config, "requeued", lambda a: a.requeue(planned, by=who()), planned)
    selection = _selection(args, config)
    if args.dry_run:
        return _dry_run(args, "requeue", selection, config)
    return _bulk(
        args,
        config,
        "requeued",
        lambda actions: actions.requeue(selection, by=who()),
        named=selection.ids,
    )


def _bulk(
    args: argparse.Namespace,
    config: DatabaseCommandConfig,
    done: str,
    verb: Callable[[Actions], Awaitable[list[int]]],
    planned: Selection | None = None,
    named: Sequence[int] = (),
) -> int:
    """A bulk action by filter, by id or by plan: its names checked, then done,
    then said; the deliveries a plan or the command line named that it did
    not take are said too, each in its state (a superseded one names the
    corrected copy that goes instead)."""
    wanted = planned.ids if planned is not None else tuple(named)

    async def act() -> tuple[list[int], dict[int, str]]:
        async with acting(config) as actions:
            await actions.check_names(args.route, args.target, prefix="--")
            ids = await verb(actions)
            return ids, await actions.not_taken(wanted, ids)

    ids, left = run(act())
    result: dict[str, Any] = {done: len(ids), "ids": [str(i) for i in ids]}
    if wanted:
        taken = set(ids)
        result["not_taken"] = [str(i) for i in wanted if i not in taken]
        result["not_taken_why"] = {str(i): said for i, said in left.items()}

    def text(data: dict[str, Any]) -> str:
        said = f"{done} {data[done]} deliveries" + (
            f": {' '.join(data['ids'])}" if 0 < len(data["ids"]) <= 50 else ""
        )
        not_taken = data.get("not_taken")
        if not_taken:
            state = f"the plan no longer {planned.status.value}" if planned else "those named"
            said += f"\n{len(not_taken)} of {state}, left as they are:"
            said += "".join(
                f"\n  delivery {i}: {data['not_taken_why'][i]}"
                for i in not_taken
                if i in data["not_taken_why"]
            )
            if len(not_taken) > len(data["not_taken_why"]):
                said += f"\n  and {len(not_taken) - len(data['not_taken_why'])} more"
        return said

    emit(args, result, text)
    return 0


def _retried(
    args: argparse.Namespace,
    config: DatabaseCommandConfig,
    selection: Selection,
    planned: Selection | None = None,
) -> int:
    """A retry now by filter or plan: done, then said, with what holds some back
    (a down target probed, a receiver's wait) and what a plan or the command
    line named that it did not take."""
    named = planned.ids if planned is not None else selection.ids

    async def act() -> tuple[RetriedNow, dict[int, str]]:
        async with acting(config) as actions:
            await actions.check_names(args.route, args.target, prefix="--")
            done = await actions.retry_selected(selection, by=who())
            return done, await actions.not_taken(named, done.ids)

    done, left = run(act())
    result: dict[str, Any] = {
        "retried": len(done.ids),
        "ids": [str(i) for i in done.ids],
        "probed": done.probed,
        "held": {name: iso(until) for name, until in done.held.items()},
    }
    if named:
        taken = set(done.ids)
        result["not_taken"] = [str(i) for i in named if i not in taken]
        result["not_taken_why"] = {str(i): said for i, said in left.items()}

    def text(data: dict[str, Any]) -> str:
        lines = [
            f"sent now: {data['retried']} deliveries"
            + (f" ({' '.join(data['ids'])})" if 0 < len(data["ids"]) <= 50 else "")
            + ", each one more attempt (its count kept, no new cycle), at its target's pace"
        ]
        lines += [
            f"target {name} is down: its probe goes now; the rest follow once it answers"
            for name in data["probed"]
        ]
        lines += [
            f"target {name}: the receiver asked to be left alone until"
            f" {format_iso_local(until, config.zone)}; they go then"
            for name, until in data["held"].items()
        ]
        not_taken = data.get("not_taken")
        if not_taken:
            state = "the plan" if planned is not None else "those named"
            lines.append(f"{len(not_taken)} of {state} not taken, left as they are:")
            lines += [
                f"  delivery {i}: {data['not_taken_why'][i]}"
                for i in not_taken
                if i in data["not_taken_why"]
            ]
        return "\n".join(lines)

    emit(args, result, text)
    return 0


def pause_target(args: argparse.Namespace) -> int:
    config = read_database_command_config(args)

    async def act() -> None:
        async with acting(config) as actions:
            await actions.set_paused(args.target, args.paused, by=who())

    run(act())
    emit(
        args,
        {"target": args.target, "paused": args.paused},
        lambda data: f"target {data['target']} {'paused' if data['paused'] else 'resumed'}",
    )
    return 0


def show_audit(args: argparse.Namespace) -> int:
    config = read_database_command_config(args)

    async def fetch() -> list[dict[str, Any]]:
        async with acting(config) as actions:
            return [audit_view(entry) for entry in await actions.audit(max(1, args.limit))]

    emit(
        args,
        run(fetch()),
        lambda rows: table(
            [
                [
                    format_iso_local(a["at"], config.zone),
                    a["by"],
                    a["action"],
                    a["subject"],
                    str(a["count"]),
                ]
                for a in rows
            ],
            ["AT", "BY", "ACTION", "ON", "DELIVERIES"],
        ),
    )
    return 0


def show_stats(args: argparse.Namespace) -> int:
    config = read_database_command_config(args)

    async def fetch() -> dict[str, Any]:
        async with opened_store(config) as store:
            stats = await store.stats()
            paused = await store.paused_targets()
            instances = await store.instances() if isinstance(store, Shared) else None
        return stats_view(stats, time.time(), paused, config.masker, instances)

    emit(args, run(fetch()), lambda data: _stats_text(data, config.zone))
    return 0


def _paused_text(info: dict[str, Any], zone: Zone) -> str:
    """A paused target: since when and by whom ("" when it is not)."""
    if not info["paused"]:
        return ""
    since = info.get("paused_since")
    said = f"since {format_iso_local(since, zone)}" if since else "yes"
    return f"{said} by {info['paused_by']}" if info.get("paused_by") else said


def _stats_text(data: dict[str, Any], zone: Zone) -> str:
    statuses = [s.value for s in Status]
    lines = ["by route:"]
    lines.append(
        table(
            [
                [route, *(str(counts[s]) for s in statuses)]
                for route, counts in data["routes"].items()
            ],
            ["ROUTE", *(s.upper() for s in statuses)],
        )
    )
    lines.append("\nby target:")
    lines.append(
        table(
            [
                [
                    name,
                    *(str(info[s]) for s in statuses),
                    _paused_text(info, zone),
                    _down_text(info, zone),
                    format_iso_local(info["last_success_at"], zone),
                    str(info["consecutive_failures"]),
                    info["last_error"] or "-",
                ]
                for name, info in data["targets"].items()
            ],
            [
                "TARGET",
                *(s.upper() for s in statuses),
                "PAUSED",
                "DOWN",
                "LAST SUCCESS",
                "FAILS",
                "LAST ERROR",
            ],
        )
    )
    age = data["oldest_pending_age_seconds"]
    lines.append("")
    lines.append(f"oldest pending: {format_duration(age) if age is not None else 'none'}")
    lines.append(f"pending after their first attempt: {data['pending_after_first_attempt']}")
    lines.append(f"dead: {data['dead']}")
    if "instances" in data:
        lines.append("\ninstances:")
        lines.append(
            table(
                [
                    [
                        instance["id"],
                        instance["host"] or "-",
                        instance["state"],
                        "yes" if instance["leader"] else "",
                        format_iso_local(instance["started_at"], zone),
                        _heartbeat_text(instance),
                        str(instance["leases"]),
                    ]
                    for instance in data["instances"]
                ],
                ["INSTANCE", "HOST", "STATE", "LEADER", "STARTED", "LAST HEARTBEAT", "LEASES"],
            )
        )
    return "\n".join(lines)


def _heartbeat_text(instance: dict[str, Any]) -> str:
    age = instance["heartbeat_age_seconds"]
    if age is None:
        return "-"
    return f"{format_duration(age)} ago"


def _down_text(info: dict[str, Any], zone: Zone) -> str:
    """A down target: since when, and which delivery its next probe takes; a
    throttled one: held until when."""
    if info.get("throttled"):
        until = format_iso_local(info["throttled_until"], zone)
        return f"throttled ({info['throttles']} in a row), held until {until}"
    if not info["down"]:
        return ""
    probe = info.get("probe_delivery")
    since = format_iso_local(info["down_since"], zone)
    return f"since {since}" + (f", probe: delivery {probe}" if probe else "")


def purge_events(args: argparse.Namespace) -> int:
    config = read_database_command_config(args)

    async def act() -> int:
        async with opened_store(config) as store:
            return await retention.purge(
                store,
                config.storage.retention,
                config.dedup_windows,
                time.time(),
                dry_run=args.dry_run,
            )

    count = run(act())
    keep = format_duration(config.storage.retention)
    emit(
        args,
        {"removed": 0 if args.dry_run else count, "would_remove": count, "dry_run": args.dry_run},
        lambda _: (
            f"would remove {count} finished events older than {keep}"
            if args.dry_run
            else f"removed {count} finished events older than {keep}"
        ),
    )
    return 0
