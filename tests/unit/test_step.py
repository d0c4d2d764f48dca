"""relay.delivery.step: what follows one attempt, for its delivery and its
target, as one table: cycles, a person's retries, probes of a down target,
receivers' throttles and waits, payloads that fail alone."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from relay.config import RetryPolicy
from relay.core.outcome import Outcome
from relay.core.payload import Payload
from relay.core.records import (
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
from relay.delivery.step import (
    DEFAULT_RETRY_AFTER_CAP,
    SUCCESS_SHOWN_WITHIN,
    Attempted,
    Rules,
    fails_alone,
    step,
)

NOW = 1_800_000_000.0
RECEIVED = NOW - 500
DEFAULT = Rules(RetryPolicy(jitter=0))
HELD = replace(DEFAULT, down_after=3)

OK = Outcome.success(200)
FAILED = Outcome.retry("HTTP 503", 503)
BAD = Outcome.fail("HTTP 400", 400)
UNSENDABLE = Outcome.unsendable("template error")


def asked_wait(seconds: float) -> Outcome:
    """A failure that asks for a wait: a 503 with Retry-After."""
    return Outcome.retry("HTTP 503", 503, retry_after=seconds)


def throttled(seconds: float | None = None) -> Outcome:
    """A 429, with a Retry-After or without."""
    return Outcome.retry("HTTP 429", 429, retry_after=seconds, throttle=True)


@dataclass(frozen=True)
class Case:
    rules: Rules
    outcome: Outcome
    then: Transition
    in_cycle: bool = True
    # The delivery before this attempt: attempts made, of them in its cycle.
    attempts: int = 0
    in_its_cycle: int = 0
    # A person's retry now: where a failure returns it (status, time).
    manual: tuple[Status, float | None] | None = None
    probe: bool = False
    health: TargetHealth = field(default_factory=TargetHealth)
    history: History = field(default_factory=History)
    streak: FailureStreak | None = None
    # Columns of the target's row the step sets (a subset is checked).
    target: dict[str, Any] = field(default_factory=dict)
    started: float | None = None  # when the attempt began (None: NOW)


DOWN_SINCE = NOW - 100
# Down, probe 1 failed (probe 2 is due); last probed after RECEIVED.
DOWN_ROW = TargetHealth(
    consecutive_failures=5,
    down_streak=5,
    down_since=DOWN_SINCE,
    probes=1,
    probed_at=DOWN_SINCE + 50,
    probe_step=2,
)

CASES = {
    # -- the cycle ---------------------------------------------------------------
    "a success is delivered": Case(DEFAULT, OK, Delivered(), streak=FailureStreak(0, 0)),
    "a failure no retry helps is dead": Case(DEFAULT, BAD, Dead("HTTP 400")),
    "the first retry waits 2 s": Case(DEFAULT, FAILED, RetryAt(NOW + 2)),
    "the fifteenth waits 2^15 s": Case(
        DEFAULT, FAILED, RetryAt(NOW + 32768), attempts=14, in_its_cycle=14
    ),
    "past the last retry, dead": Case(
        DEFAULT,
        FAILED,
        Dead("HTTP 503 (gave up after 16 attempts)"),
        attempts=15,
        in_its_cycle=15,
    ),
    "one attempt is said in the singular": Case(
        Rules(RetryPolicy(retries=0, jitter=0)),
        FAILED,
        Dead("HTTP 503 (gave up after 1 attempt)"),
    ),
    "retries off: the first failure is final": Case(
        Rules(RetryPolicy(retry_on_error=False)),
        FAILED,
        Dead("HTTP 503 (retries are off for this target)"),
    ),
    # A failure that asks for a wait holds the target as long (rule 4).
    "a receiver's wait longer than the delay is kept": Case(
        DEFAULT,
        asked_wait(120),
        RetryAt(NOW + 120, hold_until=NOW + 120),
        target={"throttled_until": NOW + 120, "throttles": "absent"},
    ),
    "a delay longer than the receiver's wait is kept": Case(
        DEFAULT, asked_wait(1), RetryAt(NOW + 8, hold_until=NOW + 1), attempts=2, in_its_cycle=2
    ),
    "a huge wait is capped": Case(
        DEFAULT,
        asked_wait(10**6),
        RetryAt(NOW + DEFAULT_RETRY_AFTER_CAP, hold_until=NOW + DEFAULT_RETRY_AFTER_CAP),
    ),
    "a wait is capped by max_delay": Case(
        Rules(RetryPolicy(jitter=0, max_delay=60)),
        asked_wait(600),
        RetryAt(NOW + 60, hold_until=NOW + 60),
    ),
    # -- a person's retry now ----------------------------------------------------
    "a manual retry of a pending one that fails keeps its place": Case(
        DEFAULT,
        FAILED,
        RetryAt(NOW + 600),
        in_cycle=False,
        attempts=2,
        in_its_cycle=2,
        manual=(Status.PENDING, NOW + 600),
    ),
    "... and counts nothing: no place kept, the cycle's next delay": Case(
        DEFAULT,
        FAILED,
        RetryAt(NOW + 4),
        in_cycle=False,
        attempts=2,
        in_its_cycle=2,
        manual=(Status.PENDING, None),
    ),
    "a manual retry of a dead one that fails leaves it dead": Case(
        DEFAULT,
        FAILED,
        Dead("HTTP 503 (still dead after a manual retry; 17 attempts in all)"),
        in_cycle=False,
        attempts=16,
        in_its_cycle=16,
        manual=(Status.DEAD, None),
    ),
    "a manual success delivers": Case(
        DEFAULT, OK, Delivered(), in_cycle=False, attempts=16, manual=(Status.DEAD, None)
    ),
    "a manual hard failure is dead": Case(
        DEFAULT, BAD, Dead("HTTP 400"), in_cycle=False, manual=(Status.PENDING, NOW + 600)
    ),
    # -- hold_when_down: going down, probes, coming up ---------------------------
    "the down_after-th down answer makes the target down": Case(
        HELD,
        FAILED,
        RetryAt(NOW + 2),
        health=TargetHealth(2, 2, successes=9),
        streak=FailureStreak(2, 3, went_down=True, down=True),
        # The first probe comes as the first retry would.
        target={
            "down_since": NOW,
            "probe_at": NOW + 2,
            "probes": 0,
            "probe_delivery": 7,
            "probed_at": NOW,
            "probe_step": 1,
        },
    ),
    "a failed probe waits for the next, spending no retry": Case(
        HELD,
        FAILED,
        # Probe 2 failed: probe 3 waits as retry 3 would.
        Waits(NOW + 8),
        in_cycle=False,
        attempts=3,
        in_its_cycle=3,
        probe=True,
        health=DOWN_ROW,
        streak=FailureStreak(5, 6, down=True),
        target={
            "probe_at": NOW + 8,
            "probes": 2,
            "probe_delivery": 7,
            "probed_at": NOW,
            "probe_step": 3,
        },
    ),
    "a failed probe by a delivery that arrived since the last one starts the backoff again": Case(
        HELD,
        FAILED,
        # Fresh evidence (never attempted, received after the last probe):
        # probe 1 again, as the first retry would come.
        Waits(NOW + 2),
        in_cycle=False,
        probe=True,
        health=DOWN_ROW._replace(probed_at=RECEIVED - 1),
        streak=FailureStreak(5, 6, down=True),
        target={"probe_at": NOW + 2, "probes": 2, "probed_at": NOW, "probe_step": 1},
    ),
    "... one never attempted that arrived before the last probe follows the backoff": Case(
        HELD,
        FAILED,
        Waits(NOW + 8),
        in_cycle=False,
        probe=True,
        health=DOWN_ROW,
        target={"probe_at": NOW + 8, "probe_step": 3},
    ),
    "a probe answered about the payload brings the target up": Case(
        HELD,
        OK,
        Delivered(),
        in_cycle=False,
        probe=True,
        health=DOWN_ROW,
        streak=FailureStreak(5, 0, came_up=True, down_for=100.0),
        target={
            "down_since": None,
            "probe_at": None,
            "probes": 0,
            "successes": 1,
            "probed_at": None,
            "probe_step": 0,
        },
    ),
    "a person's retry that is the probe keeps its own rule": Case(
        HELD,
        FAILED,
        RetryAt(NOW + 600),
        in_cycle=False,
        attempts=3,
        in_its_cycle=3,
        manual=(Status.PENDING, NOW + 600),
        probe=True,
        health=DOWN_ROW,
        streak=FailureStreak(5, 6, down=True),
        target={"probes": 2},
    ),
    "a payload failing alone neither grows the down streak nor makes it down": Case(
        HELD,
        FAILED,
        RetryAt(NOW + 4),
        attempts=1,
        in_its_cycle=1,
        health=TargetHealth(2, 2, successes=9),
        history=History(seen_successes=8),
        streak=FailureStreak(2, 3),
        target={"down_streak": 2},
    ),
    "a 4xx restarts the down streak": Case(
        HELD,
        BAD,
        Dead("HTTP 400"),
        health=TargetHealth(2, 2, successes=9),
        streak=FailureStreak(2, 3),
        target={"down_streak": 0, "consecutive_failures": 3},
    ),
    "an event that cannot be sent teaches nothing of the target": Case(
        HELD,
        UNSENDABLE,
        Dead("template error"),
        health=TargetHealth(4, 4),
        streak=FailureStreak(4, 4),
    ),
    # -- a receiver's throttle: the whole target held, no retry spent ------------
    "a 429 holds the target for its Retry-After, the delivery first in line": Case(
        DEFAULT,
        throttled(30),
        RetryAt(RECEIVED, hold_until=NOW + 30),
        in_cycle=False,
        streak=FailureStreak(0, 1),
        target={"throttled_until": NOW + 30, "throttles": 1, "consecutive_failures": 1},
    ),
    "without a Retry-After, the first hold is the first retry's delay": Case(
        DEFAULT,
        throttled(),
        RetryAt(RECEIVED, hold_until=NOW + 2),
        in_cycle=False,
        target={"throttled_until": NOW + 2, "throttles": 1},
    ),
    "... and it grows while 429s continue": Case(
        DEFAULT,
        throttled(),
        RetryAt(RECEIVED, hold_until=NOW + 8),
        in_cycle=False,
        health=TargetHealth(throttled_until=NOW - 1, throttles=2),
        target={"throttled_until": NOW + 8, "throttles": 3},
    ),
    "a 429 to a request sent before the hold ended does not grow it": Case(
        DEFAULT,
        throttled(),
        RetryAt(RECEIVED, hold_until=NOW + 5),
        in_cycle=False,
        health=TargetHealth(throttled_until=NOW + 5, throttles=2),
        started=NOW - 1,
        target={"throttled_until": NOW + 5, "throttles": "absent"},  # as it was
    ),
    "a success ends the episode: the next throttle starts from the first delay": Case(
        DEFAULT,
        OK,
        Delivered(),
        health=TargetHealth(throttled_until=NOW - 1, throttles=3, last_success_at=NOW - 0.1),
        target={"throttles": 0},
    ),
    "so does any other answer": Case(
        DEFAULT,
        FAILED,
        RetryAt(NOW + 2),
        health=TargetHealth(throttled_until=NOW - 1, throttles=3),
        target={"throttles": 0},
    ),
    "a 429 spends no retry, past the last one included": Case(
        DEFAULT,
        throttled(30),
        RetryAt(RECEIVED, hold_until=NOW + 30),
        in_cycle=False,
        attempts=15,
        in_its_cycle=15,
    ),
    "a 429 is no down answer: a down target's probe brings it up, held": Case(
        HELD,
        throttled(),
        RetryAt(RECEIVED, hold_until=NOW + 2),
        in_cycle=False,
        probe=True,
        health=DOWN_ROW,
        streak=FailureStreak(5, 6, came_up=True, down_for=100.0),
        target={"down_since": None, "down_streak": 0, "throttled_until": NOW + 2},
    ),
    "a 429 for a payload failing alone is an ordinary retry, nothing held": Case(
        HELD,
        throttled(),
        RetryAt(NOW + 4),
        attempts=1,
        in_its_cycle=1,
        health=TargetHealth(2, 2, successes=9),
        history=History(seen_successes=8),
        target={"throttled_until": "absent"},
    ),
    "a person's retry keeps its own time, the target held": Case(
        DEFAULT,
        throttled(30),
        RetryAt(NOW + 600, hold_until=NOW + 30),
        in_cycle=False,
        manual=(Status.PENDING, NOW + 600),
        target={"throttled_until": NOW + 30},
    ),
    "retries off: a 429 is final, and still holds the target": Case(
        Rules(RetryPolicy(retry_on_error=False)),
        throttled(30),
        Dead("HTTP 429 (retries are off for this target)"),
        target={"throttled_until": NOW + 30},
    ),
}


def claimed(case: Case) -> ClaimedDelivery:
    resume_status, resume_at = case.manual or (None, None)
    return ClaimedDelivery(
        id=7,
        event_id=3,
        route="leads",
        target="crm",
        attempts=case.attempts,
        attempts_in_cycle=case.in_its_cycle,
        manual=case.manual is not None,
        resume_status=resume_status,
        resume_at=resume_at,
        idempotency_key=None,
        received_at=RECEIVED,
        payload=Payload("POST", "/", "", [], None, b""),
    )


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_what_follows_one_attempt(case: Case) -> None:
    attempted = Attempted(claimed(case), case.outcome, NOW, probe=case.probe, started=case.started)
    got = step(case.rules, attempted, case.health, case.history)
    assert (got.then, got.in_cycle) == (case.then, case.in_cycle)
    if case.streak is not None:
        assert got.streak == case.streak
    assert {k: got.target.get(k, "absent") for k in case.target} == case.target


def test_the_jitter_is_the_callers_draw() -> None:
    rules = Rules(RetryPolicy(jitter=0.1))
    delays = [
        step(
            rules,
            Attempted(claimed(Case(rules, FAILED, Delivered())), FAILED, NOW, draw=d),
            TargetHealth(),
            History(),
        ).then
        for d in (-1.0, 0.0, 1.0)
    ]
    assert delays == [RetryAt(NOW + 1.8), RetryAt(NOW + 2.0), RetryAt(NOW + 2.2)]


@pytest.mark.parametrize(
    ("history", "successes", "alone"),
    [
        (History(), 5, False),  # its first failure: nothing to compare with
        (History(seen_successes=5), 5, False),  # nothing delivered since its last failure
        (History(seen_successes=4), 5, True),  # the target delivered another since
        (History(5, fails_alone=True), 5, True),  # once alone, alone
    ],
)
def test_a_delivery_fails_alone_once_others_were_delivered_since_its_last_failure(
    history: History, successes: int, alone: bool
) -> None:
    assert fails_alone(history, successes) is alone


@pytest.mark.parametrize(
    ("row", "writes"),
    [
        # After a success shown less than SUCCESS_SHOWN_WITHIN ago: nothing.
        ((0, 0, None, 0, 9, NOW - 0.5), False),
        # The time shown would lag more: it is written, and the count.
        ((0, 0, None, 0, 9, NOW - SUCCESS_SHOWN_WITHIN), True),
        # A failure since (of any delivery, alone or not): the count must grow,
        # for the deliveries that failed (fails_alone).
        ((1, 0, None, 0, 9, NOW - 0.5), True),
        ((1, 1, None, 0, 9, NOW - 0.5), True),
        # Shown ahead of now (the clock stepped back, another instance's runs
        # ahead): written, or it would stay in the future until then.
        ((0, 0, None, 0, 9, NOW + 3600), True),
        # Never a success yet, or down: written.
        ((0, 0, None, 0, 0, None), True),
        ((0, 0, NOW - 60, 1, 9, NOW - 0.5), True),
    ],
)
def test_a_success_after_a_success_changes_nothing_to_write(
    row: tuple[int, int, float | None, int, int, float | None], writes: bool
) -> None:
    health = TargetHealth(*row)
    done = step(
        DEFAULT, Attempted(claimed(Case(DEFAULT, OK, Delivered())), OK, NOW), health, History()
    )
    assert bool(done.target) is writes
    assert done.streak.after == 0
    if writes:
        assert done.target["successes"] == health.successes + 1


def test_a_delivery_failing_again_after_unwritten_successes_still_fails_alone() -> None:
    # The row as the step leaves it, attempt after attempt: a poison payload
    # fails, others are delivered (the first success is written, the next ones
    # change nothing), it fails again: the count grew since, so it fails alone.
    poison = claimed(Case(HELD, FAILED, Delivered()))
    health = TargetHealth(successes=5, last_success_at=NOW - 0.1)
    failed: Step = step(HELD, Attempted(poison, FAILED, NOW), health, History())
    health = health.written(failed.target)
    assert failed.remember == History(seen_successes=5)
    for n in range(5):
        other = replace(poison, id=8 + n)
        done = step(HELD, Attempted(other, OK, NOW + n / 10), health, History())
        health = health.written(done.target)
    assert health.successes == 6  # grew once, not five times
    again = step(HELD, Attempted(poison, FAILED, NOW + 1), health, failed.remember)
    assert again.remember == History(seen_successes=6, fails_alone=True)
    assert not again.streak.went_down
