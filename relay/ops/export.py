"""Exporting events: for a person who wants their data elsewhere (jq, another
CRM, an accountant's spreadsheet). The CLI (`relay export`), the admin API
(`GET /api/v1/export`) and the dashboard (Deliveries' Export) share this.

Formats:

- `ndjson`: each event as `relay show --json` has it (secrets masked), plus
  `data`, its body decoded (JSON parsed, form fields as an object);
- `csv`: RFC 4180 (comma, CRLF, UTF-8), a header row, one row an event, the
  columns chosen (`fields`): an event's own (`id`, `received_at`...) and
  paths into its payload (`json.Amount`, `json.customer.name`, `form.Name`,
  `query.utm_source`, `headers.X-Shop`); times in the operator's zone;
- `excel`: the same, as Excel opens it by double-click where a comma is the
  decimal separator (a Russian locale: the list separator is `;`): a byte
  order mark so it reads UTF-8 (Cyrillic), `;` between cells.

A spreadsheet runs a cell that starts with `=`, `+`, `-` or `@` as a formula
(CSV injection: a lead's name `=HYPERLINK(...)`): such a cell, and one
starting with a tab or a carriage return, is written with a `'` before it,
which Excel and LibreOffice show as text; a signed number (`-250.00`, a
refund) stays a number.
"""

from __future__ import annotations

import csv
import dataclasses
import io
from collections.abc import AsyncIterator, Sequence
from typing import Any

import orjson

from relay.core.localtime import Zone, format_iso_local
from relay.core.payload import parse_form, parse_json
from relay.core.printable import printable_json
from relay.core.secrets import Masker
from relay.ops.inputs import BadRequest
from relay.ops.views import event_detail
from relay.store import EventQuery, Queries

FORMATS = ("ndjson", "csv", "excel")
# An event's own columns, and what each is.
EVENT_COLUMNS = {
    "id": "the event's id",
    "received_at": "when it arrived, in the operator's zone",
    "route": "its route",
    "status": "the most urgent of its deliveries' statuses",
    "idempotency_key": "its key",
    "remote_addr": "who sent it",
    "targets": "its deliveries, target:status, space-separated",
}
PAYLOAD_PREFIXES = ("json.", "form.", "query.", "headers.")
DEFAULT_FIELDS = ("id", "received_at", "route", "status", "idempotency_key")
# Events read and written per round: the memory of one page of details.
PAGE = 200
_FORMULA = ("=", "+", "-", "@", "\t", "\r")
MAX_FIELDS = 100


@dataclasses.dataclass(frozen=True)
class Export:
    format: str = "ndjson"
    fields: tuple[str, ...] = DEFAULT_FIELDS
    zone: Zone = None

    @property
    def media_type(self) -> str:
        return "application/x-ndjson" if self.format == "ndjson" else "text/csv"

    @property
    def filename(self) -> str:
        return "relay-events." + ("ndjson" if self.format == "ndjson" else "csv")


def export_of(format: str | None, fields: str | None, zone: Zone, prefix: str = "") -> Export:
    """An export as a person asks for it (BadRequest naming the field, after
    `prefix`: "--" for the CLI's options, otherwise)."""
    chosen = format or "ndjson"
    if chosen not in FORMATS:
        raise BadRequest(f"{prefix}format: {chosen!r}: expected one of {', '.join(FORMATS)}")
    if fields is None or not fields.strip():
        return Export(chosen, DEFAULT_FIELDS, zone)
    if chosen == "ndjson":
        raise BadRequest(f"{prefix}fields: only for csv and excel (ndjson exports the whole event)")
    names = tuple(name.strip() for name in fields.split(",") if name.strip())
    if len(names) > MAX_FIELDS:
        raise BadRequest(f"{prefix}fields: {len(names)} of them: at most {MAX_FIELDS}")
    for name in names:
        if name not in EVENT_COLUMNS and not (
            name.startswith(PAYLOAD_PREFIXES) and name.partition(".")[2]
        ):
            raise BadRequest(
                f"{prefix}fields: {name[:100]!r}: expected one of {', '.join(EVENT_COLUMNS)},"
                " or a path into the payload: json.Amount, form.Name, query.utm_source,"
                " headers.X-Shop"
            )
    return Export(chosen, names, zone)


