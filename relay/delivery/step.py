"""What follows one attempt: one pure function, one value.

    step(rules, attempted, health, history) -> Step

`rules` is what the config says (the retry policy, hold_when_down, whether
the target is paced), `attempted` what happened (the delivery as it was
claimed, the target's outcome, what kind of attempt it was, when), `health`
the target's row as the store holds it, read locked in the transaction that
records the attempt, and `history` the delivery's own memory of failing.
The store calls it with what it has locked and writes the `Step` it returns;
the scheduler sends, holds its pacers and reports
(procrastinate: `RetryStrategy.get_retry_decision` under
`worker._persist_job_status`). Nothing here reads a clock, a database or a
random source: the jitter is drawn by the caller (`Attempted.draw`).

The rules, in the order they apply:

1. **The cycle.** A success is delivered; a failure no retry can help is
   dead; one worth retrying is pending again after the policy's delay (at
   least what the receiver asked for: Retry-After, Telegram's retry_after),
   or dead once the cycle's retries are spent or retries are off.
2. **A person's retry now** is one more try outside the cycle: a success
   delivers; a failure returns the delivery to where it was (dead stays
   dead, pending keeps its next time).
3. **A down target's probe** (hold_when_down) that failed for a reason worth
   retrying spends no retry, its own included: the delivery waits, at the
   back of the line, for the next probe. Probes follow the target's
   backoff, except that a delivery that arrived since the last probe is
   fresh evidence: it is the next probe, within FRESH_PROBE_GAP
   (relay.core.records.DownState.due), and if it fails the backoff starts
   again from its first step. A quiet target made down by one payload it
   always refuses is thus asked again by the next webhook, not hours later;
   when that one goes through, the payload fails alone (rule 5).
4. **A receiver's throttle** (a 429, or a status the target declares
   temporary: amoCRM answers 403 while it blocks an address) is about the
   sender, not this message: the whole target is held, nothing of it
   claimed (by any instance), for the receiver's Retry-After, else for a
   backoff that grows with each throttle answer to a request sent after the
   last hold ended (the policy's 2^n delays, capped). When the hold ends
   one request goes alone; any other answer ends the episode, and the
   target goes at its own pace again. A throttle spends no retry, the
   delivery that met it included: that one waits first in line, by
   arrival. A throttle answer says the target is up (never "down"). Any
   other failure that asked for a wait (a 503 with Retry-After) holds the
   target as long, and is an ordinary retry. A delivery that fails alone
   (rule 5) is an ordinary retry too: its payload, not the pace, is what
   the receiver refuses.
5. **The target's health**: failures in a row, and for hold_when_down the
   "down" answers in a row (a retry outcome but a throttle: network,
   timeout, 5xx);
   the `down_after`-th makes it down, any answer about the payload brings it
   up. A delivery that fails again after its target delivered others since
   its last failure *fails alone*: its payload, not the target, is the
   trouble, and it never makes the target down.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from relay.config import RetryPolicy
from relay.core.outcome import Outcome, Verdict
from relay.core.records import (
    AttemptKind,
    ClaimedDelivery,
    Dead,
    Delivered,
    FailureStreak,
    History,
    RetryAt,
    Step,
    TargetHealth,
    Transition,
    Waits,
)
from relay.core.status import Status
from relay.core.units import count
from relay.delivery.retry import delay_before_retry, probe_delay

# A Retry-After larger than this is not honoured in full unless the policy
# sets its own max_delay: a target must not park a delivery for days.
DEFAULT_RETRY_AFTER_CAP = 3600.0
# How far behind a target's last success the time shown may be (one write a
# second, not one a batch: on PostgreSQL each write holds the row locked to
# its commit, which every instance recording that target waits for).
SUCCESS_SHOWN_WITHIN = 1.0


@dataclass(frozen=True)
class Rules:
    """What the config says about what follows an attempt of one delivery."""

    policy: RetryPolicy  # the route-target's, else the target's
    # hold_when_down: this many "down" answers in a row make the target down.
    down_after: int | None = None


@dataclass(frozen=True)
class Attempted:
    """One attempt, as it happened."""

    delivery: ClaimedDelivery  # as claimed: its counts are from before this attempt
    outcome: Outcome  # its error masked
    now: float  # when it ended
    # It was its down target's probe (hold_when_down), a person's retry included.
    probe: bool = False
    # This attempt's jitter, drawn by the caller in [-1, 1]: a retry's delay
    # and a probe's are spread by policy.jitter times it.
    draw: float = 0.0
    # When the attempt began (None: `now`): a throttle answer to a request
    # sent before the target's last hold ended does not grow the hold.
    started: float | None = None

    @property
    def kind(self) -> AttemptKind:
        """A person's retry now is manual even when it is what probes a down target."""
        if self.delivery.manual:
            return AttemptKind.MANUAL
        return AttemptKind.PROBE if self.probe else AttemptKind.CYCLE


