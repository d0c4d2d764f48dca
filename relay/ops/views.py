"""Events and deliveries as JSON-ready dicts: one shape for the CLI and the admin API."""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from relay.config import TargetConfig
from relay.core.outcome import SentRequest, Verdict
from relay.core.payload import event_fields
from relay.core.secrets import Masker, mask_fields, request_masker, shown_body
from relay.core.status import attempt_outcome
from relay.core.units import count, format_duration, format_instant
from relay.loader.registry import target_kind
from relay.store import (
    AttemptKind,
    AttemptView,
    AuditEntry,
    DeliveryView,
    EventDetail,
    EventView,
    FailingDelivery,
    InstanceState,
    LogEntry,
    Rejection,
    ResendLink,
    RouteWatch,
    SearchProgress,
    Stats,
    Status,
    TargetState,
    TextSearch,
)

if TYPE_CHECKING:
    from relay.ops.resend import Preview  # the resend planner needs the targets


def iso(timestamp: float | None) -> str | None:
    return None if timestamp is None else format_instant(timestamp)


def delivery_summary(delivery: DeliveryView, masker: Masker) -> dict[str, Any]:
    view: dict[str, Any] = {
        "id": str(delivery.id),
        "target": delivery.target,
        "status": delivery.status.value,
        "attempts": delivery.attempts,
        # Steps of its current retry cycle (a requeue starts a new one; a
        # manual retry or a probe is no step of it).
        "attempts_in_cycle": delivery.attempts_in_cycle,
        "next_attempt_at": iso(delivery.next_attempt_at),
        "last_error": masker.optional(delivery.last_error),
        # A corrected copy's delivery and the original's it stands in for, both
        # ways: `resolves` on the copy's; `resolved_by` on the one it superseded
        # (or resolved, once delivered; in flight: the copy waits for it).
        "resolved_by": _id(delivery.resolved_by),
        "resolves": _id(delivery.resolves),
    }
    held = delivery.held_behind
    if held is not None:
        view["held_behind"] = {
            "delivery_id": str(held.delivery_id),
            "event_id": str(held.event_id),
            "status": held.status.value,
        }
    if delivery.waits_for is not None:
        view["waits_for"] = str(delivery.waits_for)
    note = held_note(delivery) or copy_note(delivery)
    if note is not None:
        view["note"] = note
    return view


def state_said(delivery: DeliveryView) -> str:
    """A delivery's state in words, with why it waits or which copy superseded
    it: what a person is told of one an action named but did not take."""
    said = delivery.status.value.replace("_", " ")
    note = held_note(delivery) or copy_note(delivery)
    if note is None:
        return said
    return note if note.startswith(said) else f"{said}, {note}"


def copy_note(delivery: DeliveryView) -> str | None:
    """What a corrected copy did to this delivery, or what this copy waits for
    (relay.store.supersede)."""
    copy = delivery.resolved_by
    if delivery.status is Status.SUPERSEDED and copy is not None:
        return (
            f"superseded by delivery {copy}, a corrected copy, which goes instead: not sent again"
        )
    if delivery.status is Status.IN_FLIGHT and copy is not None:
        return (
            f"a corrected copy, delivery {copy}, waits for this attempt:"
            " sent if it fails, skipped if it succeeds"
        )
    if delivery.waits_for is not None:
        return (
            f"waits for the attempt of delivery {delivery.waits_for} (the original) under way:"
            " sent if it fails, skipped if it succeeds"
        )
    return None


def failing_view(found: FailingDelivery, masker: Masker) -> dict[str, Any]:
    """A delivery that keeps failing, with its event and route (the Overview)."""
    delivery = found.delivery
    return {
        **delivery_summary(delivery, masker),
        "event_id": str(delivery.event_id),
        "route": found.route,
    }


