import random

import pytest

from relay.config import RetryPolicy
from relay.outcome import Outcome
from relay.retry import DEFAULT_RETRY_AFTER_CAP, Next, decide, delay_before_retry, schedule

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
