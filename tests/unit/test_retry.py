import random

import pytest

from relay.config import RetryPolicy
from relay.core.outcome import Outcome
from relay.core.status import Next, Status
from relay.delivery.retry import (
    DEFAULT_RETRY_AFTER_CAP,
    Decision,
    ManualRetry,
    cycle_length,
    decide,
    decide_attempt,
    decide_probe,
    delay_before_retry,
    probe_delay,
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
        (Outcome.success(200), 1, Status.DELIVERED, None),
        (Outcome.fail("HTTP 400", 400), 1, Status.DEAD, None),
        (Outcome.retry("HTTP 503", 503), 1, Status.PENDING, 2),
        (Outcome.retry("HTTP 503", 503), 15, Status.PENDING, 32768),
        (Outcome.retry("HTTP 503", 503), 16, Status.DEAD, None),
        (Outcome.retry("HTTP 429", 429, retry_after=120), 1, Status.PENDING, 120),
        (Outcome.retry("HTTP 429", 429, retry_after=1), 3, Status.PENDING, 8),
        (
            Outcome.retry("HTTP 429", 429, retry_after=10**6),
            1,
            Status.PENDING,
            DEFAULT_RETRY_AFTER_CAP,
        ),
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
    assert decision.next is Status.DEAD
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
        (FAILED, 2, 2, None, Decision(Status.PENDING, at=NOW + 8, reason="HTTP 503")),
        (
            FAILED,
            15,
            15,
            None,
            Decision(Status.DEAD, reason="HTTP 503 (gave up after 16 attempts)"),
        ),
        # A manual retry of a pending delivery that fails keeps its place.
        (
            FAILED,
            2,
            2,
            ManualRetry(was_dead=False, resume_at=NOW + 600),
            Decision(Status.PENDING, at=NOW + 600, reason="HTTP 503", in_cycle=False),
        ),
        # ... and counts nothing: the schedule's next delay is still the third.
        (
            FAILED,
            2,
            2,
            ManualRetry(was_dead=False, resume_at=None),
            Decision(Status.PENDING, at=NOW + 4, reason="HTTP 503", in_cycle=False),
        ),
        # A manual retry of a dead delivery that fails leaves it dead.
        (
            FAILED,
            16,
            16,
            ManualRetry(was_dead=True),
            Decision(
                Status.DEAD,
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
            Decision(Status.DELIVERED, in_cycle=False),
        ),
        (
            Outcome.fail("HTTP 400"),
            2,
            2,
            ManualRetry(was_dead=False, resume_at=NOW + 600),
            Decision(Status.DEAD, reason="HTTP 400", in_cycle=False),
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
    assert decision == Decision(Status.DEAD, reason="HTTP 503 (gave up after 1 attempt)")


@pytest.mark.parametrize(
    ("policy", "length"),
    [
        (DEFAULT, 16),  # the first attempt and 15 retries
        (RetryPolicy(retries=3), 4),
        (RetryPolicy(retries=0), 1),
        (RetryPolicy(retries=5, retry_on_error=False), 1),  # retries off: the first is all
    ],
)
def test_a_cycle_is_the_first_attempt_and_its_retries(policy: RetryPolicy, length: int) -> None:
    assert cycle_length(policy) == length


LISTED = RetryPolicy(backoff="list", delays=(30, 120), retries=5, jitter=0)


@pytest.mark.parametrize(
    ("policy", "probe", "delay"),
    [
        # Probe k waits as retry k would...
        (DEFAULT, 1, 2),
        (DEFAULT, 3, 8),
        (DEFAULT, 15, 32768),
        # ... and past the last retry the last delay repeats, however long it is down.
        (DEFAULT, 16, 32768),
        (DEFAULT, 400, 32768),
        (RetryPolicy(retries=3, jitter=0), 9, 8),
        # A list: its last delay repeats past the list and past the retries.
        (LISTED, 1, 30),
        (LISTED, 2, 120),
        (LISTED, 7, 120),
        # No retries: every probe waits as the first retry would.
        (RetryPolicy(retries=0, jitter=0), 1, 2),
        (RetryPolicy(retries=0, jitter=0), 5, 2),
        (RetryPolicy(max_delay=60, jitter=0), 10, 60),
    ],
)
def test_probes_follow_the_targets_backoff(policy: RetryPolicy, probe: int, delay: float) -> None:
    assert probe_delay(policy, probe) == delay


NEXT_PROBE = NOW + 300


@pytest.mark.parametrize(
    ("outcome", "manual", "expected"),
    [
        # A failed probe spends no retry, its own included: it waits for the next probe.
        (FAILED, False, Decision(Status.PENDING, at=NEXT_PROBE, reason="HTTP 503", in_cycle=False)),
        # A person's retry now keeps its own rule; a probe that went through or
        # failed for good is decided by the policy.
        (FAILED, True, None),
        (Outcome.success(), False, None),
        (Outcome.fail("HTTP 400"), False, None),
    ],
)
def test_a_failed_probe_waits_for_the_next_probe(
    outcome: Outcome, manual: bool, expected: Decision | None
) -> None:
    # What the policy said (a retry in 4 s, or its verdict) is what the probe rule replaces.
    policy_said = decide(DEFAULT, outcome, attempts_in_cycle=2, now=NOW)
    decided = decide_probe(policy_said, outcome, next_probe_at=NEXT_PROBE, manual=manual)
    assert decided == expected
