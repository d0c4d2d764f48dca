"""Every record the store reads from a row, declared once (relay.store.shape).

Each Shape says which column each field of a record comes from; the SQL of
both backends names `SHAPE.columns` and maps rows with `SHAPE.from_row`, so
a column is added to what a record reads here, and nowhere else. The
values that need a conversion say so beside their column: a Status, bytes
(PostgreSQL's bytea arrives as bytes, SQLite's BLOB too; a NULL one as b""
where the record wants bytes), a bool (SQLite stores 0 and 1).
"""

from __future__ import annotations

import orjson

from relay.core.outcome import SentRequest
from relay.core.payload import Payload
from relay.store.base import (
    AlertNote,
    Arrival,
    AttemptKind,
    AttemptView,
    AuditEntry,
    BodyHead,
    ClaimedDelivery,
    DeliveryView,
    DownState,
    EventDetail,
    EventView,
    FailingDelivery,
    Header,
    HeldBehind,
    HeldKey,
    History,
    IndexSource,
    LogEntry,
    NewEvent,
    Rejection,
    ResendLink,
    RouteStreak,
    RouteWatch,
    Status,
    TargetHealth,
    TargetState,
)
from relay.store.shape import GIVEN, Column, Columns, Shape

# Conversions


def decode_headers(raw: bytes) -> list[Header]:
    return [(str(name), str(value)) for name, value in orjson.loads(raw)]


def blob(value: bytes | None) -> bytes:
    """A BLOB/bytea that may be NULL, as bytes."""
    return bytes(value or b"")


def optional_status(value: str | None) -> Status | None:
    return Status(value) if value is not None else None


def is_set(value: object) -> bool:
    return value is not None


def text(value: str | None) -> str:
    return value or ""


def id_list(value: str) -> tuple[int, ...]:
    """A JSON list of ids (the audit's deliveries)."""
    return tuple(int(i) for i in orjson.loads(value))


def sent_request(head: str | None, body: bytes | None) -> SentRequest | None:
    """An attempt's request (its `request` and `request_body` columns)."""
    if head is None:
        return None
    values = orjson.loads(head)
    headers = tuple((str(name), str(value)) for name, value in values["headers"])
    size = values.get("size")  # absent from attempts kept before it was
    return SentRequest(values["method"], values["url"], headers, bytes(body or b""), size)


# Events

# A request as stored: the one value every record of an event carries.
PAYLOAD = Shape(
    Payload,
    method="method",
    path="path",
    query="query",
    headers=Column("headers", decode_headers),
    content_type="content_type",
    body=Column("body", bytes),
)
# An event as it was stored (a corrected copy is made from it).
STORED_EVENT = Shape(
    NewEvent,
    route="route",
    idempotency_key="idempotency_key",
    received_at="received_at",
    remote_addr="remote_addr",
    payload=PAYLOAD,
)
# An event in a listing; its deliveries are read by another query.
EVENT = Shape(
    EventView,
    id="id",
    route="route",
    idempotency_key="idempotency_key",
    received_at="received_at",
    remote_addr="remote_addr",
    conflict_of="conflict_of",
    deliveries=GIVEN,
    flagged="flagged",
)
# One event with everything about it, each part read by a query of its own.
EVENT_DETAIL = Shape(
    EventDetail,
    event=EVENT,
    payload=PAYLOAD,
    attempts=GIVEN,
    log=GIVEN,
    resent_from=GIVEN,
    resent_as=GIVEN,
)
# A corrected copy and its original.
RESEND_LINK = Shape(ResendLink, original_id="original_id", copy_id="copy_id", at="at", by="by")
# The start of an event's body (its first `?` bytes), for a listing's glance.
BODY_HEAD = Shape(
    BodyHead,
    content_type="content_type",
    query="query",
    head=Column("substr(body, 1, ?)", bytes),
    size="length(body)",
)
# An event's searchable parts, its body cut to its first `?` bytes.
INDEX_SOURCE = Shape(
    IndexSource,
    event_id="id",
    headers=Column("headers", decode_headers),
    query="query",
    content_type="content_type",
    body=Column("substr(body, 1, ?)", blob),
)

# Deliveries

