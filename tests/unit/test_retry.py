import random

import pytest

from relay.config import RetryPolicy
from relay.delivery.retry import covering, cycle_length, delay_before_retry, probe_delay, schedule

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


@pytest.mark.parametrize(
    ("policy", "seconds"),
    [
        (DEFAULT, 30 * 86400),  # T-Bank's month
        (DEFAULT, 3 * 86400),
        (RetryPolicy(retries=3, jitter=0), 3600),
        (RetryPolicy(backoff="list", delays=(30, 120, 600), retries=5, jitter=0), 86400),
        (RetryPolicy(retry_on_error=False, jitter=0), 7200),
    ],
)
def test_relay_check_suggests_a_schedule_that_lasts_as_long_as_the_sender(
    policy: RetryPolicy, seconds: float
) -> None:
    # "consider a longer schedule" named no value that passes: the suggestion
    # is one whose cycle lasts the sender's window, delays a day at most.
    longer = covering(policy, seconds)
    assert sum(schedule(longer)) >= seconds
    assert max(schedule(longer)) <= 86400
    assert sum(schedule(longer)[:-1]) < seconds  # one retry fewer would not do
    assert longer.retry_on_error


def test_the_month_of_tbank_takes_45_retries_capped_at_a_day() -> None:
    longer = covering(DEFAULT, 30 * 86400)
    assert (longer.retries, longer.max_delay) == (45, 86400)
