"""Recording attempts on SQLite, many per statement where the outcome allows.

Every attempt writes its row, its delivery's new state and its target's
health. Done one attempt at a time that is six statements each, and every
statement hands the GIL between the writer thread and the event loop. A run
of attempts waiting for the same group commit that all succeeded, on
targets that are not held down, is written in bulk instead: one INSERT for
their rows, one executemany for their deliveries, and the health rule
(relay.store.health) asked attempt by attempt in memory: a target's row is
written once if any of them changed it (most change nothing: a success after
a success). Anything else (a failure, a probe, a target coming back up) is
recorded attempt by attempt, in order.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from relay.core.outcome import Verdict
from relay.store.base import (
    AttemptRecord,
    ClaimedDelivery,
    FailureStreak,
    Hold,
    Status,
    Transition,
    Waits,
)
from relay.store.dialect import placeholders
from relay.store.health import HEALTH_COLUMNS, TargetHealth, health_after
from relay.store.rows import (
    ATTEMPT_COLUMNS_INSERTED,
    NEXT_IN_LINE,
    attempt_values,
    delivery_after,
    line_up_by_arrival,
    resolve_originals,
    update_health,
    write_health,
)

ATTEMPT_INSERT = f"INSERT INTO attempts ({ATTEMPT_COLUMNS_INSERTED}) VALUES "
ATTEMPT_ROW = "(?,?,?,?,?,?,?,?,?,?,?,?,?)"
DELIVERY_UPDATE = (
    "UPDATE deliveries SET status = ?, attempts = ?, cycle_attempts = ?,"
    " next_attempt_at = ?, lease_until = NULL, last_error = ?, updated_at = ?,"
    " resume_status = NULL, resume_at = NULL"
    " WHERE id = ? AND status = 'in_flight'"
)
# Attempts per INSERT: 13 values each, within SQLite's 32766 bound values.
_ATTEMPTS_PER_STATEMENT = 1000


@dataclass(slots=True)
class RecordJob:
    """One attempt to record, with the delivery's state after it."""

    delivery: ClaimedDelivery
    attempt: AttemptRecord
    status: Status
    next_at: float | None
    error: str | None
    waits: bool  # pending, no retry spent, back of the line (a down target's failed probe)
    cycle: int  # attempts in the cycle after this one
    now: float
    hold: Hold | None

    @classmethod
    def of(
        cls,
        delivery: ClaimedDelivery,
        attempt: AttemptRecord,
        then: Transition,
        now: float,
        hold: Hold | None,
    ) -> RecordJob:
        """The record of `attempt`, whose delivery goes on to `then`. A manual
        attempt is one more try, not a step of the schedule; nor is a probe of
        a down target."""
        status, next_at, error = delivery_after(then, attempt)
        cycle = delivery.attempts_in_cycle + (1 if attempt.in_cycle else 0)
        waits = isinstance(then, Waits)
        return cls(delivery, attempt, status, next_at, error, waits, cycle, now, hold)

    def __call__(self, connection: sqlite3.Connection) -> FailureStreak:
        return self.one(connection)

    @staticmethod
    def run_many(connection: sqlite3.Connection, jobs: Sequence[RecordJob]) -> list[FailureStreak]:
        if len(jobs) == 1 or not all(job.simple_success for job in jobs):
            return [job.one(connection) for job in jobs]
        targets = sorted({job.delivery.target for job in jobs})
        health = {
            row[0]: TargetHealth(*row[1:])
            for row in connection.execute(
                f"SELECT name, {HEALTH_COLUMNS} FROM targets WHERE name IN"
                f" ({placeholders(len(targets))}) AND down_since IS NULL",
                targets,
            )
        }
        if any(target not in health for target in targets):
            # New, or down: the health rule decides attempt by attempt.
            return [job.one(connection) for job in jobs]
        for start in range(0, len(jobs), _ATTEMPTS_PER_STATEMENT):
            chunk = jobs[start : start + _ATTEMPTS_PER_STATEMENT]
            connection.execute(
                ATTEMPT_INSERT + ",".join([ATTEMPT_ROW] * len(chunk)),
                [value for job in chunk for value in job.attempt_row()],
            )
        connection.executemany(DELIVERY_UPDATE, [job.delivery_row() for job in jobs])
        connection.executemany(NEXT_IN_LINE, [(job.now, job.now, job.delivery.id) for job in jobs])
        streaks, changed = successes_health(jobs, health)
        for target, columns in changed.items():
            write_health(connection, target, columns)
        return streaks

    @property
    def simple_success(self) -> bool:
        """A success that the bulk path records exactly as one() would."""
        return (
            self.status is Status.DELIVERED
            and self.attempt.outcome == Verdict.SUCCESS.value
            and self.attempt.target_at_fault
            and self.hold is None
            and self.delivery.resolves is None
        )

    def attempt_row(self) -> tuple[object, ...]:
        number = self.cycle if self.attempt.in_cycle else None
        return attempt_values(self.delivery.id, self.attempt, self.next_at, number)

    def delivery_row(self) -> tuple[object, ...]:
        return (
            self.status.value,
            self.attempt.number,
            self.cycle,
            self.next_attempt_at,
            self.error,
            self.now,
            self.delivery.id,
        )

    @property
    def next_attempt_at(self) -> float | None:
        if self.waits and self.hold is not None:
            # A failed probe goes to the back of its target's line (see
            # relay.store.rows.LINE_UP_BY_ARRIVAL): due at the next probe,
            # after every delivery due by then, so the next probe is another.
            return self.hold.probe_at
        return self.now if self.waits else self.next_at

    def one(self, connection: sqlite3.Connection) -> FailureStreak:
        """This attempt alone, every rule asked in order."""
        connection.execute(ATTEMPT_INSERT + ATTEMPT_ROW, self.attempt_row())
        connection.execute(DELIVERY_UPDATE, self.delivery_row())
        if self.status is Status.DELIVERED:
            connection.execute(NEXT_IN_LINE, (self.now, self.now, self.delivery.id))
            resolve_originals(connection, self.delivery, self.now)
        target = self.delivery.target
        streak = update_health(
            connection, target, self.attempt, self.now, self.hold, self.delivery.id
        )
        if streak.went_down or streak.came_up:
            line_up_by_arrival(connection, target, up=streak.came_up)
        elif streak.down and self.status is Status.PENDING and not self.waits:
            line_up_by_arrival(connection, target, up=False, delivery_id=self.delivery.id)
        return streak


def successes_health(
    jobs: Sequence[RecordJob], health: dict[str, TargetHealth]
) -> tuple[list[FailureStreak], dict[str, dict[str, Any]]]:
    """The health rule (relay.store.health) asked for a run of simple
    successes in turn, in memory, from their targets' rows (`health`, updated
    in place): each one's streak, and the columns to write of each target's
    row (none for most: a success after a success)."""
    streaks = []
    changed: dict[str, dict[str, Any]] = {}
    for job in jobs:
        target = job.delivery.target
        change = health_after(
            job.attempt, job.now, None, health[target], delivery_id=job.delivery.id
        )
        assert not change.count_waiting  # the target was up
        if change.columns:
            changed.setdefault(target, {}).update(change.columns)
            health[target] = health[target].written(change.columns)
        streaks.append(change.streak)
    return streaks, changed
