"""The store's contract: lifecycle verbs over events and deliveries.

The rest of relay speaks these verbs and these records; only a store module
speaks SQL. Driver errors never cross this line: they become

    StoreError
     ├── StoreUnavailable   cannot read or write now (disk full, locked, I/O);
     │                      ingress answers 503 with Retry-After
     ├── NotFound           no such event or delivery
     └── Conflict           the verb does not apply in the current state

Every verb whose result depends on the time takes `now` as an argument.

The verbs are grouped by who uses them; each part of relay takes only its role:

    Intake       accept_event, record_rejection          ingress, alerts
    Queue        claim_due, next_due, record_attempt,    the scheduler
                 release, recover_orphans, ...
    Operations   retry_now, requeue, resend, pause...    admin API, dashboard, CLI
    Queries      list_events, get_event, stats...        admin API, dashboard, CLI, metrics
    Indexing     events_to_index, index_events,          the search indexer
                 indexing_begins, skip_indexing...
    Health       heartbeat, file_problem                 /readyz, database watch
    Maintenance  purge, reclaim_space, backup...         retention, `relay backup`
    Store        all of them, plus open/close            whoever opens it (relay.store.open_store)

and, on a store several instances share (PostgreSQL) only:

    AlertNotes   note_alerts, alert_notes, send_alert    alerts
    Shared       AlertNotes, lead, listen, reconfigure   the app (isinstance(store, Shared))

ADDING A VERB: put it in the role of the part that calls it (a new consumer
with a new need gets a new small role, not the whole Store), keep its name
in the domain's words (never insert_row/update_status), take `now` rather
than read a clock, and cover it in tests/store/test_contract.py, which every
backend must pass unchanged (a reviewer reads that suite verb by verb).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, Protocol, runtime_checkable

from relay.core.outcome import SentRequest
from relay.core.payload import Payload
from relay.core.records import (  # re-exported: the store's contract speaks them
    AttemptKind as AttemptKind,
)
from relay.core.records import (
    ClaimedDelivery as ClaimedDelivery,
)
from relay.core.records import (
    Dead as Dead,
)
from relay.core.records import (
    Delivered as Delivered,
)
from relay.core.records import (
    DownState as DownState,
)
from relay.core.records import (
    FailureStreak as FailureStreak,
)
from relay.core.records import (
    History as History,
)
from relay.core.records import (
    RetryAt as RetryAt,
)
from relay.core.records import (
    Step as Step,
)
from relay.core.records import (
    Superseded as Superseded,
)
from relay.core.records import (
    TargetHealth as TargetHealth,
)
from relay.core.records import (
    Transition as Transition,
)
from relay.core.records import (
    Waits as Waits,
)
from relay.core.status import Status as Status  # the one vocabulary, re-exported

if TYPE_CHECKING:
    import asyncio

    from relay.config import Config


# What follows an attempt, given its target's row and the delivery's memory
# of failing as the store holds them (relay.delivery.step, bound).
Decide = Callable[[TargetHealth, History], Step]

# Who acted, when a caller of an operator verb does not say (tests, scripts).
UNKNOWN = "unknown"
# How a database command (`sudo relay pause crm`) names who acted: a process
# of its own, which the running service notices (relay.background.noticed).
BY_CLI = "cli user"


class StoreError(Exception):
    pass


class StoreUnavailable(StoreError):
    pass


class NotFound(StoreError):
    pass


class Conflict(StoreError):
    pass


# How long one search may run: past it the search is stopped and the person
# told to narrow it; a search of every event for a rare string must not hold
# a reader for everyone else.
SEARCH_SECONDS = 2.0


class SearchTooSlow(StoreError):
    """A search stopped at SEARCH_SECONDS; the message says how to narrow it."""

    def __init__(self, seconds: float = SEARCH_SECONDS) -> None:
        super().__init__(
            f"the search took longer than {seconds:g} s and was stopped:"
            " narrow it (a route, a time range, a longer word)"
        )


Header = tuple[str, str]


class NewEvent(NamedTuple):  # made for every webhook: a tuple is the cheapest to make
    route: str
    idempotency_key: str | None
    received_at: float
    remote_addr: str | None
    payload: Payload
    # The digest of the payload's canonical form (relay.canonical): compared
    # when the key is already stored, to tell a re-send from other content.
    # None (what ingress gives): the store works it out from the body only
    # when the key turns out to be held already; most keys are new.
    digest: bytes | None = None


class NewDelivery(NamedTuple):  # made for every webhook and target: a tuple, as NewEvent
    target: str
    status: Status = Status.PENDING
    # Why a delivery starts skipped or dead (a `when` filter, a broken template).
    reason: str | None = None
    # Its ordering key (`order_by`): deliveries to the same target with the
    # same key are attempted one at a time, in order of receipt.
    order_key: str | None = None


class Accepted(NamedTuple):
    """What became of an event handed to the store (a tuple: one is made for
    every event stored, and a frozen dataclass costs twice as much to make).

    stored, new key            Accepted(id, duplicate=False)
    a re-send (same content)   Accepted(stored id, duplicate=True)
    key held, other content    Accepted(new id, duplicate=False, conflict_of=stored id)
    ... on a rejecting route   Accepted(stored id, duplicate=False, conflict_of=stored id,
                                        refused=True): nothing stored
    """

    event_id: int
    duplicate: bool
    conflict_of: int | None = None
    refused: bool = False


@dataclass(frozen=True)
class AttemptRecord:
    number: int
    started_at: float
    duration: float
    outcome: str
    http_status: int | None = None
    error: str | None = None
    response: bytes = b""
    # False: the event could not be sent as rendered; the target's health stays as it was.
    target_at_fault: bool = True
    kind: AttemptKind = AttemptKind.CYCLE
    # What was sent (secrets masked, the body cut like the answer), if known.
    request: SentRequest | None = None


@dataclass(frozen=True)
class HeldBehind:
    """The delivery an ordered one waits for: the first unfinished of its key."""

    delivery_id: int
    status: Status
    event_id: int


@dataclass(frozen=True)
class DeliveryView:
    id: int
    event_id: int
    target: str
    status: Status
    attempts: int
    attempts_in_cycle: int
    next_attempt_at: float | None
    last_error: str | None
    updated_at: float
    order_key: str | None = None
    # Pending behind an earlier delivery of the same key (order_by), if so.
    held_behind: HeldBehind | None = None
    # The two ends of a corrected copy (relay.store.supersede): this copy's
    # delivery stands in for that one of the original (and resolves it once
    # delivered); this one was superseded, or resolved, by that one of a copy
    # (in flight: the copy waits for this attempt).
    resolves: int | None = None
    resolved_by: int | None = None
    # A copy's delivery waiting for the attempt under way of the one it stands in for.
    waits_for: int | None = None

    @property
    def waiting_turn(self) -> bool:
        """Pending, but not due at all: its key's earlier delivery goes first."""
        return (
            self.status is Status.PENDING
            and self.next_attempt_at is None
            and self.order_key is not None
        )


