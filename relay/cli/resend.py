"""`relay resend`: send an edited copy of an event as a new event, after a preview."""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from relay.cli.common import (
    CommandError,
    acting,
    add_config_option,
    add_json_option,
    add_service_environment_options,
    emit,
    read_config,
    run,
    who,
)
from relay.core.payload import media_type
from relay.core.printable import printable_lines
from relay.ops.inputs import row_id
from relay.ops.views import preview_view
from relay.store import EventDetail

if TYPE_CHECKING:
    from relay.ops.resend import ResendPlan


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "resend",
        help="send a corrected copy of an event (a new event, linked to the original)",
    )
    add_config_option(parser)
    add_service_environment_options(parser)
    add_json_option(parser)
    parser.add_argument("event_id", metavar="EVENT_ID")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--body", metavar="FILE", help="the corrected body ('-': stdin)")
    source.add_argument(
        "--edit", action="store_true", help="edit the body in $VISUAL or $EDITOR first"
    )
    parser.add_argument(
        "--target",
        metavar="T",
        action="append",
        default=[],
        help="send to this target of the event (repeatable; default: those whose delivery"
        " is not delivered, or all when each is); the original's delivery to it is"
        " never sent again",
    )
    parser.add_argument(
        "--wire",
        action="store_true",
        help="--edit a form as it is encoded (Name=%%D0%%90...), not as its fields decoded",
    )
    parser.add_argument("--content-type", help="the copy's content type (default: the original's)")
    parser.add_argument("--yes", action="store_true", help="send without asking to confirm")
    parser.set_defaults(handler=resend)


def resend(args: argparse.Namespace) -> int:
    # Planning renders the targets' templates (aiohttp's client, Jinja2): imported
    # by the command that sends, not by every `relay` command.
    from relay.ops.resend import (
        FIELDS_NOTE,
        EditRejected,
        editable_body,
        editable_fields,
        fields_body,
        plan_resend,
    )

    config = read_config(args, command=True)
    event_id = row_id(args.event_id, "event id")
    masker = config.masker

    async def load() -> EventDetail:
        async with acting(config) as actions:
            return await actions.event(event_id)

    detail = run(load())
    try:
        fields = editable_fields(detail, masker) if args.edit and not args.wire else None
        if fields is not None:
            # A form as its fields, decoded; encoded back (unchanged ones byte for byte).
            text = _edit(FIELDS_NOTE + fields, detail).decode("utf-8", "replace")
            edited = fields_body(text, detail, masker)
        elif args.edit:
            edited = _edit(editable_body(detail, masker), detail)
        else:
            edited = _read(args.body)
        plan = plan_resend(config, detail, edited, args.content_type, args.target, who(), masker)
    except EditRejected as problem:
        raise CommandError(str(problem)) from None
    if not args.json:
        print(printable_lines(_preview_text(plan)))
    if plan.failures:
        raise CommandError(
            "not sent: "
            + "; ".join(f"target {p.target} would be dead: {p.error}" for p in plan.failures)
        )
    if not args.yes and not _confirmed(event_id, plan):
        print("not sent", file=sys.stderr)
        return 1

    async def send() -> int:
        async with acting(config) as actions:
            return await actions.resend(plan.resend)

    copy_id = run(send())
    result: dict[str, Any] = {
        "sent": True,
        "event_id": str(copy_id),
        "resent_from": str(event_id),
        "targets": list(plan.resend.targets),
        "by": plan.resend.by,
        "previews": [preview_view(p) for p in plan.previews],
    }
    emit(
        args,
        result,
        lambda r: (
            f"sent: event {r['resent_from']} resent as event {r['event_id']}"
            f" to {', '.join(r['targets'])} (relay show {r['event_id']})"
        ),
    )
    return 0


def _read(name: str) -> bytes:
    if name == "-":
        return sys.stdin.buffer.read()
    try:
        return Path(name).read_bytes()
    except OSError as error:
        raise CommandError(f"cannot read {name}: {error.strerror}") from None


def _edit(shown: str, detail: EventDetail) -> bytes:
    editor = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
    suffix = ".json" if "json" in media_type(detail.payload.content_type) else ".txt"
    with tempfile.TemporaryDirectory(prefix="relay-resend-") as folder:
        path = Path(folder) / f"event-{detail.event.id}{suffix}"
        path.write_text(shown, encoding="utf-8")
        try:
            finished = subprocess.run([*shlex.split(editor), str(path)], check=False)
        except OSError as error:
            raise CommandError(
                f"cannot run the editor {editor!r}: {error.strerror} (set $EDITOR)"
            ) from None
        if finished.returncode != 0:
            raise CommandError(f"the editor exited with {finished.returncode}: not sent")
        return path.read_bytes()


def _preview_text(plan: ResendPlan) -> str:
    resend = plan.resend
    lines = [
        f"corrected copy of event {resend.original_id}: {len(resend.body)} bytes,"
        f" {resend.content_type}, to {', '.join(resend.targets)}",
        f"the original's delivery to {', '.join(resend.targets)} is then superseded: never"
        " sent again (one under way decides: delivered, the copy is skipped)",
    ]
    for preview in plan.previews:
        lines.append(f"\n=== {preview.target} ({preview.type})")
        lines.append(
            f"would be dead: {preview.error}" if preview.error is not None else preview.text or ""
        )
    return "\n".join(lines)


def _confirmed(event_id: int, plan: ResendPlan) -> bool:
    if not sys.stdin.isatty():
        raise CommandError("not sent: pass --yes to send without a terminal to confirm on")
    answer = input(
        f"\nSend this corrected copy of event {event_id} to"
        f" {', '.join(plan.resend.targets)}? [y/N] "
    )
    return answer.strip().lower() in ("y", "yes")
