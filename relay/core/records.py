"""The records a delivery travels in between the store and what sends it:
declared here, below both, so a target, the step that follows an attempt
(relay.delivery.step) and the store are typed against one declaration each."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple

from relay.core.payload import Payload
from relay.core.status import Status

# A delivery that arrives while its target is down brings the next probe
# forward, but no sooner than this after the last one: a target down under
# a stream of webhooks is asked once every few seconds, not once each.
FRESH_PROBE_GAP = 5.0


@dataclass(frozen=True)
class DownState:
    """A hold_when_down target that is down: since when, and its probes."""

    since: float
    probe_at: float  # the next probe on the target's own backoff
    probes: int  # failed probes so far
    # The delivery of the last probe (or of the failure that made it down);
    # the one the next probe takes (read with target_states only).
    last_probe: int | None = None
    next_probe: int | None = None
    # When it was last probed (or went down), and when the first delivery
    # that arrived since is due (None: none did): fresh evidence.
    probed_at: float | None = None
    evidence_at: float | None = None

    @property
    def due(self) -> float:
        """When the next probe may go: on the backoff, or sooner for a
        delivery that arrived since the last probe (FRESH_PROBE_GAP after it
        at the soonest). A quiet target whose only delivery is a payload it
        refuses is down for that payload's sake; the next webhook is what
        can tell, and it must not wait for a backoff grown through the night."""
        if self.evidence_at is None:
            return self.probe_at
        soonest = self.evidence_at
        if self.probed_at is not None:
            soonest = max(soonest, self.probed_at + FRESH_PROBE_GAP)
        return min(self.probe_at, soonest)


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
    # What makes its identity unique across databases (None: stored before
    # tags), relay.core.identity.
    message_tag: str | None = None
    # Stored before each delivery had an identity, and attempted then: it
    # keeps the key its attempts carried, its event's (relay.core.identity).
    event_keyed: bool = False
    # A corrected copy's delivery: the original's delivery to the same target,
    # which becomes resolved (if dead) when this one is delivered.
    resolves: int | None = None
    # Its ordering key (order_by): the line it heads, which its end lets move on.
    order_key: str | None = None
    # Its target's down state when the store leased it as that target's one
    # probe (a store that `claims_probes`); None: an ordinary attempt.
    probe: DownState | None = None


class AttemptKind(StrEnum):
    """Why an attempt was made: a step of the retry cycle, a person's retry
    now, or a down target's probe (the last two spend no step of the cycle)."""

    CYCLE = "cycle"
    MANUAL = "manual"
    PROBE = "probe"


# Where an attempt leaves its delivery (relay.delivery.step decides, the store writes).


@dataclass(frozen=True)
class Delivered:
    pass


@dataclass(frozen=True)
class RetryAt:
    at: float
    # The receiver asked to be left alone until then (a flood wait): no
    # delivery of the target's paces goes before it. The scheduler's pacers
    # hold them in its process; PostgreSQL's cluster pacing holds them for
    # every instance.
    hold_until: float | None = None

    @property
    def due(self) -> float:
        """When it may go next: its time, or the end of the receiver's wait."""
        return self.at if self.hold_until is None else max(self.at, self.hold_until)


@dataclass(frozen=True)
class Dead:
    reason: str


@dataclass(frozen=True)
class Waits:
    """Back to pending, no retry spent, due at the next probe `at` behind
    every delivery due by then: a down target's failed probe."""

    at: float


@dataclass(frozen=True)
class Superseded:
    """Never the step's word, the store's: a person made a corrected copy for
    the target while this attempt was under way, and the attempt failed. The
    delivery stops there; `by`, the copy's delivery, goes instead."""

    by: int


Transition = Delivered | RetryAt | Dead | Waits | Superseded


def next_status(then: Transition) -> Status:
    """The delivery's status after `then`."""
    if isinstance(then, Delivered):
        return Status.DELIVERED
    if isinstance(then, Dead):
        return Status.DEAD
    if isinstance(then, Superseded):
        return Status.SUPERSEDED
    return Status.PENDING


def next_due(then: Transition) -> float | None:
    """When the delivery may go next after `then` (None: it is finished)."""
    if isinstance(then, RetryAt):
        return then.due
    if isinstance(then, Waits):
        return then.at
    return None


class TargetHealth(NamedTuple):
    """What the rule reads of a target's row (a target never attempted: the
    defaults). The store reads these columns, in this order, locked."""

    consecutive_failures: int = 0
    down_streak: int = 0
    down_since: float | None = None
    probes: int = 0
    successes: int = 0
    last_success_at: float | None = None
    # A receiver's throttle (relay.delivery.step, rule 4): nothing of the
    # target is claimed before this moment; the throttle answers that grew
    # the hold in this episode (each success takes one back).
    throttled_until: float | None = None
    throttles: int = 0
    # hold_when_down: when the target was last probed (or went down), and
    # the number of the probe its backoff schedules next (relay.delivery.step,
    # rule 3: a fresh delivery's probe starts the backoff again at 1).
    probed_at: float | None = None
    probe_step: int = 0

    def written(self, columns: dict[str, Any]) -> TargetHealth:
        """This row once a Step's columns are written."""
        return self._replace(**{k: v for k, v in columns.items() if k in self._fields})


@dataclass(frozen=True)
class History:
    """A delivery's memory of failing: its target's successes when it last
    failed, and whether it fails alone (relay.delivery.step.fails_alone)."""

    seen_successes: int | None = None
    fails_alone: bool = False


@dataclass(frozen=True)
class FailureStreak:
    """A target's failed attempts in a row, before and after the one just recorded,
    and whether that attempt made a hold_when_down target go down or come back up
    (with how many deliveries had waited for it)."""

    before: int
    after: int
    went_down: bool = False
    came_up: bool = False
    waited: int = 0
    down_for: float = 0.0  # how long it had been down, when it came up
    down: bool = False  # the target is down after this attempt


@dataclass(frozen=True)
class Step:
    """What one attempt leads to (relay.delivery.step), as the store writes it."""

    then: Transition  # where its delivery goes
    in_cycle: bool  # the attempt was a step of the retry cycle: the cycle's count grows
    streak: FailureStreak  # `waited` is for the store to fill in (count_waiting)
    target: dict[str, Any] = field(default_factory=dict)  # columns of its target's row to set
    count_waiting: bool = False  # the target came up: how many deliveries waited?
    remember: History | None = None  # the delivery's memory of failing, to write