@dataclass(frozen=True)
class AttemptView:
    delivery_id: int
    number: int
    started_at: float
    duration: float
    outcome: str
    http_status: int | None
    error: str | None
    response: bytes
    next_attempt_at: float | None
    kind: AttemptKind = AttemptKind.CYCLE
    # Its step in its retry cycle (1 = the cycle's first try); None for a
    # manual retry or a probe, which are no step of it.
    cycle_number: int | None = None
    request: SentRequest | None = None


@dataclass(frozen=True)
class EventView:
    id: int
    route: str
    idempotency_key: str | None
    received_at: float
    remote_addr: str | None
    deliveries: tuple[DeliveryView, ...]
    # The event that already held this key when this one, with other content,
    # arrived: a key conflict, stored rather than dropped as a duplicate.
    conflict_of: int | None = None
    # Why a background pass skipped it (relay stopped while it read it), if one did.
    flagged: str | None = None

    @property
    def status(self) -> Status:
        """One word for the event: the most urgent state among its deliveries."""
        states = {delivery.status for delivery in self.deliveries}
        for status in (
            Status.DEAD,
            Status.IN_FLIGHT,
            Status.PENDING,
            Status.SUPERSEDED,
            Status.RESOLVED,
            Status.DELIVERED,
        ):
            if status in states:
                return status
        return Status.SKIPPED if states else Status.DELIVERED


@dataclass(frozen=True)
class ResendLink:
    """A corrected copy: event `copy_id` is an edited resend of `original_id`."""

    original_id: int
    copy_id: int
    at: float
    by: str  # "dashboard session 1a2b3c4d from 127.0.0.1", "cli user anna"...


@dataclass(frozen=True)
class Resend:
    """What to send again as a new event: the edited body, to these targets."""

    original_id: int
    headers: tuple[Header, ...]  # the original's, Content-Type set to the new one
    body: bytes
    content_type: str
    targets: tuple[str, ...]
    by: str


