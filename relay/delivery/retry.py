"""A retry policy's schedule as pure functions: the delay before each retry,
a down target's probes, a whole cycle, and how `relay check` says it.

What follows an attempt (which of these applies) is relay.delivery.step.
Nothing here reads a clock; the random source is passed in.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

from relay.config import RetryPolicy
from relay.core.units import format_duration


class Uniform(Protocol):
    """A random source (random.Random, or one draw: relay.delivery.step)."""

    def uniform(self, a: float, b: float) -> float: ...


def delay_before_retry(policy: RetryPolicy, retry: int, rng: Uniform | None = None) -> float:
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


def probe_delay(policy: RetryPolicy, probe: int, rng: Uniform | None = None) -> float:
    """Seconds before probe number `probe` (1-based) of a down target: going
    down schedules probe 1, probe k failing schedules probe k + 1. Probes
    follow the target's own backoff; past its last retry the last delay
    repeats, for as long as the outage lasts (a policy of no retries probes
    at its first retry's delay)."""
    step = min(probe, max(policy.retries, 1))
    if policy.backoff == "list":
        step = min(step, len(policy.delays))
    return delay_before_retry(policy, step, rng)


def covering(policy: RetryPolicy, seconds: float) -> RetryPolicy:
    """`policy` with as many retries as it takes for its cycle to last
    `seconds`, each delay capped at a day at most (its own max_delay if
    shorter): the schedule `relay check` suggests for a sender that resends
    that long."""
    cap = min(policy.max_delay or DAY, DAY)
    longer = replace(policy, max_delay=cap, retry_on_error=True)
    if longer.backoff == "list":
        longer = replace(longer, delays=tuple(min(d, cap) for d in longer.delays) or (cap,))
    total, retries = 0.0, 0
    while total < seconds:
        retries += 1
        total += delay_before_retry(longer, retries)
    return replace(longer, retries=retries)


DAY = 86400.0


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