def step(rules: Rules, attempted: Attempted, health: TargetHealth, history: History) -> Step:
    """What follows `attempted`, for its delivery and for its target."""
    then, in_cycle = _for_the_delivery(rules.policy, attempted)
    outcome, now = attempted.outcome, attempted.now
    down: Down | None = None
    if rules.down_after is not None:
        probe = attempted.probe
        # Going down schedules probe 1; probe k failing schedules probe k + 1;
        # a fresh delivery's failing starts the backoff again: probe 1.
        fresh = fresh_evidence(attempted.delivery, health)
        number = health.probe_step + 1 if probe and not fresh else 1
        at = now + probe_delay(rules.policy, number, _Draw(attempted.draw))
        down = Down(rules.down_after, at, probe=probe, step=number)
        manual = attempted.delivery.manual  # a person's try keeps its own rule
        if probe and not manual and outcome.verdict is Verdict.RETRY:
            then, in_cycle = Waits(at), False
    hold = receiver_hold(rules.policy, attempted, health, history)
    if hold is not None:
        delivery = attempted.delivery
        if hold.throttle and not delivery.manual and rules.policy.retry_on_error:
            # Rule 4: first in line by arrival when the hold ends, no retry spent.
            then, in_cycle = RetryAt(delivery.received_at, hold_until=hold.until), False
        elif isinstance(then, RetryAt):
            then = RetryAt(then.at, hold_until=hold.until)
    # A probe is no step of the cycle, whatever its outcome.
    in_cycle = in_cycle and attempted.kind is AttemptKind.CYCLE
    return settle(then, attempted, down, health, history, in_cycle=in_cycle, hold=hold)


def _for_the_delivery(policy: RetryPolicy, attempted: Attempted) -> tuple[Transition, bool]:
    """Rules 1 and 2: where the delivery goes, and whether the attempt was a
    step of its cycle."""
    delivery, outcome = attempted.delivery, attempted.outcome
    manual = delivery.manual
    # A person's try is not one of the schedule's: the cycle's count stays.
    tried = delivery.attempts_in_cycle + (0 if manual else 1)
    then = _cycle(policy, outcome, tried, attempted.now, attempted.draw)
    if not manual:
        return then, True
    if outcome.verdict is not Verdict.RETRY or not isinstance(then, RetryAt | Dead):
        return then, False
    if delivery.resume_status is Status.DEAD:
        # Counted in all (this one included), not the cycle's: the cycle's
        # count would say one attempt fewer than were made.
        reason = f"{outcome.error or 'failed'} (still dead after a manual retry;"
        return Dead(f"{reason} {count(delivery.attempts + 1, 'attempt')} in all)"), False
    if delivery.resume_at is not None:
        return RetryAt(delivery.resume_at), False
    return (then if isinstance(then, RetryAt) else RetryAt(attempted.now)), False


def _cycle(
    policy: RetryPolicy, outcome: Outcome, tried: int, now: float, draw: float
) -> Transition:
    """Rule 1; `tried` counts this attempt (1 for the first of the cycle)."""
    if outcome.verdict is Verdict.SUCCESS:
        return Delivered()
    error = outcome.error or "failed"
    if outcome.verdict is Verdict.FAIL:
        return Dead(error)
    if not policy.retry_on_error:
        return Dead(f"{error} (retries are off for this target)")
    if tried > policy.retries:
        return Dead(f"{error} (gave up after {count(tried, 'attempt')})")
    delay = delay_before_retry(policy, tried, _Draw(draw))
    asked = receiver_wait(policy, outcome)
    if asked is not None:
        delay = max(delay, asked)
    return RetryAt(now + delay)