@dataclass(frozen=True)
class EventDetail:
    event: EventView
    payload: Payload
    attempts: Mapping[int, tuple[AttemptView, ...]] = field(default_factory=dict)
    log: Mapping[int, tuple[LogEntry, ...]] = field(default_factory=dict)
    resent_from: ResendLink | None = None  # this event is a corrected copy of that one
    resent_as: tuple[ResendLink, ...] = ()  # corrected copies of this event, oldest first


@dataclass(frozen=True)
class LogEntry:
    """Something done to a delivery: "retry" (one more attempt), "requeue",
    "skip" by a person (`by`); "superseded", "copy" (one waits for this
    attempt) or "resolved" by a corrected copy (relay.store.supersede)."""

    delivery_id: int
    at: float
    kind: str
    detail: str | None
    by: str | None = None


# An audit entry keeps the ids of the first this many deliveries it touched.
AUDIT_IDS_KEPT = 1000


@dataclass(frozen=True)
class AuditEntry:
    """One operator action: who, when, what, on how many deliveries."""

    id: int
    at: float
    by: str  # "dashboard session 1a2b3c4d from 127.0.0.1", "cli user anna", "admin API..."
    action: str  # pause, resume, retry, skip, requeue, resend
    subject: str  # what it named: "target crm", "delivery 12", "dead, route leads"...
    count: int  # deliveries it touched (0 for a pause)
    deliveries: tuple[int, ...]  # the first AUDIT_IDS_KEPT of them


@dataclass(frozen=True)
class Recovered:
    """What a start found in flight: how many deliveries it took back, and
    which of them it parked as dead instead of attempting again, relay
    having stopped INTERRUPTED_LIMIT times in a row while sending each."""

    taken_back: int
    parked: tuple[int, ...] = ()


# An attempt relay stopped in the middle of (a crash, a kill, the watchdog)
# spends no retry; this many in a row, and the delivery is parked dead: a
# stored event cannot keep stopping relay (relay.store.rows.INTERRUPTED).
INTERRUPTED_LIMIT = 5


@dataclass(frozen=True)
class HeldTargets:
    """What holds targets back, read together: paused ones, down ones, and
    those in a receiver's throttle episode (held until when)."""

    paused: frozenset[str]
    down: dict[str, DownState]
    throttled: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class TargetState:
    name: str
    paused: bool = False
    # Since when, and who paused it (the audit's last pause of it).
    paused_at: float | None = None
    paused_by: str | None = None
    last_success_at: float | None = None
    last_error_at: float | None = None
    last_error: str | None = None
    consecutive_failures: int = 0
    down: DownState | None = None
    # Held by a receiver's throttle until then (in the past: no longer held),
    # after this many throttle answers in its episode (relay.delivery.step).
    throttled_until: float | None = None
    throttles: int = 0


@dataclass(frozen=True)
class Selection:
    """Which deliveries a bulk action (requeue, skip, retry now) takes: those
    in `status` that meet every filter given. Time bounds are on the event's
    arrival; `key` and `search` as in EventQuery, so a bulk action on a
    listing takes exactly the deliveries the listing shows."""

    status: Status = Status.DEAD
    route: str | None = None
    target: str | None = None
    since: float | None = None
    until: float | None = None
    ids: tuple[int, ...] = ()
    key: str | None = None
    search: TextSearch | None = None
    # Only those that may be attempted now: not a pending one waiting its turn
    # behind an earlier one of its ordering key (a retry now would overtake
    # it; its line's head is the one to send).
    sendable: bool = False


@dataclass(frozen=True)
class RetriedNow:
    """What a retry now by filter did (Operations.retry_selected): `ids` are
    due now, each a person's retry (its count kept, no new cycle), to go at
    their targets' pace; the down targets of `probed` are probed now, their
    deliveries going once a probe finds them up; those of `held` wait, a
    receiver having asked to be left alone until then."""

    ids: list[int]
    probed: list[str] = field(default_factory=list)
    held: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class HeldKey:
    """An ordering key held: its first unfinished delivery is dead, and
    `waiting` deliveries of the key wait behind it."""

    delivery_id: int
    event_id: int
    target: str
    order_key: str
    waiting: int


@dataclass(frozen=True)
class Attention:
    """What needs a person (the dashboard's Overview leads with it)."""

    dead_since: int  # deliveries gone dead since the time asked about
    held: tuple[HeldKey, ...]  # the first `limit` held keys, oldest first


