import random

import pytest

from relay.config import RetryPolicy
from relay.core.outcome import Outcome
from relay.delivery.retry import (
    DEFAULT_RETRY_AFTER_CAP,
    Decision,
    ManualRetry,
    Next,
    decide,
    decide_attempt,
    delay_before_retry,
    schedule,
)

DEFAULT = RetryPolicy(jitter=0)


def test_default_schedule_is_two_to_the_n_seconds() -> None:
    delays = schedule(DEFAULT)
    assert delays == [2.0**n for n in range(1, 16)]
    assert delays[-1] == 32768  # ≈ 9.1 h between retry 14 and 15
    assert sum(delays) == 65534  # ≈ 18.2 h for the whole cycle


def test_list_schedule_and_repeating_last_delay() -> None:
    policy = RetryPolicy(backoff="list", delays=(30, 120, 600), retries=5, jitter=0)
    assert schedule(policy) == [30, 120, 600, 600, 600]


def test_max_delay_caps_each_delay() -> None:
    policy = RetryPolicy(max_delay=3600, jitter=0)
    assert max(schedule(policy)) == 3600
    assert schedule(policy)[:11] == [2.0**n for n in range(1, 12)]


def test_jitter_stays_within_its_band() -> None:
    policy = RetryPolicy(jitter=0.1)
    rng = random.Random(7)
    delays = [delay_before_retry(policy, 5, rng) for _ in range(1000)]
    assert all(32 * 0.9 <= d <= 32 * 1.1 for d in delays)
    assert len(set(delays)) > 900  # really spread, not one value


@pytest.mark.parametrize(
    ("outcome", "attempts", "expected", "delay"),
    [
        (Outcome.success(200), 1, Next.DELIVERED, None),
        (Outcome.fail("HTTP 400", 400), 1, Next.DEAD, None),
        (Outcome.retry("HTTP 503", 503), 1, Next.RETRY, 2),
        (Outcome.retry("HTTP 503", 503), 15, Next.RETRY, 32768),
        (Outcome.retry("HTTP 503", 503), 16, Next.DEAD, None),
        (Outcome.retry("HTTP 429", 429, retry_after=120), 1, Next.RETRY, 120),
        (Outcome.retry("HTTP 429", 429, retry_after=1), 3, Next.RETRY, 8),
        (Outcome.retry("HTTP 429", 429, retry_after=10**6), 1, Next.RETRY, DEFAULT_RETRY_AFTER_CAP),
    ],
)
def test_decisions(outcome: Outcome, attempts: int, expected: Next, delay: float | None) -> None:
    decision = decide(DEFAULT, outcome, attempts_in_cycle=attempts, now=1000.0)
    assert decision.next is expected
    if delay is not None:
        assert decision.at == 1000.0 + delay


def test_retry_after_is_capped_by_max_delay() -> None:
    policy = RetryPolicy(jitter=0, max_delay=60)
    decision = decide(policy, Outcome.retry("429", retry_after=600), attempts_in_cycle=1, now=0)
    assert decision.at == 60


def test_retries_off_makes_the_first_failure_final() -> None:
    policy = RetryPolicy(retry_on_error=False)
    decision = decide(policy, Outcome.retry("HTTP 502"), attempts_in_cycle=1, now=0)
    assert decision.next is Next.DEAD
    assert decision.reason is not None
    assert "retries are off" in decision.reason


# The manual-retry rule (issue 15): a manual attempt keeps the counter, and a
# failed one returns the delivery to where it was.
NOW = 1_800_000_000.0
FAILED = Outcome.retry("HTTP 503")


@pytest.mark.parametrize(
    ("outcome", "attempts", "in_cycle", "manual", "expected"),
    [
        # Scheduled attempts: the cycle's count grows by this one.
        (FAILED, 2, 2, None, Decision(Next.RETRY, at=NOW + 8, reason="HTTP 503")),
        (
            FAILED,
            15,
            15,
            None,
            Decision(Next.DEAD, reason="HTTP 503 (gave up after 16 attempts)"),
        ),
        # A manual retry of a pending delivery that fails keeps its place.
        (
            FAILED,
            2,
            2,
            ManualRetry(was_dead=False, resume_at=NOW + 600),
            Decision(Next.RETRY, at=NOW + 600, reason="HTTP 503", in_cycle=False),
        ),
        # ... and counts nothing: the schedule's next delay is still the third.
        (
            FAILED,
            2,
            2,
            ManualRetry(was_dead=False, resume_at=None),
            Decision(Next.RETRY, at=NOW + 4, reason="HTTP 503", in_cycle=False),
        ),
        # A manual retry of a dead delivery that fails leaves it dead.
        (
            FAILED,
            16,
            16,
            ManualRetry(was_dead=True),
            Decision(
                Next.DEAD,
                reason="HTTP 503 (still dead after a manual retry; 17 attempts in all)",
                in_cycle=False,
            ),
        ),
        # Success and a hard failure are what they are, manual or not.
        (
            Outcome.success(),
            16,
            16,
            ManualRetry(was_dead=True),
            Decision(Next.DELIVERED, in_cycle=False),
        ),
        (
            Outcome.fail("HTTP 400"),
            2,
            2,
            ManualRetry(was_dead=False, resume_at=NOW + 600),
            Decision(Next.DEAD, reason="HTTP 400", in_cycle=False),
        ),
    ],
)
def test_decide_attempt_keeps_the_manual_retry_rule(
    outcome: Outcome, attempts: int, in_cycle: int, manual: ManualRetry | None, expected: Decision
) -> None:
    decision = decide_attempt(
        DEFAULT, outcome, attempts=attempts, attempts_in_cycle=in_cycle, now=NOW, manual=manual
    )
    assert decision == expected


def test_a_single_attempt_is_said_in_the_singular() -> None:
    # "gave up after 1 attempts" was what a target with retries = 0 said.
    policy = RetryPolicy(retries=0, jitter=0)
    decision = decide(policy, FAILED, attempts_in_cycle=1, now=NOW)
    assert decision == Decision(Next.DEAD, reason="HTTP 503 (gave up after 1 attempt)")