def silent_view(route: str, watch: RouteWatch, now: float) -> dict[str, Any]:
    """A route the silence watch says is silent (relay.background.silence)."""
    return {
        "route": route,
        "silent_since": iso(watch.silent_since),
        "last_event_at": iso(watch.last_event_at),
        "silent_for": format_duration(max(0.0, now - watch.last_event_at)),
        "usual": format_duration(watch.usual) if watch.usual is not None else None,
        "limit": format_duration(watch.limit) if watch.limit is not None else None,
    }


def held_note(delivery: DeliveryView) -> str | None:
    """ "held behind delivery N, dead": why an ordered delivery is not being sent."""
    held = delivery.held_behind
    if held is None:
        return None
    note = f"held behind delivery {held.delivery_id}, {held.status.value.replace('_', ' ')}"
    if held.status is Status.DEAD:
        note += f" (retry, requeue or skip {held.delivery_id} to let it go)"
    return note


def event_summary(event: EventView, masker: Masker) -> dict[str, Any]:
    key = masker.optional(event.idempotency_key)
    return {
        **event_fields(event.id, event.route, event.received_at, key),
        # Set when the key already named that event and this payload differs:
        # a different notification under a reused key, kept, not dropped.
        "key_conflict_of": str(event.conflict_of) if event.conflict_of is not None else None,
        # Set when a background pass skipped it: relay stopped while it read it.
        "flagged": event.flagged,
        "status": event.status.value,
        "deliveries": [delivery_summary(d, masker) for d in event.deliveries],
    }


def said_of(attempt: AttemptView) -> str:
    """A stored attempt in ATTEMPT_OUTCOMES' words (relay.core.status): the one
    that ended its delivery is dead, whether it failed for good or was the
    last retry (no next attempt, and no probe, which waits for the next one)."""
    verdict = Verdict(attempt.outcome)
    ended = verdict is Verdict.FAIL or (
        verdict is Verdict.RETRY
        and attempt.next_attempt_at is None
        and attempt.kind is not AttemptKind.PROBE
    )
    return attempt_outcome(verdict, Status.DEAD if ended else Status.PENDING)


def attempt_view(attempt: AttemptView, masker: Masker) -> dict[str, Any]:
    return {
        "number": attempt.number,
        "started_at": iso(attempt.started_at),
        "duration_ms": round(attempt.duration * 1000, 1),
        # What the attempt came to, in the words of the attempt log and the
        # metrics: success, retry, or dead for the one that ended the
        # delivery; `verdict` is the target's (success, retry, fail) as stored.
        "outcome": said_of(attempt),
        "verdict": attempt.outcome,
        "http_status": attempt.http_status,
        "error": masker.optional(attempt.error),
        "response": masker.text(attempt.response.decode("utf-8", errors="replace")),
        "next_attempt_at": iso(attempt.next_attempt_at),
        # "cycle", "manual" (a person's retry now) or "probe" (of a down target);
        # the step of its retry cycle, none for the other two.
        "kind": attempt.kind.value,
        "cycle_number": attempt.cycle_number,
        # What this attempt sent (secrets masked when it was kept), beside
        # what came back; None when the target does not say (not http).
        "request": _request_view(attempt.request, masker),
    }


def _request_view(request: SentRequest | None, masker: Masker) -> dict[str, Any] | None:
    if request is None:
        return None
    return {
        "method": request.method,
        "url": masker.text(request.url),
        "headers": [list(pair) for pair in masker.headers(request.headers)],
        "body": masker.text(request.body.decode("utf-8", errors="replace")),
        # How large the body was; what is kept is cut at 2 KiB (relay.delivery.kept).
        "size": request.size if request.size is not None else len(request.body),
    }