@dataclass(frozen=True)
class FailingDelivery:
    """A delivery that keeps failing: pending (or in flight) after many
    attempts in its current cycle, on its route."""

    route: str
    delivery: DeliveryView


@dataclass(frozen=True)
class FailingDeliveries:
    """The deliveries that keep failing (Queries.failing_deliveries)."""

    counts: Mapping[tuple[str, str], int]  # (route, target) -> how many
    first: tuple[FailingDelivery, ...]  # the first `limit`, oldest first

    @property
    def total(self) -> int:
        return sum(self.counts.values())


@dataclass(frozen=True)
class Gauges:
    """Cheap counts (index-only) for metrics: deliveries not yet finished."""

    counts: Mapping[tuple[str, Status], int]  # (target, status) for pending/in_flight/dead
    oldest_pending_received_at: float | None
    # Per target: pending deliveries behind a dead one of their ordering key.
    held: Mapping[str, int] = field(default_factory=dict)
    # Events a background pass skipped: relay stopped while it read them.
    flagged: int = 0


@dataclass(frozen=True)
class AlertNote:
    """Something an instance's attempt saw that an alert must say (a delivery
    gone dead, a target down...), waiting in a shared store for the leading
    instance to group it with the others into one alert."""

    id: int
    noted_at: float
    note: bytes  # JSON, as relay.alerts writes it


@dataclass(frozen=True)
class RouteRun:
    """Attempts of one route to one target in a row that went the same way:
    `failures` failed ones (the last one's `error`), or, with 0, attempts
    that got through (any number: one ends a streak as well as many)."""

    route: str
    target: str
    failures: int = 0
    error: str | None = None


@dataclass(frozen=True)
class RouteStreak:
    """A route's failed attempts in a row at one target, and the last one's error."""

    failures: int
    error: str | None


@dataclass(frozen=True)
class Arrival:
    """A stored event as the silence watch learns from it (relay.background.silence)."""

    id: int
    route: str
    received_at: float


@dataclass(frozen=True)
class RouteWatch:
    """What the silence watch keeps of a route: the first and last event it
    learnt from, and, while the route is silent, since when, with its usual
    longest silence at that hour of the week and the limit it went past."""

    first_event_at: float
    last_event_at: float
    silent_since: float | None = None
    usual: float | None = None
    limit: float | None = None


@dataclass(frozen=True)
class RouteWatches:
    """Every route's RouteWatch, and the newest event id learnt from."""

    through: int
    routes: Mapping[str, RouteWatch]


@dataclass(frozen=True)
class Learned:
    """A pass of the silence watch over the events up to `through`: each
    route's first and last event since, the longest silences it saw by
    (route, week, hour of the week), the routes that received again after
    they were said silent, and the oldest week still to keep."""

    through: int
    seen: Mapping[str, tuple[float, float]]
    longest: Mapping[tuple[str, int, int], float]
    back: Collection[str] = ()
    keep_from_week: int = 0


@dataclass(frozen=True)
class InstanceState:
    """One relay instance of a cluster, as the database sees it (times by the
    database's clock, comparable across hosts)."""

    id: str
    host: str | None  # None: started before relay recorded hosts
    started_at: float
    last_heartbeat: float | None
    heartbeat_age: float | None  # seconds since, at the moment of asking
    # "alive"; "silent" (unseen for dead_after: its leases are taken over);
    # "stopped" (it said so: its leases were free at once).
    state: str
    leases: int  # deliveries it has leased now
    leader: bool  # it runs retention, alerts and the gauges


@dataclass(frozen=True)
class Stats:
    counts_by_route: Mapping[str, Mapping[Status, int]]
    counts_by_target: Mapping[str, Mapping[Status, int]]
    oldest_pending_received_at: float | None
    pending_after_first_attempt: int
    dead: int
    targets: Mapping[str, TargetState]


@dataclass(frozen=True)
class HourlyActivity:
    """Attempts and deliveries gone dead in one hour (`hour` is its start)."""

    hour: float
    attempts: int
    failed: int
    dead: int


@dataclass(frozen=True)
class Rejection:
    """A request relay refused (bad signature, address not allowed...), headers masked."""

    route: str
    at: float
    remote_addr: str | None
    reason: str
    detail: str
    headers: Sequence[Header]


# Rejections kept per route: enough to answer "what did relay see?".
REJECTIONS_KEPT = 100


@dataclass(frozen=True)
class TextSearch:
    """Content to look for (made by relay.search): every word must occur in the
    event's folded text, or, for a number, its digits among the event's numbers."""

    words: tuple[str, ...] = ()
    digits: str | None = None