def receiver_wait(policy: RetryPolicy, outcome: Outcome) -> float | None:
    """How long the receiver asked relay to wait (Retry-After, Telegram's
    retry_after), capped like a retry's delay; None when it asked nothing."""
    if outcome.verdict is not Verdict.RETRY or outcome.retry_after is None:
        return None
    cap = policy.max_delay if policy.max_delay is not None else DEFAULT_RETRY_AFTER_CAP
    return max(0.0, min(outcome.retry_after, cap))


@dataclass(frozen=True)
class Hold:
    """Rule 4: the target is held until `until`; `throttle`: by a throttle
    answer, the `throttles`-th of its episode that grew the hold."""

    until: float
    throttles: int
    throttle: bool


def receiver_hold(
    policy: RetryPolicy, attempted: Attempted, health: TargetHealth, history: History
) -> Hold | None:
    """Rule 4: how long the target is held after this attempt, if at all."""
    outcome, now = attempted.outcome, attempted.now
    if outcome.verdict is not Verdict.RETRY:
        return None
    asked = receiver_wait(policy, outcome)
    held = health.throttled_until or 0.0
    if outcome.throttle and not fails_alone(history, health.successes):
        # The requests in flight when a hold began meet the same limit: only
        # the first throttle answer after a hold ended grows the next one.
        started = attempted.now if attempted.started is None else attempted.started
        grows = started >= held
        throttles = health.throttles + 1 if grows else max(health.throttles, 1)
        if asked is None:
            asked = throttle_delay(policy, throttles, _Draw(attempted.draw)) if grows else 0.0
        return Hold(max(held, now + asked), throttles, throttle=True)
    if asked is not None:
        return Hold(max(held, now + asked), 0, throttle=False)
    return None


def first_hold(policy: RetryPolicy, outcome: Outcome) -> float | None:
    """The least a throttle answer or an asked wait holds its target (None:
    this outcome holds nothing): what the scheduler holds at once, before
    the store has the episode's count."""
    asked = receiver_wait(policy, outcome)
    if asked is not None:
        return asked
    return throttle_delay(policy, 1) if outcome.throttle else None


def throttle_delay(policy: RetryPolicy, throttles: int, rng: _Draw | None = None) -> float:
    """The hold after the `throttles`-th throttle answer of an episode that
    gave no Retry-After: the policy's retry delays, capped as a wait asked is."""
    cap = policy.max_delay if policy.max_delay is not None else DEFAULT_RETRY_AFTER_CAP
    return min(delay_before_retry(policy, throttles, rng), cap)


class _Draw:
    """The caller's one draw in [-1, 1], as the random source the schedule's
    arithmetic asks (relay.delivery.retry.Uniform): uniform(-j, j) is j * draw."""

    def __init__(self, draw: float) -> None:
        self._draw = draw

    def uniform(self, a: float, b: float) -> float:
        return a + (b - a) * (self._draw + 1) / 2


@dataclass(frozen=True)
class Down:
    """A hold_when_down target's rule for one attempt: the "down" answers in a
    row that make it down, and when the next probe goes should this attempt
    leave it down (the first probe when it makes the target down, the next
    one when it is a failed probe)."""

    down_after: int
    probe_at: float
    probe: bool = False
    step: int = 1  # the number of the probe at probe_at (its backoff's step)


def fresh_evidence(delivery: ClaimedDelivery, health: TargetHealth) -> bool:
    """Whether a down target's probe by `delivery` is fresh evidence: never
    attempted, it arrived after the target was last probed (or went down).
    The claim picks such a delivery first (relay.store.rows.probe_choice)."""
    probed = health.probed_at
    return delivery.attempts == 0 and (probed is None or delivery.received_at > probed)


def fails_alone(history: History, successes: int) -> bool:
    """Whether a delivery failing now fails alone: it failed before, and its
    target delivered others since (`successes` now, `history.seen_successes`
    at its last failure). Its failures are then about its payload, not the
    target: one poison payload must not make a hold_when_down target down,
    where it would be the probe for ever and never spend a retry. Once alone,
    alone until the delivery is done: after the others it fails by itself,
    with no success in between to tell."""
    seen = history.seen_successes
    return history.fails_alone or (seen is not None and successes > seen)


