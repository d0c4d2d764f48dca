"""The scheduler: lease what is due, send it, record the attempt with the step that follows it.

It sleeps until the next due time, a wake-up (new event, finished attempt) or
the poll interval, whichever comes first; the poll picks up changes made by
other processes (the CLI). Time comes from an injected `Clock`, so tests can
run a whole retry cycle without waiting for it (`drain`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from relay.config import Config
from relay.core.clock import Clock
from relay.core.outage_log import OutageLog
from relay.core.outcome import RESPONSE_EXCERPT_BYTES, Outcome
from relay.core.payload import Payload, strip_form_fields
from relay.core.records import next_status
from relay.core.secrets import Masker
from relay.core.status import attempt_outcome
from relay.core.units import count, format_duration
from relay.delivery.kept import kept
from relay.delivery.ratelimit import Pacer
from relay.delivery.retry import cycle_length
from relay.delivery.step import Attempted, Rules, first_hold, step
from relay.kinds.target import Envelope, Target
from relay.store import (
    AttemptKind,
    AttemptRecord,
    ClaimedDelivery,
    Decide,
    DownState,
    FailureStreak,
    Queue,
    Step,
    StoreError,
    Transition,
)

log = logging.getLogger("relay.scheduler")

# A lease outlives the attempt it covers by this much: if it expires, the
# attempt's process is gone and another may claim the delivery.
LEASE_MARGIN = 60.0


@dataclass
class _Lane:
    """One target's room to send: attempts in flight against its concurrency,
    the pacers (its own rate, a rate shared with other targets), and a
    receiver's hold (relay.delivery.step, rule 4)."""

    concurrency: int
    own: Pacer | None = None
    shared: list[Pacer] = field(default_factory=list)
    # The shared pacers a receiver's wait holds besides the target (a rate
    # group's: one portal; Telegram's chat, not its bot: relay.targets.telegram).
    held_by_a_wait: list[Pacer] = field(default_factory=list)
    in_flight: int = 0
    held_until: float = 0.0  # nothing of the target is claimed before
    # Held by a throttle: when the hold ends one request goes alone, until
    # an answer other than a throttle ends the episode.
    probing: bool = False

    @property
    def pacers(self) -> list[Pacer]:
        return [*self.shared, self.own] if self.own is not None else self.shared

    @property
    def free(self) -> int:
        return self.concurrency - self.in_flight

    def allowed(self, now: float) -> int:
        if now < self.held_until:
            return 0
        free = (1 if self.in_flight == 0 else 0) if self.probing else self.free
        return min([free, *(pacer.available(now) for pacer in self.pacers)])

    def take(self, count: int, now: float) -> None:
        for pacer in self.pacers:
            pacer.take(count, now)

    def ready_at(self, now: float) -> float:
        return max([now, self.held_until, *(pacer.ready_at(now) for pacer in self.pacers)])

    def hold(self, until: float, *, throttle: bool = False) -> None:
        """The receiver asked to be left alone until `until`: the target, and
        the shared paces its wait holds; after a throttle, one at a time."""
        self.held_until = max(self.held_until, until)
        self.probing = self.probing or throttle
        for pacer in self.held_by_a_wait:
            pacer.hold(until)


@dataclass(frozen=True)
class AttemptReport:
    """One finished attempt, for logs and metrics."""

    delivery: ClaimedDelivery
    number: int  # of all the delivery's attempts, this one included
    kind: AttemptKind
    # Its step in the current retry cycle (None for a manual retry or a
    # probe, which are none), of the cycle's `cycle_length`: a count a person
    # can read, never "5/4" after a manual retry or "6/9" after a requeue.
    cycle_step: int | None
    cycle_length: int
    outcome: Outcome
    then: Transition  # where the attempt left the delivery
    duration: float
    streak: FailureStreak  # the target's failed attempts in a row, before and after
    # The target's answer as kept (the first 2 KiB, secrets masked): alerts quote it.
    answer: bytes = b""

    @property
    def said(self) -> str:
        """The attempt's outcome in the one vocabulary of logs and metrics."""
        return attempt_outcome(self.outcome.verdict, next_status(self.then))