def event_detail(detail: EventDetail, masker: Masker) -> dict[str, Any]:
    # The request's own credentials (an api_key field, a ?token=), found by
    # name and masked in every form they show in, with or without the config's.
    masker = request_masker(
        masker, detail.payload.query, detail.payload.content_type, detail.payload.body
    )
    result = event_summary(detail.event, masker)
    result["remote_addr"] = detail.event.remote_addr
    result["method"] = detail.payload.method
    result["path"] = masker.text(detail.payload.path)
    result["query"] = masker.text(mask_fields(detail.payload.query))
    result["headers"] = [list(pair) for pair in masker.headers(detail.payload.headers)]
    result["content_type"] = detail.payload.content_type
    try:
        result["body"] = shown_body(
            detail.payload.body.decode("utf-8"), detail.payload.content_type, masker
        )
    except UnicodeDecodeError:
        result["body"] = None
        result["body_base64"] = base64.b64encode(detail.payload.body).decode("ascii")
    for delivery in result["deliveries"]:
        delivery_id = int(delivery["id"])
        attempts = detail.attempts.get(delivery_id, ())
        delivery["attempts_log"] = [attempt_view(a, masker) for a in attempts]
        delivery["history"] = [log_entry_view(e) for e in detail.log.get(delivery_id, ())]
    link = detail.resent_from
    result["resent_from"] = resend_link_view(link, link.original_id) if link else None
    result["resent_as"] = [resend_link_view(link, link.copy_id) for link in detail.resent_as]
    return result


def mark_probes(event: dict[str, Any], states: Mapping[str, TargetState]) -> dict[str, Any]:
    """Say, on each pending delivery of a down target, that it waits for a
    probe, and on the one the next probe takes, that it is that probe."""
    for delivery in event["deliveries"]:
        state = states.get(delivery["target"])
        down = state.down if state is not None else None
        if down is None or delivery["status"] not in ("pending", "in_flight"):
            continue
        delivery["probe"] = {
            "target_down_since": iso(down.since),
            "next_probe_at": iso(down.due),
            "is_next_probe": down.next_probe == int(delivery["id"]),
        }
    return event


def resend_link_view(link: ResendLink, event_id: int) -> dict[str, Any]:
    """The other end of a corrected-copy link: which event, sent by whom and when."""
    return {"event_id": str(event_id), "at": iso(link.at), "by": link.by}


def log_entry_view(entry: LogEntry) -> dict[str, Any]:
    return {"at": iso(entry.at), "kind": entry.kind, "detail": entry.detail, "by": entry.by}


def audit_view(entry: AuditEntry) -> dict[str, Any]:
    """One operator action: who, when, what, on how many deliveries."""
    return {
        "id": str(entry.id),
        "at": iso(entry.at),
        "by": entry.by,
        "action": entry.action,
        "subject": entry.subject,
        "count": entry.count,
        "deliveries": [str(i) for i in entry.deliveries],
    }


def _counts(counts: Mapping[Status, int]) -> dict[str, int]:
    return {status.value: counts.get(status, 0) for status in Status}


def target_state_view(state: TargetState | None, masker: Masker) -> dict[str, Any]:
    state = state or TargetState(name="")
    return {
        "last_success_at": iso(state.last_success_at),
        "last_error_at": iso(state.last_error_at),
        "last_error": masker.optional(state.last_error),
        "consecutive_failures": state.consecutive_failures,
        "paused_since": iso(state.paused_at) if state.paused else None,
        "paused_by": state.paused_by if state.paused else None,
        # hold_when_down: deliveries wait (no retries spent) while probes go out.
        "down": state.down is not None,
        "down_since": iso(state.down.since) if state.down else None,
        "next_probe_at": iso(state.down.due) if state.down else None,
        "failed_probes": state.down.probes if state.down else 0,
        # Which delivery probes: the next probe's (under way, or first in
        # line) and the last one's; each failed probe goes to the back.
        "probe_delivery": _id(state.down.next_probe) if state.down else None,
        "last_probe_delivery": _id(state.down.last_probe) if state.down else None,
        # A receiver's throttle (a 429): the whole target held until then, or
        # (past) sending one request alone; its answers in a row that grew it.
        "throttled": state.throttles > 0,
        "throttled_until": iso(state.throttled_until) if state.throttles else None,
        "throttles": state.throttles,
    }