def settle(
    then: Transition,
    attempted: Attempted,
    down: Down | None,
    health: TargetHealth,
    history: History,
    *,
    in_cycle: bool,
    hold: Hold | None = None,
) -> Step:
    """Rules 4 and 5: the Step of an attempt whose delivery goes on to `then`, with
    what it changes of its target's row (`health`).

    A success after a success, with none of the target's failures between
    (every failure it is at fault for counts), changes nothing the rules read:
    `successes` only has to grow once after each failure, for the deliveries
    that failed (`fails_alone`). Its time is written when the one shown is
    SUCCESS_SHOWN_WITHIN old. Nothing to write, no row to lock."""
    outcome, now = attempted.outcome, attempted.now
    before, down_streak, down_since = (
        health.consecutive_failures,
        health.down_streak,
        health.down_since,
    )
    probes, successes, throttles = health.probes, health.successes, health.throttles
    last_success_at = health.last_success_at

    def made(streak: FailureStreak, columns: dict[str, Any] | None = None, **more: Any) -> Step:
        return Step(then, in_cycle, streak, columns or {}, **more)

    if not outcome.target_at_fault:
        # The event could not be sent as rendered: nothing was learnt about the target.
        return made(FailureStreak(before, before, down=down_since is not None))
    if (
        outcome.verdict is Verdict.SUCCESS
        and before == 0
        and down_streak == 0
        and down_since is None
        and throttles == 0
        and last_success_at is not None
        # Either way: one shown ahead of now (a clock stepped back) is written.
        and abs(now - last_success_at) < SUCCESS_SHOWN_WITHIN
    ):
        return made(FailureStreak(0, 0))
    # A retry outcome (network, timeout, 5xx) says the target may be down;
    # any answer (a success, a 4xx, a throttle) says it is up.
    failed = outcome.verdict is Verdict.RETRY
    down_signal = failed and not outcome.throttle
    remember = None
    alone = False
    if failed:
        alone = fails_alone(history, successes)
        remember = History(successes, alone)
    if not (down_signal and alone):  # a payload failing alone leaves the streak as it is
        down_streak = down_streak + 1 if down_signal else 0
    columns: dict[str, Any]
    if outcome.verdict is Verdict.SUCCESS:
        after = 0
        columns = {
            "last_success_at": now,
            "consecutive_failures": 0,
            "down_streak": 0,
            "successes": successes + 1,
        }
    else:
        after = before + 1
        columns = {
            "last_error_at": now,
            "last_error": outcome.error,
            "consecutive_failures": after,
            "down_streak": down_streak,
        }
        if hold is not None:
            columns["throttled_until"] = hold.until
    # The episode's count: grown by a throttle answer, ended by any other.
    episode = hold.throttles if hold is not None and hold.throttle else 0
    if episode != throttles:
        columns["throttles"] = episode
    delivery_id = attempted.delivery.id
    if down_since is not None and not down_signal:
        columns |= {
            "down_since": None,
            "probe_at": None,
            "probes": 0,
            "probe_delivery": None,
            "probed_at": None,
            "probe_step": 0,
        }
        streak = FailureStreak(before, after, came_up=True, down_for=now - down_since)
        return made(streak, columns, count_waiting=True, remember=remember)
    if down is not None and down_signal:
        if down_since is None and down_streak >= down.down_after and not alone:
            columns |= {
                "down_since": now,
                "probe_at": down.probe_at,
                "probes": 0,
                "probe_delivery": delivery_id,
                "probed_at": now,
                "probe_step": down.step,
            }
            streak = FailureStreak(before, after, went_down=True, down=True)
            return made(streak, columns, remember=remember)
        if down_since is not None and down.probe:
            columns |= {
                "probe_at": down.probe_at,
                "probes": probes + 1,
                "probe_delivery": delivery_id,
                "probed_at": now,
                "probe_step": down.step,
            }
    streak = FailureStreak(before, after, down=down_since is not None)
    return made(streak, columns, remember=remember)