@dataclass(frozen=True)
class BodyHead:
    """The start of an event's body, for the glance a listing shows (relay.glance)."""

    content_type: str | None
    query: str
    head: bytes  # the first bytes asked for
    size: int  # the whole body's length


@dataclass(frozen=True)
class SearchDocument:
    """What the search index holds for one event: folded text, its numbers as digits."""

    event_id: int
    text: str
    digits: str


@dataclass(frozen=True)
class IndexSource:
    """An event's searchable parts, its body cut to `body_limit` bytes."""

    event_id: int
    headers: Sequence[Header]
    query: str
    content_type: str | None
    body: bytes


@dataclass(frozen=True)
class SearchProgress:
    """How far the search index has got: events up to `indexed_through` are in it."""

    indexed_through: int
    newest: int  # the newest event id

    @property
    def behind(self) -> int:
        """Events not indexed yet (at most: purged ids count too)."""
        return max(0, self.newest - self.indexed_through)


@dataclass(frozen=True)
class EventQuery:
    status: Status | None = None
    route: str | None = None
    target: str | None = None
    since: float | None = None
    until: float | None = None
    key: str | None = None
    search: TextSearch | None = None
    limit: int = 50
    before_id: int | None = None  # cursor: only events older than this id
    # Only events with a delivery that keeps failing: pending or in flight
    # after at least this many attempts in its current cycle.
    failing: int | None = None


class Intake(Protocol):
    """Taking events in (ingress, alerts): store them, keep what was refused."""

    def accept_event(
        self,
        event: NewEvent,
        deliveries: Sequence[NewDelivery],
        now: float,
        *,
        refuse_conflict: bool = False,
        from_sender: bool = True,
    ) -> asyncio.Future[Accepted]:
        """Store an event and its deliveries in one durable transaction.

        Returns at once a future that is done after that transaction ended
        (await it; ingress answers from it in a callback, with no task per
        request). When its route already holds the idempotency key: an event
        with the same digest is a re-send, answered with the stored one marked
        duplicate; one with another digest is stored as a new event flagged
        `conflict_of` the first (or, with `refuse_conflict`, not stored and
        marked refused). The future raises StoreUnavailable if the commit
        failed; the call itself raises it when the store is closed.

        An event `from_sender` is about to be acknowledged: it is refused
        (StoreUnavailable) while `file_problem()` says the database file is
        no longer at its path, asked once per group commit. relay's own
        alerts pass False: they go on into the open file, to say so.
        """
        ...

    async def record_rejection(self, rejection: Rejection) -> None:
        """Keep a refused request for the operator; only the last REJECTIONS_KEPT per route."""
        ...


class Queue(Protocol):
    """The scheduler's view: lease what is due, record each attempt, give leases
    back, recover a crashed process's leases; which targets are paused or down."""

    async def claim_due(
        self,
        now: float,
        lease_until: float,
        limits: Mapping[str, int],
        exclude: Collection[int] = (),
        probes: Collection[str] = (),
    ) -> list[ClaimedDelivery]:
        """Lease up to limits[target] due deliveries of each target, oldest due first.

        Due means pending with next_attempt_at <= now, or in flight with an
        expired lease (its process died mid-attempt) — except the `exclude`d
        ones, attempts this very process still has under way (a clock that
        jumps ahead must not make them look abandoned).

        `probes`: targets whose claim is their down target's one probe, as
        the caller knows them: it takes the delivery rows.probe_choice says
        (fresh evidence first). A store that `claims_probes` knows it
        itself, for the whole cluster, and ignores this.
        """
        ...

    async def next_due(self, targets: Collection[str]) -> dict[str, float]:
        """For each of these targets with something waiting, the earliest time
        it has something to claim."""
        ...

    # True when claim_due leases nothing for a target before the time next_due
    # gives it: the scheduler's poll may then look (a read) before it claims
    # (a write transaction), and an idle relay writes nothing.
    next_due_foresees_claims: bool

    # True when claim_due applies the hold_when_down rule itself, for every
    # process sharing the queue: a down target's deliveries are leased only as
    # its one probe (ClaimedDelivery.probe), when its probe time has come and
    # nothing of it is under way anywhere. The scheduler then takes the store's
    # word over its memory, which may be a poll old (another instance made the
    # target down or up meanwhile). False: one process, whose memory is the rule.
    claims_probes: bool

    async def record_attempt(
        self,
        delivery: ClaimedDelivery,
        attempt: AttemptRecord,
        decide: Decide,
        now: float,
    ) -> Step:
        """Record the attempt and move the delivery on, in one transaction.

        `decide` is the step that follows the attempt (relay.delivery.step,
        bound to its rules and what happened): the store calls it with the
        target's row, read locked in this transaction, and the delivery's
        memory of failing, and writes the Step it returns (the delivery's
        next state, the target's health, the lines a target going down or
        coming up rearranges). Returns that Step, its streak's `waited`
        filled in when the target came up.
        """
        ...

    async def release(self, delivery_ids: Collection[int], now: float) -> None:
        """Give back leases without counting an attempt (shutdown, target gone)."""
        ...

    async def recover_orphans(self, now: float) -> Recovered:
        """At start, make claimable again the in-flight deliveries no live
        process is attempting: this store's own leases, expired ones and, where
        the serve lock proves this process is the only one (SQLite), all of
        them at once; each attempt cut short is counted, and a delivery whose
        last INTERRUPTED_LIMIT attempts were all cut short is parked dead."""
        ...

    async def flag_unconfigured(self, configured: Collection[str], now: float) -> dict[str, int]:
        """Mark pending deliveries whose target is not in the config (they wait,
        never dropped, until it comes back); returns how many per target."""
        ...

    async def paused_targets(self) -> frozenset[str]: ...

    async def down_targets(self) -> dict[str, DownState]:
        """Targets that are down (hold_when_down), whatever the config says now."""
        ...

    async def held_targets(self) -> HeldTargets:
        """paused_targets and down_targets in one read (the scheduler's poll)."""
        ...


