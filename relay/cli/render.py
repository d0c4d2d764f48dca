"""`relay render`: try a route's templates on a sample payload, sending nothing."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from relay.cli.common import (
    CommandError,
    add_config_option,
    add_json_option,
    add_service_environment_options,
    emit,
    read_config,
)
from relay.core.payload import Payload, strip_form_fields
from relay.ops.inputs import unknown_name
from relay.store import Status


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "render",
        help="show what each target of a route would send for a sample body (sends nothing)",
    )
    add_config_option(parser)
    add_service_environment_options(parser)
    add_json_option(parser)
    parser.add_argument("route", metavar="ROUTE")
    parser.add_argument("--body", metavar="FILE", required=True, help="the body ('-': stdin)")
    parser.add_argument("--content-type", help="default: guessed (JSON, else form)")
    parser.add_argument(
        "--header", metavar="K:V", action="append", default=[], help="a request header"
    )
    parser.add_argument(
        "--wire",
        action="store_true",
        help="the exact bytes each target sends (default: decoded, as a person reads them)",
    )
    parser.set_defaults(handler=render)


def render(args: argparse.Namespace) -> int:
    # The pipeline's modules (sources, targets with aiohttp's client, Jinja2) are
    # imported by the command that runs them, not by every `relay` command.
    from relay.core.budget import TemplateError
    from relay.core.incoming import Incoming
    from relay.ingress.plan import idempotency_key, plan_deliveries
    from relay.kinds.source import Ping, Reject
    from relay.loader.registry import build_source, build_target
    from relay.ops.resend import unsent_envelope
    from relay.targets.base import unstored_event_id
    from relay.templates import marking_defaults

    config = read_config(args, command=True)
    route = config.routes.get(args.route)
    if route is None:
        raise CommandError(unknown_name("route", args.route, config.routes))
    body = sys.stdin.buffer.read() if args.body == "-" else _read(Path(args.body))
    headers = []
    for item in args.header:
        name, sep, value = item.partition(":")
        if not sep or not name.strip():
            raise CommandError(f"--header expects NAME:VALUE, got {item!r}")
        headers.append((name.strip(), value.strip()))
    content_type = args.content_type or _guess(body)
    if not any(name.lower() == "content-type" for name, _ in headers):
        headers.append(("Content-Type", content_type))
    payload = Payload.received("POST", route.path, "", headers, body)
    incoming = Incoming(payload)
    masker = config.masker
    lines: list[str] = []  # the text; `report` the same as data (--json)
    report: dict[str, Any] = {"route": route.name, "path": masker.text(route.path)}
    lines.append(f"route {route.name}: POST {masker.text(route.path)}")
    if not args.wire:
        lines.append(
            "(bodies decoded for reading: form fields one a line, JSON indented;"
            " --wire shows the exact bytes)"
        )
    # The same steps as ingress: the route's source profile, then its key.
    source = build_source(route)
    check = source.check(incoming, time.time())
    if isinstance(check, Ping):
        answer = check.answer.body.decode("utf-8", "replace")
        lines.append(
            f"a test request: ingress answers {check.answer.status} {answer!r}, stores nothing"
        )
        report["ping"] = {"status": check.answer.status, "answer": answer}
        emit(args, report, lambda _: "\n".join(lines))
        return 0
    if isinstance(check, Reject):
        detail = f" ({masker.text(check.detail)})" if check.detail else ""
        lines.append(
            f"verification: ingress would refuse this request with 401: {check.reason}{detail};"
            " shown below as if it were signed"
        )
        report["refused"] = {"status": 401, "reason": check.reason, "detail": detail.strip(" ()")}
        source_key = source.key(incoming)
    else:
        source_key = check.key
    key = idempotency_key(route, incoming, source_key)
    # The event's key: what makes a webhook sent again a duplicate, and what
    # templates see; each delivery goes out under an Idempotency-Key of its own.
    shown_key = masker.text(key) if key is not None else "(none: templates see the event id)"
    lines.append(f"idempotency key: {shown_key}")
    report["idempotency_key"] = masker.text(key) if key is not None else None
    envelope = unsent_envelope(
        route.name,
        key or "(event id)",
        replace(
            payload,
            content_type=content_type,
            body=strip_form_fields(content_type, body, route.strip_fields),
        ),
        time.time(),
    )
    failed = False
    report["targets"] = []
    for planned in plan_deliveries(route, incoming):
        target = config.targets[planned.target]
        said: dict[str, Any] = {"target": target.name, "type": target.type}
        report["targets"].append(said)
        lines.append(f"\n=== {target.name} ({target.type})")
        if planned.status is Status.SKIPPED:
            lines.append(f"skipped: {planned.reason}")
            said.update(outcome="skipped", reason=planned.reason)
            continue
        if planned.status is Status.DEAD:
            lines.append(f"would be dead: {planned.reason}")
            said.update(outcome="dead", reason=planned.reason)
            failed = True
            continue
        try:
            with marking_defaults() as fell_back:
                preview = build_target(target).preview(envelope, wire=args.wire)
        except TemplateError as error:
            lines.append(f"would be dead: {error}")
            said.update(outcome="dead", reason=str(error))
            failed = True
            continue
        shown = masker.text(unstored_event_id(preview, "(the event's id once stored)"))
        lines.append(shown)
        said.update(outcome="sent", request=shown, defaults=list(dict.fromkeys(fell_back)))
        if fell_back:
            # A missing field is easy to miss in a filled-in template: say it.
            lines.append(f"NOTE: fell back to a default ({', '.join(dict.fromkeys(fell_back))}):")
            lines.append(
                "      the sample has no such field; check the field names the sender uses"
            )
    emit(args, report, lambda _: "\n".join(lines))
    return 1 if failed else 0


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as error:
        raise CommandError(f"cannot read {path}: {error.strerror}") from None


def _guess(body: bytes) -> str:
    stripped = body.lstrip()
    if stripped[:1] in (b"{", b"["):
        return "application/json"
    return "application/x-www-form-urlencoded"