@dataclass
class _State:
    config: Config
    targets: Mapping[str, Target]
    lanes: dict[str, _Lane] = field(default_factory=dict)
    # How long a claim holds a delivery: the longest attempt this config allows,
    # plus the margin. Fixed per config, so worked out once, not per claim.
    lease: float = field(init=False)

    def __post_init__(self) -> None:
        config = self.config
        timeouts = [t.retry.timeout for t in config.targets.values()]
        timeouts += [rt.retry.timeout for route in config.routes.values() for rt in route.targets]
        self.lease = max(timeouts, default=0.0) + LEASE_MARGIN


class Scheduler:
    def __init__(
        self,
        store: Queue,
        config: Config,
        targets: Mapping[str, Target],
        clock: Clock,
        *,
        masker: Masker | None = None,
        rng: random.Random | None = None,
        poll_interval: float = 1.0,
        batch_size: int = 100,
        on_attempt: Callable[[AttemptReport], None] | None = None,
    ) -> None:
        self._store = store
        self._clock = clock
        self._masker = masker or config.masker
        self._rng = rng or random.Random()
        self._poll_interval = poll_interval
        self._batch_size = batch_size
        self._on_attempt = on_attempt
        self._state = _State(config, targets)
        self._shared_pacers: dict[str, Pacer] = {}
        self._sync_lanes()
        self._wake = asyncio.Event()
        self._stopping = False
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._dispatching = asyncio.Lock()
        self._task_targets: dict[asyncio.Task[None], Target] = {}
        self._paused: frozenset[str] = frozenset()
        self._down: dict[str, DownState] = {}
        self._paused_read_at: float | None = None
        self._store_failing = OutageLog()  # the store not answering its reads
        self._records_failing = OutageLog()  # nor taking the records of attempts made
        self._running = False
        self.last_tick: float | None = None
        self._ticked = time.monotonic()

    # Control

    def wake(self) -> None:
        """Something may be due now (a new event, a retry asked for)."""
        self._wake.set()

    def arrived(self, route: str) -> None:
        """A webhook was stored on this route (called for each): wake, unless
        none of the route's targets has room for another attempt. An attempt
        that ends wakes the loop, which then claims what arrived meanwhile: a
        target that hangs costs ingest nothing."""
        if self._wake.is_set():
            return
        state = self._state
        config = state.config.routes.get(route)
        if config is None or any(
            (lane := state.lanes.get(target.target)) is None or lane.free > 0
            for target in config.targets
        ):
            self._wake.set()

    def targets_changed(self) -> None:
        """A target was paused or resumed in this process: re-read at once."""
        self._paused_read_at = None
        self._wake.set()

    @property
    def paused(self) -> frozenset[str]:
        return self._paused

    @property
    def down(self) -> Mapping[str, DownState]:
        """hold_when_down targets that are down now (as last read or learnt)."""
        targets = self._state.config.targets
        return {
            name: state
            for name, state in self._down.items()
            if name in targets and targets[name].hold_when_down
        }

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    @property
    def running(self) -> bool:
        return self._running and not self._stopping

    async def run(self) -> None:
        """Run until `stop()`; never gives up on store errors, it waits and tries again."""
        self._running = True
        try:
            await self._loop()
        finally:
            self._running = False

    async def _loop(self) -> None:
        woken = True  # the first turn claims at once
        due: float | None = None
        while not self._stopping:
            now = self._clock.now()
            self.last_tick = now
            self._ticked = time.monotonic()
            until = now + self._poll_interval
            try:
                await self._refresh_paused(now)
                if not woken and (due is None or due > now):
                    # A poll with nothing known due: look (a read) before
                    # claiming (a write transaction), so an idle relay reads
                    # once a second and writes nothing.
                    due = await self._look_first(now)
                started = 0
                if woken or (due is not None and due <= now):
                    started = await self._dispatch(now)
                    due = await self._next_wake(now)
            except StoreError as error:
                self._store_failed(now, error)
                started, due = 0, None
            else:
                self._store_answered(now)
            if due is not None and (due > now or started):
                until = min(until, due)
            await self._clock.wait(self._wake, until)
            woken = self._wake.is_set()
            self._wake.clear()

    async def _look_first(self, now: float) -> float | None:
        """The next due time, read; `now` when the store cannot foresee its claims."""
        if not self._store.next_due_foresees_claims:
            return now
        return await self._next_wake(now)

    async def run_once(self) -> int:
        """Start every attempt that is due now; returns how many were started."""
        self._paused_read_at = None
        await self._refresh_paused(self._clock.now())
        return await self._dispatch(self._clock.now())

    async def step(self) -> int:
        """One turn of `run`'s loop at the clock's now: the held targets re-read
        only once the poll interval has passed, then what is due started.
        For tests that drive several schedulers (instances of one cluster)
        turn by turn, as their loops interleave; returns how many started."""
        now = self._clock.now()
        await self._refresh_paused(now)
        return await self._dispatch(now)

    async def wait_idle(self) -> None:
        """Wait until every attempt started so far has been recorded."""
        while self._tasks:
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    async def drain(self) -> None:
        """Deliver until nothing is due or in flight, jumping the clock between due times.

        For tests: with a FakeClock a whole retry cycle passes at once; with
        the system clock it waits in real time (use a short schedule).
        """
        while True:
            self._paused_read_at = None
            await self._refresh_paused(self._clock.now())
            await self._dispatch(self._clock.now())
            if self._tasks:
                await self._wake.wait()
                self._wake.clear()
                continue
            due = await self._next_wake(self._clock.now())
            if due is None:
                return
            await self._clock.wait(self._wake, due)
            self._wake.clear()

    async def stop(self, grace: float) -> None:
        """Stop claiming; let attempts in flight finish for `grace` seconds, then
        cancel the rest and give their leases back without counting an attempt."""
        self._stopping = True
        self._wake.set()
        async with self._dispatching:
            tasks = dict(self._tasks)
        if tasks:
            await asyncio.wait(tasks.values(), timeout=grace)
        unfinished = {did: task for did, task in tasks.items() if not task.done()}
        for task in unfinished.values():
            task.cancel()
        if unfinished:
            await asyncio.gather(*unfinished.values(), return_exceptions=True)
            try:
                await self._store.release(unfinished.keys(), self._clock.now())
            except StoreError as error:
                log.warning("could not release %d leases: %s", len(unfinished), error)

    def alive(self, within: float) -> bool:
        """Running, and ticked within the last `within` seconds (for the watchdog)."""
        return self.running and time.monotonic() - self._ticked < within

    def reconfigure(self, config: Config, targets: Mapping[str, Target]) -> None:
        """Switch to a new config; attempts in flight finish on the one they started with."""
        self._state = _State(config, targets, self._state.lanes)
        self._masker = config.masker
        self._sync_lanes()
        self._wake.set()

    async def until_unused(self, target: Target) -> None:
        """Wait until no attempt in flight is using this target object."""
        while True:
            using = [task for task, used in self._task_targets.items() if used is target]
            if not using:
                return
            await asyncio.gather(*using, return_exceptions=True)

    # Internals

    def _sync_lanes(self) -> None:
        state = self._state
        now = self._clock.now()
        for name, target in state.config.targets.items():
            lane = state.lanes.setdefault(name, _Lane(target.concurrency))
            lane.concurrency = target.concurrency
            if target.rate is None:
                lane.own = None
            elif lane.own is None or lane.own.rate != target.rate:
                lane.own = Pacer(target.rate, now)
            lane.shared = []
            lane.held_by_a_wait = []
            for group, rate in target.shared_rates:
                shared = self._shared_pacers.get(group)
                if shared is None or shared.rate != rate:
                    shared = self._shared_pacers[group] = Pacer(rate, now)
                lane.shared.append(shared)
                if target.held_by_a_wait is None or group in target.held_by_a_wait:
                    lane.held_by_a_wait.append(shared)

    def _store_failed(self, now: float, error: StoreError) -> None:
        if self._store_failing.failed(now):
            log.warning("scheduler cannot read the store: %s", error)

    def _store_answered(self, now: float) -> None:
        lasted = self._store_failing.ended(now)
        if lasted is not None:
            log.warning("scheduler reads the store again, after %s", format_duration(lasted))

    async def _refresh_paused(self, now: float) -> None:
        # Pause state lives in the store (the CLI may change it): read it at
        # the poll interval, not on every wake-up.
        last = self._paused_read_at
        if last is None or now - last >= self._poll_interval or now < last:
            # Down state lives there too: a restart, or another process, sees it.
            held = await self._store.held_targets()
            self._paused, self._down = held.paused, held.down
            # Held by a receiver (another process may have recorded it; a
            # restart keeps it).
            for name, until in held.throttled.items():
                lane = self._state.lanes.get(name)
                if lane is not None:
                    lane.hold(until, throttle=True)
            self._paused_read_at = now

    def _eligible(self) -> dict[str, _Lane]:
        """Targets that may send now but for their pace: configured, unpaused, with
        room; a down target only when nothing of it is in flight (its one probe)."""
        state = self._state
        down = self.down
        return {
            name: lane
            for name, lane in state.lanes.items()
            if name in state.targets
            and lane.free > 0
            and name not in self._paused
            and (name not in down or lane.in_flight == 0)
        }

    async def _claimable(self, now: float) -> dict[str, int]:
        down = self.down
        limits = {}
        for name, lane in self._eligible().items():
            if name in down:
                # One probe, when its time has come: the oldest due delivery.
                limits[name] = min(lane.allowed(now), 1) if now >= down[name].due else 0
            else:
                limits[name] = min(lane.allowed(now), self._batch_size)
        limits = {name: limit for name, limit in limits.items() if limit > 0}
        return await self._share_pacers(limits, now)

    async def _share_pacers(self, limits: dict[str, int], now: float) -> dict[str, int]:
        """Targets sharing a pacer (one bot, one chat, one portal) each see it
        free, but it lets one send go per turn: that send goes to the target
        whose delivery has waited longest."""
        lanes = self._state.lanes
        sharing: dict[int, list[str]] = {}
        for name in limits:
            for pacer in lanes[name].shared:
                sharing.setdefault(id(pacer), []).append(name)
        contested = {name for names in sharing.values() if len(names) > 1 for name in names}
        if not contested:
            return limits
        due = await self._store.next_due(sorted(contested))
        promised: set[int] = set()
        for name in sorted(contested, key=lambda name: (due.get(name, math.inf), name)):
            pacers = {id(pacer) for pacer in lanes[name].shared}
            if due.get(name, math.inf) > now or pacers & promised:
                del limits[name]
            else:
                promised |= pacers
        return limits

    async def _next_wake(self, now: float) -> float | None:
        """When something can next be sent: its due time, or later if its pace
        (or, for a down target, its next probe) says so."""
        lanes = self._eligible()
        down = self.down
        due = await self._store.next_due(list(lanes))
        times = [
            max(at, lanes[name].ready_at(now), down[name].due if name in down else at)
            for name, at in due.items()
        ]
        return min(times, default=None)

    async def _dispatch(self, now: float) -> int:
        # stop() waits for a dispatch under way: once it returns, no attempt
        # starts (the store closes next, and would lose its record).
        async with self._dispatching:
            return await self._dispatch_now(now)

    async def _dispatch_now(self, now: float) -> int:
        if self._stopping:
            return 0
        limits = await self._claimable(now)
        if not limits:
            return 0
        claimed = await self._store.claim_due(
            now,
            now + self._state.lease,
            limits,
            exclude=list(self._tasks),
            probes=[name for name in limits if name in self.down],
        )
        if self._stopping:
            # Stop began during the claim: sending now would start requests
            # after SIGTERM; the leases go back for the next process.
            if claimed:
                await self._store.release([d.id for d in claimed], now)
            return 0
        # Read after the claim: a reload may have swapped the targets meanwhile.
        state = self._state
        down = self.down
        for delivery in claimed:
            target = state.targets.get(delivery.target)
            if target is None:  # reconfigured away while we were claiming
                await self._store.release([delivery.id], now)
                continue
            lane = state.lanes[delivery.target]
            lane.in_flight += 1
            lane.take(1, now)
            probe = self._probe(delivery, down)
            task = asyncio.create_task(
                self._attempt(delivery, target, state, probe), name=f"relay-attempt-{delivery.id}"
            )
            self._tasks[delivery.id] = task
            self._task_targets[task] = target
            task.add_done_callback(self._task_targets.pop)
        return len(claimed)

    def _probe(self, delivery: ClaimedDelivery, down: Mapping[str, DownState]) -> DownState | None:
        """The down state when this claimed delivery is its target's probe.
        A store shared by several processes says so itself: another instance
        may have made the target down, or up, since this one last read it,
        and a probe taken for an ordinary attempt would spend a retry."""
        if not self._store.claims_probes:
            return down.get(delivery.target)
        if delivery.probe is not None:
            self._down[delivery.target] = delivery.probe
        else:
            self._down.pop(delivery.target, None)
        return delivery.probe

    def _rules(self, state: _State, delivery: ClaimedDelivery) -> Rules:
        """What the config says of what follows an attempt of this delivery."""
        route = state.config.routes.get(delivery.route)
        policy = route.policy_for(delivery.target) if route is not None else None
        target = state.config.targets.get(delivery.target)
        if policy is None:
            policy = target.retry if target is not None else state.config.retry
        return Rules(
            policy,
            down_after=target.down_after if target is not None and target.hold_when_down else None,
        )

    async def _attempt(
        self,
        delivery: ClaimedDelivery,
        target: Target,
        state: _State,
        probe: DownState | None = None,
    ) -> None:
        """One attempt; `probe` is the down state when this is a down target's probe."""
        try:
            rules = self._rules(state, delivery)
            number = delivery.attempts + 1
            started_at = self._clock.now()
            began = time.perf_counter()
            lane = state.lanes.get(delivery.target)
            envelope = _envelope(delivery, number, started_at, state)
            outcome = await self._send(
                target, envelope, rules.policy.timeout, lane.pacers if lane is not None else []
            )
            duration = time.perf_counter() - began
            now = self._clock.now()
            outcome = replace(outcome, error=self._masker.optional(outcome.error))
            attempted = Attempted(
                delivery,
                outcome,
                now,
                probe=probe is not None,
                draw=self._rng.uniform(-1, 1),
                started=started_at,
            )
            hold = first_hold(rules.policy, outcome)
            if hold is not None and lane is not None:
                # Held at once, before the store says for how long (rule 4):
                # nothing more is claimed meanwhile to meet the same limit.
                lane.hold(now + hold, throttle=outcome.throttle)
            elif lane is not None and outcome.target_at_fault:
                lane.probing = False  # any other answer ends a throttle's episode
            attempt = AttemptRecord(
                number=number,
                started_at=started_at,
                duration=duration,
                outcome=outcome.verdict.value,
                http_status=outcome.status,
                error=outcome.error,
                response=self._masker.data(outcome.response[:RESPONSE_EXCERPT_BYTES]),
                request=kept(outcome.request, self._masker) if outcome.request else None,
                target_at_fault=outcome.target_at_fault,
                kind=attempted.kind,
            )
            decide: Decide = functools.partial(step, rules, attempted)
            done = await self._record(delivery, attempt, decide, now)
            if done is None:
                return
            self._learn(delivery.target, done, now)
            held_until = done.target.get("throttled_until")
            if held_until is not None and lane is not None:
                lane.hold(held_until)
            if self._on_attempt is not None:
                self._on_attempt(
                    AttemptReport(
                        delivery=delivery,
                        number=number,
                        kind=attempt.kind,
                        cycle_step=delivery.attempts_in_cycle + 1 if done.in_cycle else None,
                        cycle_length=cycle_length(rules.policy),
                        outcome=outcome,
                        then=done.then,
                        duration=duration,
                        streak=done.streak,
                        answer=attempt.response,
                    )
                )
        finally:
            lane = state.lanes.get(delivery.target)
            if lane is not None:
                lane.in_flight -= 1
            self._tasks.pop(delivery.id, None)
            self._wake.set()

    def _learn(self, target: str, done: Step, now: float) -> None:
        """Keep the cached down state in step with what the store just recorded."""
        streak, probe_at = done.streak, done.target.get("probe_at")
        if streak.came_up:
            self._down.pop(target, None)
            log.warning(
                "target %s is up again; %s waited",
                target,
                count(streak.waited, "delivery", "deliveries"),
            )
        elif streak.went_down and probe_at is not None:
            self._down[target] = DownState(now, probe_at, 0, probed_at=now)
            log.warning("target %s is down: its deliveries wait, probing it", target)
        elif probe_at is not None and target in self._down:
            # What arrived before this probe is no fresh evidence any more.
            previous = self._down[target]
            self._down[target] = DownState(
                previous.since, probe_at, previous.probes + 1, probed_at=now
            )
        elif streak.down and target not in self._down:
            # Made down by another process's attempt: read its state at the
            # next turn rather than a poll later.
            self._paused_read_at = None

    async def _send(
        self, target: Target, envelope: Envelope, time_limit: float, pacers: list[Pacer]
    ) -> Outcome:
        """`target.send` for at most `time_limit` seconds, not counting a paced
        target's wait for its turn (Envelope.paced)."""
        loop = asyncio.get_running_loop()
        # The status in hand, a body still coming is not waited for to the
        # limit: a tenth of it (at most a second) is left for the target to
        # return what it has (a 200 whose body stalls was delivered).
        grace = min(time_limit / 10, 1.0)
        answer_by = [loop.time() + time_limit - grace]
        try:
            async with asyncio.timeout(time_limit) as limit:
                if pacers:

                    async def paced() -> None:
                        await self._turn(pacers)
                        # The time limit is the request's: its turn is not part of it.
                        limit.reschedule(loop.time() + time_limit)
                        answer_by[0] = loop.time() + time_limit - grace

                    envelope = replace(envelope, paced=paced)
                envelope = replace(envelope, answer_by=lambda: answer_by[0])
                return await target.send(envelope)
        except TimeoutError:
            return Outcome.retry(f"timeout after {time_limit:g}s")
        except Exception as error:
            # A bug in one target must not stop the scheduler; the delivery is
            # kept and retried like any other failure.
            log.exception("target %s raised while sending", target.name)
            return Outcome.retry(f"internal error: {type(error).__name__}")

    async def _turn(self, pacers: list[Pacer]) -> None:
        """Wait until this request may be written, then say it was: spaced from
        when the previous one of each pace really went out, not from when it
        was claimed (a slow template or a new connection delays a send after
        its claim; the next one must not follow it too soon). The claim's pace
        already spaced them, so this waits at most what the previous one was
        late by. Check and record run without a pause between them: of two
        requests waiting, one goes and the other waits a full interval."""
        while True:
            now = self._clock.now()
            ready = max(pacer.send_at(now) for pacer in pacers)
            if ready <= now:
                for pacer in pacers:
                    pacer.sent(now)
                return
            await self._clock.wait(asyncio.Event(), ready)

    async def _record(
        self, delivery: ClaimedDelivery, attempt: AttemptRecord, decide: Decide, now: float
    ) -> Step | None:
        # The attempt happened; losing its record would resend it after the
        # lease expires. Keep trying while the store is unavailable.
        delay = 0.05
        while True:
            try:
                done = await self._store.record_attempt(delivery, attempt, decide, now)
            except StoreError as error:
                if self._stopping:
                    log.warning("attempt of delivery %d not recorded: %s", delivery.id, error)
                    return None
                # One line for every attempt under way when the store went
                # away, not one each: the outage has its own lines.
                if self._records_failing.failed(self._clock.now()):
                    log.warning("attempts made wait to be recorded: %s", error)
                log.debug("cannot record attempt of delivery %d yet: %s", delivery.id, error)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            self._records_failing.ended(self._clock.now())
            return done


def _envelope(delivery: ClaimedDelivery, number: int, now: float, state: _State) -> Envelope:
    route = state.config.routes.get(delivery.route)
    strip = route.strip_fields if route is not None else ()
    forwarded = _forwarded(delivery.payload, strip)
    if forwarded is not delivery.payload:
        delivery = replace(delivery, payload=forwarded)
    return Envelope(delivery=delivery, attempt=number, sent_at=now)


def _forwarded(payload: Payload, strip: tuple[str, ...]) -> Payload:
    """The payload as targets get it: the route's `strip_fields` left out of a form."""
    body = strip_form_fields(payload.content_type, payload.body, strip)
    return payload if body is payload.body else replace(payload, body=body)
