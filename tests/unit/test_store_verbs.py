"""The operator verbs' rule, as a table: what `retry_now` and `skip` do to a
delivery as its row stands (relay.store.verbs; every backend writes it down)."""

from __future__ import annotations

import pytest

from relay.store import Status
from relay.store.verbs import NotApplicable, RetryNow, may_skip, retry_now_step

T = 1_800_000_000.0


@pytest.mark.parametrize(
    ("status", "resume_status", "next_attempt_at", "order_key", "step"),
    [
        (Status.DELIVERED, None, None, None, NotApplicable("delivered")),
        (Status.SKIPPED, None, None, None, NotApplicable("skipped")),
        (Status.IN_FLIGHT, None, None, None, NotApplicable("in_flight")),
        (Status.IN_FLIGHT, "dead", None, None, NotApplicable("in_flight")),
        (Status.DEAD, None, None, None, RetryNow.FROM_DEAD),
        (Status.DEAD, None, None, "order-7", RetryNow.FROM_DEAD),  # the head of its line
        (Status.PENDING, None, T, None, RetryNow.FROM_PENDING),
        (Status.PENDING, None, T, "order-7", RetryNow.FROM_PENDING),  # its turn has come
        (Status.PENDING, None, None, "order-7", RetryNow.WAITING_TURN),
        (Status.PENDING, "pending", T, None, RetryNow.ASKED_ALREADY),
        (Status.PENDING, "dead", T, None, RetryNow.ASKED_ALREADY),
    ],
)
def test_retry_now(
    status: Status,
    resume_status: str | None,
    next_attempt_at: float | None,
    order_key: str | None,
    step: RetryNow | NotApplicable,
) -> None:
    assert retry_now_step(status, resume_status, next_attempt_at, order_key) == step


@pytest.mark.parametrize(
    ("status", "refused"),
    [
        (Status.PENDING, None),
        (Status.DEAD, None),
        (Status.IN_FLIGHT, NotApplicable("in_flight")),
        (Status.DELIVERED, NotApplicable("delivered")),
        (Status.SKIPPED, NotApplicable("skipped")),
    ],
)
def test_skip(status: Status, refused: NotApplicable | None) -> None:
    assert may_skip(status) == refused