def _id(value: int | None) -> str | None:
    return None if value is None else str(value)


def instance_view(instance: InstanceState) -> dict[str, Any]:
    age = instance.heartbeat_age
    return {
        "id": instance.id,
        "host": instance.host,
        "state": instance.state,
        "leader": instance.leader,
        "started_at": iso(instance.started_at),
        "last_heartbeat": iso(instance.last_heartbeat),
        "heartbeat_age_seconds": None if age is None else round(age, 3),
        "leases": instance.leases,
    }


def stats_view(
    stats: Stats,
    now: float,
    paused: frozenset[str],
    masker: Masker,
    instances: Sequence[InstanceState] | None = None,
) -> dict[str, Any]:
    """`instances`: a cluster's (PostgreSQL), listed under "instances"; a
    single process (SQLite) has no such key."""
    oldest = stats.oldest_pending_received_at
    targets = sorted(set(stats.counts_by_target) | set(stats.targets))
    cluster = {} if instances is None else {"instances": [instance_view(i) for i in instances]}
    return {
        "routes": {route: _counts(c) for route, c in sorted(stats.counts_by_route.items())},
        "targets": {
            name: {
                **_counts(stats.counts_by_target.get(name, {})),
                "paused": name in paused,
                **target_state_view(stats.targets.get(name), masker),
            }
            for name in targets
        },
        "oldest_pending_age_seconds": round(now - oldest, 3) if oldest is not None else None,
        "pending_after_first_attempt": stats.pending_after_first_attempt,
        "dead": stats.dead,
        **cluster,
    }


def target_view(
    target: TargetConfig,
    state: TargetState | None,
    *,
    paused: bool,
    counts: Mapping[str, int],
    schedule: str,
    masker: Masker,
) -> dict[str, Any]:
    view: dict[str, Any] = {"name": target.name, "type": target.type}
    view.update(target_kind(target.type).view(target.settings, masker))
    view.update(
        concurrency=target.concurrency,
        rate=str(target.rate) if target.rate is not None else None,
        schedule=schedule,
        timeout_seconds=target.retry.timeout,
        retry_on_error=target.retry.retry_on_error,
        paused=paused,
        hold_when_down=target.hold_when_down,
        down_after=target.down_after if target.hold_when_down else None,
        deliveries=dict(counts),
        **target_state_view(state, masker),
    )
    return view


def rejection_view(rejection: Rejection, masker: Masker) -> dict[str, Any]:
    return {
        "route": rejection.route,
        "at": iso(rejection.at),
        "remote_addr": rejection.remote_addr,
        "reason": rejection.reason,
        "detail": masker.text(rejection.detail),
        "headers": [list(pair) for pair in masker.headers(rejection.headers)],
    }


def not_indexed(progress: SearchProgress) -> str:
    """The events a search could not see, by their ids: a count would read as
    an id next to them ("after #10915 (up to 2628)")."""
    return (
        f"events after #{progress.indexed_through}, up to #{progress.newest}"
        f" (at most {count(progress.behind, 'event')})"
    )


def search_view(search: TextSearch, progress: SearchProgress) -> dict[str, Any]:
    """What a search looked for, and how much of the store it could see."""
    behind = progress.behind
    return {
        "words": list(search.words),
        "digits": search.digits,
        "indexed_through": str(progress.indexed_through),
        "newest_event": str(progress.newest),
        "not_indexed": behind,
        "note": (
            f"{not_indexed(progress)} are not indexed yet and not searched"
            ": the index catches up in the background"
            if behind
            else "every stored event is indexed"
        ),
    }


def preview_view(preview: Preview) -> dict[str, Any]:
    """What one target would be sent (already masked), or why it would be dead."""
    return {
        "target": preview.target,
        "type": preview.type,
        "request": preview.text,
        "error": preview.error,
    }