DELIVERY = Shape(
    DeliveryView,
    id="id",
    event_id="event_id",
    target="target",
    status=Column("status", Status),
    attempts="attempts",
    attempts_in_cycle="cycle_attempts",
    next_attempt_at="next_attempt_at",
    last_error="last_error",
    updated_at="updated_at",
    order_key="order_key",
    resolves="resolves",
    resolved_by="resolved_by",
)
# A delivery that keeps failing, with its route.
FAILING = Shape(FailingDelivery, route="route", delivery=DELIVERY)
# A delivery leased for an attempt, read from its row (d) joined with its event's (e).
CLAIMED = Shape(
    ClaimedDelivery,
    id="d.id",
    event_id="d.event_id",
    route="d.route",
    target="d.target",
    attempts="d.attempts",
    attempts_in_cycle="d.cycle_attempts",
    manual=Column("d.resume_status", is_set),
    resume_status=Column("d.resume_status", optional_status),
    resume_at="d.resume_at",
    message_tag="d.message_tag",
    event_keyed=Column("d.event_keyed", bool),
    resolves="d.resolves",
    order_key="d.order_key",
    idempotency_key="e.idempotency_key",
    received_at="e.received_at",
    payload=PAYLOAD.on("e"),
)
# The first unfinished delivery of an ordering key (the head of its line).
HELD_BEHIND = Shape(
    HeldBehind, delivery_id="id", status=Column("status", Status), event_id="event_id"
)
# An ordering key whose head is dead (`d`), with how many wait behind it.
HELD_KEY = Shape(
    HeldKey,
    delivery_id="d.id",
    event_id="d.event_id",
    target="d.target",
    order_key="d.order_key",
    waiting=(
        "(SELECT COUNT(*) FROM deliveries n WHERE n.target = d.target"
        " AND n.order_key = d.order_key AND n.status = 'pending' AND n.id > d.id)"
    ),
)
# A delivery's memory of failing (relay.delivery.step).
HISTORY = Shape(History, seen_successes="seen_successes", fails_alone=Column("fails_alone", bool))
ATTEMPT = Shape(
    AttemptView,
    delivery_id="delivery_id",
    number="number",
    started_at="started_at",
    duration="duration",
    outcome="outcome",
    http_status="http_status",
    error="error",
    response=Column("response", blob),
    next_attempt_at="next_attempt_at",
    kind=Column("kind", AttemptKind),
    cycle_number="cycle_number",
    request=Columns(("request", "request_body"), sent_request),
)
LOG_ENTRY = Shape(
    LogEntry, delivery_id="delivery_id", at="at", kind="kind", detail="detail", by="by"
)

# Targets

# A down target's fresh evidence (relay.delivery.step, rule 3): a pending
# delivery `d` (its event `e`) never attempted that arrived after the target
# was last probed, `{probed}`. A new delivery is due when it arrives, so the
# range of the due index after `{probed}` holds every one (and few others).
FRESH_EVIDENCE = (
    "d.status = 'pending' AND d.attempts = 0"
    " AND d.next_attempt_at > {probed} AND e.received_at > {probed}"
)
DOWN = Shape(
    DownState,
    since="down_since",
    probe_at="probe_at",
    probes="probes",
    last_probe="probe_delivery",
    probed_at="probed_at",
    evidence_at=(
        "(SELECT MIN(d.next_attempt_at) FROM deliveries d JOIN events e ON e.id = d.event_id"
        " WHERE d.target = targets.name AND "
        + FRESH_EVIDENCE.format(probed="targets.probed_at")
        + ")"
    ),
)
TARGET_STATE = Shape(
    TargetState,
    name="name",
    paused=Column("paused", bool),
    paused_at="paused_at",
    # Read only of a paused target: the scheduler polls this every second.
    paused_by=(
        "CASE WHEN paused THEN (SELECT a.by FROM audit a WHERE a.action = 'pause'"
        " AND a.subject = 'target ' || targets.name ORDER BY a.id DESC LIMIT 1) END"
    ),
    last_success_at="last_success_at",
    last_error_at="last_error_at",
    last_error="last_error",
    consecutive_failures="consecutive_failures",
    down=DOWN.or_none("down_since"),
    throttled_until="throttled_until",
    throttles="throttles",
)
# What the step that follows an attempt reads of its target's row: its
# columns are TargetHealth's fields.
HEALTH: Shape[TargetHealth] = Shape(TargetHealth, **{name: name for name in TargetHealth._fields})

# What people did and what relay refused

AUDIT_ENTRY = Shape(
    AuditEntry,
    id="id",
    at="at",
    by="by",
    action="action",
    subject="subject",
    count="count",
    deliveries=Column("deliveries", id_list),
)
REJECTION = Shape(
    Rejection,
    route="route",
    at="at",
    remote_addr="remote_addr",
    reason="reason",
    detail=Column("detail", text),
    headers=Column("headers", decode_headers),
)
# A cluster's alert notes (PostgreSQL's alert_notes).
ALERT_NOTE = Shape(AlertNote, id="id", noted_at="noted_at", note=Column("note", bytes))


# What the silence watch keeps of a route (route_watch), by route.
ROUTE_WATCH = Shape(
    RouteWatch,
    first_event_at="first_event_at",
    last_event_at="last_event_at",
    silent_since="silent_since",
    usual="silent_usual",
    limit="silent_limit",
)
ROUTE_WATCHES = ROUTE_WATCH.keyed("route")
# A stored event as the silence watch learns from it.
ARRIVAL = Shape(Arrival, id="id", route="route", received_at="received_at")

# A route's failed attempts in a row at a target (route_streaks), by the pair.
ROUTE_STREAK = Shape(RouteStreak, failures="failures", error="last_error")


def _pair(route: str, target: str) -> tuple[str, str]:
    return route, target


def _streak_of(pair: tuple[str, str], streak: RouteStreak) -> tuple[tuple[str, str], RouteStreak]:
    return pair, streak


ROUTE_STREAKS = Shape(_streak_of, pair=Columns(("route", "target"), _pair), streak=ROUTE_STREAK)
