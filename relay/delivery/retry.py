"""The retry policy as pure functions: an outcome in, a decision out.

Nothing here reads a clock or a database; `now` and the random source are
passed in, so a schedule is a table in a test.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from relay.config import RetryPolicy
from relay.core.outcome import Outcome, Verdict
from relay.core.status import Next, Status
from relay.core.units import count, format_duration

# A Retry-After larger than this is not honoured in full unless the policy
# sets its own max_delay: a target must not park a delivery for days.
DEFAULT_RETRY_AFTER_CAP = 3600.0


@dataclass(frozen=True)
class Decision:
    next: Next
    at: float | None = None  # when the next attempt is due, for Status.PENDING
    reason: str | None = None
    # This attempt was a step of the retry cycle: the store adds it to the
    # cycle's count. A person's extra try and a down target's probe are not.
    in_cycle: bool = True


def delay_before_retry(policy: RetryPolicy, retry: int, rng: random.Random | None = None) -> float:
    """Seconds between the failed attempt and retry number `retry` (1-based)."""
    if policy.backoff == "list":
        delay = policy.delays[min(retry, len(policy.delays)) - 1]
    else:
        delay = policy.unit * policy.base**retry
    if policy.max_delay is not None:
        delay = min(delay, policy.max_delay)
    if policy.jitter and rng is not None:
        delay *= 1 + rng.uniform(-policy.jitter, policy.jitter)
    return delay


def schedule(policy: RetryPolicy) -> list[float]:
    """Every delay of a full cycle, without jitter."""
    return [delay_before_retry(policy, n) for n in range(1, policy.retries + 1)]


def cycle_length(policy: RetryPolicy) -> int:
    """The attempts a full cycle makes: the first and every retry (the first
    alone when retries are off). What "attempt 3/16" counts to."""
    return 1 + (policy.retries if policy.retry_on_error else 0)


def probe_delay(policy: RetryPolicy, probe: int, rng: random.Random | None = None) -> float:
    """Seconds before probe number `probe` (1-based) of a down target: going
    down schedules probe 1, probe k failing schedules probe k + 1. Probes
    follow the target's own backoff; past its last retry the last delay
    repeats, for as long as the outage lasts (a policy of no retries probes
    at its first retry's delay)."""
    step = min(probe, max(policy.retries, 1))
    if policy.backoff == "list":
        step = min(step, len(policy.delays))
    return delay_before_retry(policy, step, rng)


def decide_probe(
    decision: Decision, outcome: Outcome, *, next_probe_at: float, manual: bool
) -> Decision | None:
    """What follows a down target's probe, when the probe rule replaces
    `decision` (the policy's): a probe that failed for a reason worth retrying
    spends nobody's retry, its own included; the delivery waits, outside its
    cycle, for the next probe at `next_probe_at`. None: the policy's decision
    stands (the probe succeeded or failed for good, or it was a person's
    retry now, which keeps its own rule: it changes nothing)."""
    if manual or outcome.verdict is not Verdict.RETRY:
        return None
    return Decision(Status.PENDING, at=next_probe_at, reason=decision.reason, in_cycle=False)


def decide(
    policy: RetryPolicy,
    outcome: Outcome,
    *,
    attempts_in_cycle: int,
    now: float,
    rng: random.Random | None = None,
) -> Decision:
    """What follows an attempt; `attempts_in_cycle` counts it (1 for the first try)."""
    if outcome.verdict is Verdict.SUCCESS:
        return Decision(Status.DELIVERED)
    error = outcome.error or "failed"
    if outcome.verdict is Verdict.FAIL:
        return Decision(Status.DEAD, reason=error)
    if not policy.retry_on_error:
        return Decision(Status.DEAD, reason=f"{error} (retries are off for this target)")
    retry = attempts_in_cycle
    if retry > policy.retries:
        gave_up = f"gave up after {count(attempts_in_cycle, 'attempt')}"
        return Decision(Status.DEAD, reason=f"{error} ({gave_up})")
    delay = delay_before_retry(policy, retry, rng)
    asked = receiver_wait(policy, outcome)
    if asked is not None:
        delay = max(delay, asked)
    return Decision(Status.PENDING, at=now + delay, reason=error)


def receiver_wait(policy: RetryPolicy, outcome: Outcome) -> float | None:
    """How long the receiver asked relay to wait (Retry-After, Telegram's
    retry_after), capped like a retry's delay; None when it asked nothing."""
    if outcome.verdict is not Verdict.RETRY or outcome.retry_after is None:
        return None
    cap = policy.max_delay if policy.max_delay is not None else DEFAULT_RETRY_AFTER_CAP
    return max(0.0, min(outcome.retry_after, cap))


@dataclass(frozen=True)
class ManualRetry:
    """An attempt a person asked for (`relay retry`, the API's retry): where the
    delivery was, so that failing it changes nothing."""

    was_dead: bool
    # Its next scheduled attempt when it was pending (None: it was dead).
    resume_at: float | None = None


def decide_attempt(
    policy: RetryPolicy,
    outcome: Outcome,
    *,
    attempts: int,
    attempts_in_cycle: int,
    now: float,
    manual: ManualRetry | None = None,
    rng: random.Random | None = None,
) -> Decision:
    """What follows an attempt of a delivery that had made `attempts` in all and
    `attempts_in_cycle` in its cycle before this one.

    The manual-retry rule: a manual attempt keeps the counter (it is not one of
    the schedule's retries), and when it fails the delivery returns to where it
    was: dead stays dead, pending keeps its place in the schedule."""
    in_cycle = attempts_in_cycle + (0 if manual else 1)
    decision = decide(policy, outcome, attempts_in_cycle=in_cycle, now=now, rng=rng)
    if manual is None:
        return decision
    if outcome.verdict is not Verdict.RETRY:
        return replace(decision, in_cycle=False)
    if manual.was_dead:
        # Counted in all (this one included), not the cycle's: the cycle's
        # count would say one attempt fewer than were made.
        reason = f"{outcome.error or 'failed'} (still dead after a manual retry;"
        return Decision(
            Status.DEAD, reason=f"{reason} {count(attempts + 1, 'attempt')} in all)", in_cycle=False
        )
    at = manual.resume_at if manual.resume_at is not None else decision.at
    return Decision(Status.PENDING, at=at, reason=decision.reason, in_cycle=False)


def describe_schedule(policy: RetryPolicy) -> str:
    if not policy.retry_on_error or policy.retries == 0:
        return "no retries: the first failure is final"
    delays = schedule(policy)
    if len(delays) == 1:
        span = format_duration(delays[0])
    else:
        span = f"{format_duration(delays[0])} … {format_duration(delays[-1])}"
    extras = [f"timeout {format_duration(policy.timeout)}"]
    if policy.jitter:
        extras.append(f"jitter ±{policy.jitter * 100:g}%")
    return (
        f"{policy.retries} retries, {span}, cycle {format_duration(sum(delays))}"
        f" ({', '.join(extras)})\n"
        f"      delays: {' '.join(format_duration(d) for d in delays)}"
    )