def decoded(view: dict[str, Any]) -> Any:
    """The (masked) body as data: JSON parsed, form fields as an object, else None."""
    body = view.get("body")
    if body is None:
        return None
    parsed = parse_json(body.encode())
    if parsed is not None or body.strip() == "null":
        return parsed
    return parse_form(view.get("content_type"), body.encode())


async def exported(
    store: Queries, query: EventQuery, masker: Masker, export: Export
) -> AsyncIterator[bytes]:
    """The export of every event `query` selects, newest first, a page at a time."""
    if export.format != "ndjson":
        yield _header(export)
    page = dataclasses.replace(query, limit=PAGE)
    while True:
        events = await store.list_events(page)
        chunk = io.StringIO() if export.format != "ndjson" else None
        lines = []
        for event in events:
            detail = await store.get_event(event.id)
            if detail is None:  # purged since the page was read
                continue
            view = event_detail(detail, masker)
            view["data"] = decoded(view)
            if chunk is None:
                # Shown in a terminal as often as saved: no character a sender
                # wrote drives it (the same JSON to any parser).
                lines.append(printable_json(orjson.dumps(view, option=orjson.OPT_APPEND_NEWLINE)))
            else:
                _writer(chunk, export).writerow(_row(view, export))
        if chunk is not None:
            lines.append(chunk.getvalue().encode("utf-8"))
        yield b"".join(lines)
        if len(events) < PAGE:
            return
        page = dataclasses.replace(page, before_id=events[-1].id)


def _writer(out: io.StringIO, export: Export) -> Any:
    delimiter = ";" if export.format == "excel" else ","
    return csv.writer(out, delimiter=delimiter, lineterminator="\r\n")


def _header(export: Export) -> bytes:
    out = io.StringIO()
    _writer(out, export).writerow([cell(name) for name in export.fields])
    bom = "\ufeff" if export.format == "excel" else ""
    return (bom + out.getvalue()).encode("utf-8")


def _row(view: dict[str, Any], export: Export) -> list[str]:
    return [cell(_value(view, name, export.zone)) for name in export.fields]


def _value(view: dict[str, Any], name: str, zone: Zone) -> Any:
    if name == "received_at":
        return format_iso_local(view["received_at"], zone)
    if name == "targets":
        return " ".join(f"{d['target']}:{d['status']}" for d in view["deliveries"])
    if name in EVENT_COLUMNS:
        return view.get(name)
    where, _, path = name.partition(".")
    if where == "headers":
        wanted = path.lower()
        return next((value for key, value in view["headers"] if key.lower() == wanted), None)
    if where == "query":
        return (parse_form("application/x-www-form-urlencoded", view["query"].encode()) or {}).get(
            path
        )
    data = view["data"]
    if where == "form" and not isinstance(data, dict):
        return None
    return _at(data, path.split(".") if where == "json" else [path])


def _at(data: Any, path: Sequence[str]) -> Any:
    for step in path:
        if isinstance(data, dict):
            data = data.get(step)
        elif isinstance(data, list) and step.isascii() and step.isdigit():
            index = int(step)
            data = data[index] if index < len(data) else None
        else:
            return None
    return data


def cell(value: Any) -> str:
    """A value as a spreadsheet cell: text, and never a formula (a number,
    -250 or "-250.00", stays a number)."""
    if value is None:
        return ""
    text = value if isinstance(value, str) else orjson.dumps(value).decode()
    if text.startswith(_FORMULA) and not _plain_number(text):
        return "'" + text
    return text


def _plain_number(text: str) -> bool:
    """ "-250", "+7.5": a sign and digits, one point at most, nothing else."""
    whole, _, fraction = text[1:].partition(".")
    return (
        text[0] in "+-"
        and whole.isascii()
        and whole.isdigit()
        and (not fraction or (fraction.isascii() and fraction.isdigit()))
    )