class Operations(Protocol):
    """What a person does to deliveries and targets (dashboard, API, CLI)."""

    # Every verb here takes `by`, who acts (a CLI user, a dashboard session, the
    # admin API's token): the action is recorded with it in the audit
    # (list_audit) and in the history of each delivery it touched, in the
    # action's own transaction.

    async def retry_now(self, delivery_id: int, now: float, *, by: str = UNKNOWN) -> DeliveryView:
        """One more attempt, due now. The attempt count is kept and no cycle
        starts: if it fails, a dead delivery stays dead and a pending one keeps
        its schedule. Raises NotFound, or Conflict when delivered or in flight."""
        ...

    async def skip(self, delivery_id: int, now: float, *, by: str = UNKNOWN) -> DeliveryView:
        """A person decides a pending or dead delivery is not to be sent: it
        becomes skipped (logged as "skip"), and the next delivery of its
        ordering key, if any, may go. Raises NotFound, or Conflict when it is
        delivered, skipped already or in flight."""
        ...

    async def requeue(self, selection: Selection, now: float, *, by: str = UNKNOWN) -> list[int]:
        """A fresh retry cycle for each selected delivery (history kept, the
        requeue logged). Deliveries already pending are left as they are, and
        a superseded or resolved one is never taken (verbs.REQUEUED). Returns
        the ids requeued."""
        ...

    async def count(self, selection: Selection) -> int:
        """How many deliveries a requeue of `selection` would take."""
        ...

    async def select(self, selection: Selection, limit: int) -> list[int]:
        """The ids of the deliveries `selection` takes (what a bulk action on it
        would act on), oldest first, at most `limit`."""
        ...

    async def retry_selected(
        self, selection: Selection, now: float, *, by: str = UNKNOWN
    ) -> RetriedNow:
        """`retry_now` for every pending (not waiting its turn) or dead delivery
        `selection` takes, in one transaction: each due now, the attempt count
        kept, no new cycle; the scheduler sends them at their target's rate,
        after any hold a receiver asked for. A down target's probe is made due
        now (its deliveries go once it finds the target up). Raises Conflict,
        changing nothing, when a target they go to is paused (verbs.paused)."""
        ...

    async def skip_selected(
        self, selection: Selection, now: float, *, by: str = UNKNOWN
    ) -> list[int]:
        """`skip` for every pending or dead delivery `selection` takes (deliveries
        in flight are left to finish), in one transaction, oldest first: the
        next delivery of each ordering key may go. Returns the ids skipped."""
        ...

    async def resend(self, resend: Resend, now: float) -> int:
        """Store an edited copy of an event as a new event (no idempotency key:
        it goes out with its own id as one), linked to the original, with one
        pending delivery per chosen target, in one transaction. The original's
        body is not touched; its delivery to each chosen target is superseded
        (relay.store.supersede: at once, or once its attempt under way ends).
        Returns the new event's id; NotFound without the original."""
        ...

    async def set_paused(self, target: str, paused: bool, now: float, *, by: str = UNKNOWN) -> None:
        """Pause or resume a target; resuming a down one makes its probe due now."""
        ...


