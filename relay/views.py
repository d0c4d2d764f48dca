"""Events and deliveries as JSON-ready dicts: one shape for the CLI and the admin API."""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from typing import Any

from relay.secrets import Masker
from relay.store import AttemptView, DeliveryView, EventDetail, EventView


def iso(timestamp: float | None) -> str | None:
    if timestamp is None:
        return None
    moment = datetime.fromtimestamp(timestamp, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def delivery_summary(delivery: DeliveryView, masker: Masker) -> dict[str, Any]:
    return {
        "id": str(delivery.id),
        "target": delivery.target,
        "status": delivery.status.value,
        "attempts": delivery.attempts,
        "next_attempt_at": iso(delivery.next_attempt_at),
        "last_error": masker.optional(delivery.last_error),
    }


def event_summary(event: EventView, masker: Masker) -> dict[str, Any]:
    return {
        "id": str(event.id),
        "route": event.route,
        "idempotency_key": masker.optional(event.idempotency_key),
        "received_at": iso(event.received_at),
        "status": event.status.value,
        "deliveries": [delivery_summary(d, masker) for d in event.deliveries],
    }


def attempt_view(attempt: AttemptView, masker: Masker) -> dict[str, Any]:
    return {
        "number": attempt.number,
        "started_at": iso(attempt.started_at),
        "duration_ms": round(attempt.duration * 1000, 1),
        "outcome": attempt.outcome,
        "http_status": attempt.http_status,
        "error": masker.optional(attempt.error),
        "response": masker.text(attempt.response.decode("utf-8", errors="replace")),
        "next_attempt_at": iso(attempt.next_attempt_at),
    }


def event_detail(detail: EventDetail, masker: Masker) -> dict[str, Any]:
    result = event_summary(detail.event, masker)
    result["remote_addr"] = detail.event.remote_addr
    result["method"] = detail.method
    result["path"] = masker.text(detail.path)
    result["query"] = masker.text(detail.query)
    result["headers"] = [list(pair) for pair in masker.headers(detail.headers)]
    result["content_type"] = detail.content_type
    try:
        result["body"] = masker.text(detail.body.decode("utf-8"))
    except UnicodeDecodeError:
        result["body"] = None
        result["body_base64"] = base64.b64encode(detail.body).decode("ascii")
    for delivery in result["deliveries"]:
        attempts = detail.attempts.get(int(delivery["id"]), ())
        delivery["attempts_log"] = [attempt_view(a, masker) for a in attempts]
    return result
