"""What an operator's verb on one delivery (retry, skip) found, as values.

A backend's transaction answers the delivery's new view, `Missing`, or
`NotApplicable` with the delivery's state in words; `outcome` turns the
last two into the store's exceptions, the same on every backend. Which of
these a verb answers is decided here too (`retry_now_step`, `may_skip`), from
the delivery's row: each backend reads the row and writes what was decided.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from relay.store.base import Conflict, DeliveryView, NotFound, Status


@dataclass(frozen=True)
class Missing:
    """No delivery has this id."""


@dataclass(frozen=True)
class NotApplicable:
    """The verb does not apply to the delivery as it is: `state` says how it is
    ("delivered", "waiting its turn behind delivery 7 (pending): ...")."""

    state: str


VerbResult = DeliveryView | Missing | NotApplicable


def outcome(delivery_id: int, result: VerbResult) -> DeliveryView:
    if isinstance(result, Missing):
        raise NotFound(f"no delivery {delivery_id}")
    if isinstance(result, NotApplicable):
        raise Conflict(f"delivery {delivery_id} is {result.state}")
    return result


class RetryNow(StrEnum):
    """What `retry_now` does to a delivery, decided from its row alone."""

    FROM_PENDING = "from_pending"  # one more attempt now; its schedule kept to return to
    FROM_DEAD = "from_dead"  # pending now; a failure returns it to dead
    ASKED_ALREADY = "asked_already"  # a person's retry already waits: asking twice is once
    WAITING_TURN = "waiting_turn"  # its key's earlier delivery goes first: not applicable


def retry_now_step(
    status: Status,
    resume_status: str | None,
    next_attempt_at: float | None,
    order_key: str | None,
    resolved_by: int | None = None,
) -> RetryNow | NotApplicable:
    """The manual-retry rule's start, the same on every backend: delivered,
    skipped, superseded and in-flight deliveries cannot be retried; a pending
    one waiting its turn (order_by) would overtake the one before it."""
    if status is Status.SUPERSEDED and resolved_by is not None:
        return superseded_by(resolved_by)
    if status in (
        Status.DELIVERED,
        Status.SKIPPED,
        Status.IN_FLIGHT,
        Status.RESOLVED,
        Status.SUPERSEDED,
    ):
        return NotApplicable(status.value)
    if status is Status.PENDING and next_attempt_at is None and order_key is not None:
        return RetryNow.WAITING_TURN
    if status is Status.DEAD:
        return RetryNow.FROM_DEAD
    return RetryNow.FROM_PENDING if resume_status is None else RetryNow.ASKED_ALREADY


def superseded_by(copy: int) -> NotApplicable:
    """Why a superseded delivery is not sent again: the copy that goes instead."""
    return NotApplicable(
        f"superseded by delivery {copy}, a corrected copy, which is sent instead:"
        " retry, requeue or resend that one"
    )


def waiting_behind(delivery_id: int, status: str) -> NotApplicable:
    """Why a delivery waiting its turn is not retried: the one it waits for."""
    return NotApplicable(
        f"waiting its turn behind delivery {delivery_id} ({status}):"
        " retry, requeue or skip that one"
    )


# What a retry now by filter takes: what may be attempted once more now.
RETRIED = (Status.PENDING, Status.DEAD)


def paused(targets: list[str]) -> str:
    """Why a retry now by filter is refused: a paused target's deliveries would
    only wait (its state in the store survives restarts; resume names it)."""
    named = ", ".join(targets)
    first = targets[0]
    return (
        f"target {named} {'is' if len(targets) == 1 else 'are'} paused: nothing is sent to it;"
        f" resume it first (relay resume {first}, or Resume on the dashboard's Targets page),"
        " or leave it out (choose a target)"
    )


# What a requeue takes: a finished delivery sent again. Never a superseded or
# resolved one: a corrected copy goes (or went) in its place, and sending the
# original too is the double delivery superseding prevents; requeue the copy.
REQUEUED = (Status.DEAD, Status.DELIVERED, Status.SKIPPED)


def may_skip(status: Status) -> NotApplicable | None:
    """Only a pending or dead delivery can be set aside."""
    return None if status in (Status.PENDING, Status.DEAD) else NotApplicable(status.value)


# What the history and the delivery say of a person's verb; `was`: the
# state it was in (a Status is its own value).
def retried(was: str) -> str:
    return f"one more attempt (was {was})"


def skipped(was: str) -> str:
    return f"not to be sent (was {was})"


def skipped_error(was: str) -> str:
    return f"skipped by an operator (was {was})"


def requeued(was: str) -> str:
    return f"fresh retry cycle (was {was})"