class Queries(Protocol):
    """Reading for people and metrics; never changes anything."""

    async def list_events(self, query: EventQuery) -> list[EventView]: ...

    async def get_event(self, event_id: int) -> EventDetail | None: ...

    async def get_delivery(self, delivery_id: int) -> DeliveryView | None: ...

    async def target_states(self) -> dict[str, TargetState]: ...

    async def flagged_events(self, limit: int) -> list[EventView]:
        """The newest events a background pass skipped (relay stopped while it
        read them), at most `limit`."""
        ...

    async def gauges(self) -> Gauges: ...

    async def stats(self) -> Stats: ...

    async def activity(self, since: float, until: float) -> list[HourlyActivity]:
        """Per hour from `since`: attempts made, failed, and deliveries gone dead."""
        ...

    async def list_rejections(
        self,
        route: str | None,
        limit: int,
        *,
        since: float | None = None,
        until: float | None = None,
    ) -> list[Rejection]:
        """The newest refused requests first; `since` inclusive, `until` exclusive."""
        ...

    async def list_audit(self, limit: int, before_id: int | None = None) -> list[AuditEntry]:
        """Operator actions, newest first; `before_id` pages back."""
        ...

    async def attention(self, dead_since: float, limit: int) -> Attention:
        """How many deliveries went dead at or after `dead_since` (and are dead
        still), and the ordering keys held behind a dead delivery."""
        ...

    async def failing_deliveries(self, after: int, limit: int) -> FailingDeliveries:
        """Deliveries pending or in flight after at least `after` attempts in
        their current cycle: how many per route and target, and the first
        `limit` of them."""
        ...

    async def search_progress(self) -> SearchProgress: ...

    async def body_heads(self, event_ids: Sequence[int], size: int) -> dict[int, BodyHead]:
        """The first `size` bytes of these events' bodies (bounded work for a
        listing, whatever was sent); ids that are gone are left out."""
        ...


class Indexing(Protocol):
    """The background search indexer's two steps."""

    async def events_to_index(self, limit: int, body_limit: int) -> list[IndexSource]:
        """The oldest events not in the search index yet, at most `limit`."""
        ...

    async def index_events(self, documents: Sequence[SearchDocument], through: int) -> None:
        """Put these documents in the index and mark every event up to `through`
        indexed, in one transaction (a crash loses neither, nor doubles them).
        Events purged meanwhile are left out. Reaching the event it began
        through (`indexing_begins`), the indexer is on none."""
        ...

    async def indexing_begins(self, through: int | None) -> None:
        """The indexer is on the events up to `through` (None: on none), said
        before it reads them: a crash meanwhile is known at the next start.
        Survives the process (it need not survive a power cut)."""
        ...

    async def interrupted_indexing(self) -> int | None:
        """The last event of what the indexer was on when relay stopped without
        finishing it (a crash, a kill), or None."""
        ...

    async def skip_indexing(self, event_id: int, reason: str) -> None:
        """Leave this event out of the index, flagged with `reason`, and go on
        after it."""
        ...


class Health(Protocol):
    """Whether the store can take events now (/readyz, the database watch)."""

    async def heartbeat(self, now: float) -> None:
        """A small durable write: proves the store is writable right now (and,
        for a file, that it is still the file at the configured path)."""
        ...

    def file_problem(self) -> str | None:
        """Why new events must not be accepted into this store any more (its
        file was deleted or replaced), or None. accept_event itself refuses
        a sender's events then."""
        ...


class Maintenance(Protocol):
    """Retention, space, backups, and how well writes are batched."""

    async def purge(
        self, cutoffs: Mapping[str, float], default_cutoff: float, *, limit: int, dry_run: bool
    ) -> int:
        """Remove up to `limit` finished events (every delivery delivered or
        skipped) received before their route's cutoff, with their deliveries
        and attempts. Never touches pending or dead deliveries. With dry_run,
        counts every event that would go instead."""
        ...

    async def reclaim_space(self) -> int:
        """Give pages freed by purges back to the file system, a bounded step at a
        time; returns how many pages this step gave back."""
        ...

    async def backup(self, destination: Path) -> int:
        """A consistent copy of the whole store at `destination` while it is in use;
        returns how many events the copy holds."""
        ...

    async def release_memory(self) -> None:
        """Give back what is cached only for speed (relay.memory calls it once
        relay is quiet); the next use fills it again."""
        ...

    @property
    def write_stats(self) -> tuple[int, int]:
        """(transactions committed, jobs in them): how well writes are batched."""
        ...


