"""A target's health after an attempt: one rule for every backend.

The backends read the target's row, ask `health_after` what changes, write
the returned columns and, when the target came back up, count the
deliveries that waited for it. Only the I/O differs between them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from relay.core.outcome import Verdict
from relay.store.base import AttemptRecord, FailureStreak, Hold


class TargetHealth(NamedTuple):
    """What the rule reads of a target's row (HEALTH_COLUMNS, in this order;
    a target never attempted: the defaults)."""

    consecutive_failures: int = 0
    down_streak: int = 0
    down_since: float | None = None
    probes: int = 0
    successes: int = 0
    last_success_at: float | None = None

    def written(self, columns: dict[str, Any]) -> TargetHealth:
        """This row once a HealthChange's columns are written."""
        return self._replace(**{k: v for k, v in columns.items() if k in self._fields})


HEALTH_COLUMNS = ", ".join(TargetHealth._fields)
# How far behind a target's last success the time shown may be (one write a
# second, not one a batch: on PostgreSQL each write holds the row locked to
# its commit, which every instance recording that target waits for).
SUCCESS_SHOWN_WITHIN = 1.0


def fails_alone(*, flagged: bool, seen: int | None, successes: int) -> bool:
    """Whether a delivery failing now fails alone: it failed before, and its
    target delivered others since (`successes` now, `seen` at its last
    failure). Its failures are then about its payload, not the target: one
    poison payload must not make a hold_when_down target down, where it
    would be the probe for ever and never spend a retry. Once alone, alone
    (`flagged`) until the delivery is done: after the others it fails by
    itself, with no success in between to tell."""
    return flagged or (seen is not None and successes > seen)


@dataclass(frozen=True)
class HealthChange:
    streak: FailureStreak  # `waited` is for the backend to fill in (count_waiting)
    columns: dict[str, Any] = field(default_factory=dict)  # of the targets row, to set
    count_waiting: bool = False  # the target came up: how many deliveries waited?


def health_after(
    attempt: AttemptRecord,
    now: float,
    hold: Hold | None,
    health: TargetHealth,
    *,
    alone: bool = False,
    delivery_id: int | None = None,
) -> HealthChange:
    """What this attempt (of delivery `delivery_id`) changes of its target's
    row (`health`); `alone`: it failed alone (`fails_alone`).

    A success after a success, with none of the target's failures between
    (`before` 0: every failure it is at fault for counts), changes nothing
    the rules read: `successes` only has to grow once after each failure, for
    the deliveries that failed (`fails_alone`). Its time is written when the
    one shown is SUCCESS_SHOWN_WITHIN old. Nothing to write, no row to lock."""
    before, down_streak, down_since, probes, successes, last_success_at = health
    if not attempt.target_at_fault:
        # The event could not be sent as rendered: nothing was learnt about the target.
        return HealthChange(FailureStreak(before, before, down=down_since is not None))
    if (
        attempt.outcome == Verdict.SUCCESS
        and before == 0
        and down_streak == 0
        and down_since is None
        and last_success_at is not None
        # Either way: one shown ahead of now (a clock stepped back) is written.
        and abs(now - last_success_at) < SUCCESS_SHOWN_WITHIN
    ):
        return HealthChange(FailureStreak(0, 0))
    # A retry outcome (network, timeout, 5xx, 429) says the target may be down;
    # any answer about the payload (success, a 4xx) says it is up.
    down_signal = attempt.outcome == Verdict.RETRY
    if not (down_signal and alone):  # a payload failing alone leaves the streak as it is
        down_streak = down_streak + 1 if down_signal else 0
    columns: dict[str, Any]
    if attempt.outcome == Verdict.SUCCESS:
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
            "last_error": attempt.error,
            "consecutive_failures": after,
            "down_streak": down_streak,
        }
    if down_since is not None and not down_signal:
        columns |= {"down_since": None, "probe_at": None, "probes": 0, "probe_delivery": None}
        streak = FailureStreak(before, after, came_up=True, down_for=now - down_since)
        return HealthChange(streak, columns, count_waiting=True)
    if hold is not None and down_signal:
        if down_since is None and down_streak >= hold.down_after and not alone:
            columns |= {
                "down_since": now,
                "probe_at": hold.probe_at,
                "probes": 0,
                "probe_delivery": delivery_id,
            }
            return HealthChange(FailureStreak(before, after, went_down=True, down=True), columns)
        if down_since is not None and hold.probe:
            columns |= {
                "probe_at": hold.probe_at,
                "probes": probes + 1,
                "probe_delivery": delivery_id,
            }
    return HealthChange(FailureStreak(before, after, down=down_since is not None), columns)
