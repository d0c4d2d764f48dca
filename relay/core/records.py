"""The records a delivery travels in between the store and what sends it:
declared here, below both, so a target, the retry policy and the store are
typed against one declaration each."""

from __future__ import annotations

from dataclasses import dataclass

from relay.core.payload import Payload
from relay.core.status import Status


@dataclass(frozen=True)
class DownState:
    """A hold_when_down target that is down: since when, and its probes."""

    since: float
    probe_at: float
    probes: int  # failed probes so far
    # The delivery of the last probe (or of the failure that made it down);
    # the one the next probe takes (read with target_states only).
    last_probe: int | None = None
    next_probe: int | None = None


@dataclass(frozen=True)
class ClaimedDelivery:
    """A delivery leased for one attempt, with what is needed to send it."""

    id: int
    event_id: int
    route: str
    target: str
    attempts: int  # made before this one
    attempts_in_cycle: int  # made since the cycle (re)started
    manual: bool  # this attempt was asked for by a person (retry now)
    resume_status: Status | None  # where a failed manual attempt returns to
    resume_at: float | None
    idempotency_key: str | None
    received_at: float
    payload: Payload
    # What makes its webhook-id unique across databases (None: stored before tags).
    message_tag: str | None = None
    # A corrected copy's delivery: the original's delivery to the same target,
    # which becomes resolved (if dead) when this one is delivered.
    resolves: int | None = None
    # Its ordering key (order_by): the line it heads, which its end lets move on.
    order_key: str | None = None
    # Its target's down state when the store leased it as that target's one
    # probe (a store that `claims_probes`); None: an ordinary attempt.
    probe: DownState | None = None