class Streaks(Protocol):
    """Failed attempts in a row per route and target, for the alerts that say
    a route is failing at a target and that it recovered (relay.alerts):
    kept in the store so that a restart in the middle of an outage still ends
    it with "recovered". On a shared store the streak is the cluster's: every
    instance's attempts count towards it."""

    async def count_runs(self, runs: Sequence[RouteRun], now: float) -> list[tuple[int, int]]:
        """Count these runs into their route and target's streak, in order (a
        run that got through ends it), in one transaction; each run's streak
        before and after it."""
        ...

    async def route_streaks(self) -> dict[tuple[str, str], RouteStreak]:
        """Every (route, target) failing now, with its streak."""
        ...


class Rhythms(Protocol):
    """What the silence watch learns of each route's rhythm and keeps
    (relay.background.silence): read from the events as they are stored,
    never written on their way in. On a shared store the leading instance
    learns and judges, for the cluster."""

    async def arrivals(self, after: int, limit: int) -> list[Arrival]:
        """The next `limit` events after id `after`, by id."""
        ...

    async def route_watches(self) -> RouteWatches:
        """Every route learnt from, and how far the events were learnt."""
        ...

    async def route_rhythm(self, slot: int, weeks: range) -> dict[str, dict[int, float]]:
        """For hour of the week `slot`, each route's longest silence in each
        of these weeks it has one for: route -> week -> seconds."""
        ...

    async def learn_rhythm(self, learned: Learned) -> dict[str, RouteWatch]:
        """Keep a pass, in one transaction: the routes' first and last
        events, each (route, week, slot)'s longest silence (the larger of the
        kept one and this), the events learnt through `through`, and no
        silence kept from weeks before `keep_from_week`. The routes `back`
        that were silent are silent no more: returned, as they were."""
        ...

    async def mark_silent(self, route: str, at: float, usual: float | None, limit: float) -> bool:
        """Say that `route` has been silent since `at`: True, unless it was
        said already (then nothing changes)."""
        ...


class Store(
    Intake,
    Queue,
    Operations,
    Queries,
    Indexing,
    Health,
    Maintenance,
    Streaks,
    Rhythms,
    Protocol,
):
    """A whole backend: every role, opened and closed. Only the code that opens
    a store (relay.app, the CLI's `opened_store`) holds one of these; every
    other part takes the role it uses."""

    async def open(self) -> None: ...

    async def close(self) -> None: ...


class AlertNotes(Protocol):
    """Alerts on a shared store (relay.alerts): each instance notes what its
    attempts saw, the leading one groups every instance's notes into one alert."""

    async def note_alerts(self, notes: Sequence[bytes], now: float) -> None:
        """Keep what an alert must say until the leading instance sends it."""
        ...

    async def alert_notes(self) -> list[AlertNote]:
        """Every note not sent yet, oldest first."""
        ...

    async def send_alert(
        self,
        notes: Collection[int],
        event: NewEvent | None,
        deliveries: Sequence[NewDelivery],
        now: float,
    ) -> Accepted | None:
        """In one transaction, take these notes away and store the alert event
        that says them (no event: the notes are only dropped). None, and
        nothing changed, when any of them is gone already (another instance
        that thought it led has sent them)."""
        ...


@runtime_checkable
class Shared(AlertNotes, Protocol):
    """A store that several relay instances share (PostgreSQL): what only such
    a store does. The app asks `isinstance(store, Shared)` instead of naming a
    backend, so a single-process store needs none of it (nor its driver)."""

    # This instance's name in the cluster: the owner of its leases.
    instance_id: str

    def reconfigure(self, config: Config) -> None:
        """Targets' concurrency and rates of this config, as cluster totals."""
        ...

    async def lead(self) -> bool:
        """Whether this instance runs the singletons (retention, alert grouping,
        gauges, the search index) now; takes the lead when it is free. One
        caller at a time, in `relay serve` only: StoreError when another
        running instance has this instance's id."""
        ...

    async def listen(self, callback: Callable[[str], None]) -> None:
        """Call `callback` with every wake-up any instance sends, until cancelled."""
        ...

    async def instances(self) -> list[InstanceState]:
        """The instances alive, holding leases, or seen within the last day, by id."""
        ...
