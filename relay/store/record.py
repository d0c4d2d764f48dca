"""Recording attempts on SQLite, many per statement where the outcome allows.

Every attempt writes its row, its delivery's new state and its target's
health, as the step that follows it (relay.delivery.step) says, asked with
the target's row read in the same transaction. Done one attempt at a time
that is six statements each, and every statement hands the GIL between the
writer thread and the event loop. A run of attempts waiting for the same
group commit that all succeeded, on targets that are up, is written in bulk
instead: one INSERT for their rows, one executemany for their deliveries,
and the step asked attempt by attempt in memory: a target's row is written
once if any of them changed it (most change nothing: a success after a
success). Anything else (a failure, a probe, a target coming back up) is
recorded attempt by attempt, in order.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from relay.core.outcome import Verdict
from relay.store.base import (
    AttemptRecord,
    ClaimedDelivery,
    Decide,
    FailureStreak,
    History,
    Status,
    Step,
    TargetHealth,
    Waits,
)
from relay.store.dialect import placeholders
from relay.store.rows import (
    ATTEMPT_COLUMNS_INSERTED,
    HEALTH_COLUMNS,
    NEXT_IN_LINE,
    attempt_values,
    delivery_after,
    line_up_by_arrival,
    resolve_originals,
    standing,
    write_health,
    write_step,
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
    """One attempt to record, and the step that follows it (asked once, with
    its target's row as the transaction reads it)."""

    delivery: ClaimedDelivery
    attempt: AttemptRecord
    decide: Decide
    now: float
    step: Step | None = field(default=None)

    def decided(self, health: TargetHealth, history: History) -> Step:
        self.step = self.decide(health, history)
        return self.step

    def __call__(self, connection: sqlite3.Connection) -> Step:
        return self.one(connection)

    @staticmethod
    def run_many(connection: sqlite3.Connection, jobs: Sequence[RecordJob]) -> list[Step]:
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
            # New, or down: the step is asked attempt by attempt.
            return [job.one(connection) for job in jobs]
        steps, changed = successes_health(jobs, health)
        for start in range(0, len(jobs), _ATTEMPTS_PER_STATEMENT):
            chunk = jobs[start : start + _ATTEMPTS_PER_STATEMENT]
            connection.execute(
                ATTEMPT_INSERT + ",".join([ATTEMPT_ROW] * len(chunk)),
                [value for job in chunk for value in job.attempt_row()],
            )
        connection.executemany(DELIVERY_UPDATE, [job.delivery_row() for job in jobs])
        connection.executemany(NEXT_IN_LINE, [(job.now, job.now, job.delivery.id) for job in jobs])
        for target, columns in changed.items():
            write_health(connection, target, columns)
        return steps

    @property
    def simple_success(self) -> bool:
        """A success that the bulk path records exactly as one() would: on a
        target that is up (the bulk path reads only those), it is delivered,
        and what it changes of its target is a success's columns alone."""
        return (
            self.attempt.outcome == Verdict.SUCCESS.value
            and self.attempt.target_at_fault
            and self.delivery.resolves is None
        )

    @property
    def cycle(self) -> int:
        """Attempts in the cycle after this one."""
        assert self.step is not None
        return self.delivery.attempts_in_cycle + (1 if self.step.in_cycle else 0)

    def attempt_row(self) -> tuple[object, ...]:
        assert self.step is not None
        _, next_at, _ = delivery_after(self.step.then, self.attempt.error)
        number = self.cycle if self.step.in_cycle else None
        return attempt_values(self.delivery.id, self.attempt, next_at, number)

    def delivery_row(self) -> tuple[object, ...]:
        assert self.step is not None
        status, next_at, error = delivery_after(self.step.then, self.attempt.error)
        return (
            status.value,
            self.attempt.number,
            self.cycle,
            next_at,
            error,
            self.now,
            self.delivery.id,
        )

    def one(self, connection: sqlite3.Connection) -> Step:
        """This attempt alone, every rule asked in order."""
        target = self.delivery.target
        step = self.decided(*standing(connection, target, self.delivery.id))
        connection.execute(ATTEMPT_INSERT + ATTEMPT_ROW, self.attempt_row())
        connection.execute(DELIVERY_UPDATE, self.delivery_row())
        status, _, _ = delivery_after(step.then, None)
        if status is Status.DELIVERED:
            connection.execute(NEXT_IN_LINE, (self.now, self.now, self.delivery.id))
            resolve_originals(connection, self.delivery, self.now)
        streak = write_step(connection, target, self.delivery.id, step)
        if streak.went_down or streak.came_up:
            line_up_by_arrival(connection, target, up=streak.came_up)
        elif streak.down and status is Status.PENDING and not isinstance(step.then, Waits):
            line_up_by_arrival(connection, target, up=False, delivery_id=self.delivery.id)
        return _with_streak(step, streak)


def _with_streak(step: Step, streak: FailureStreak) -> Step:
    return step if streak is step.streak else replace(step, streak=streak)


def successes_health(
    jobs: Sequence[RecordJob], health: dict[str, TargetHealth]
) -> tuple[list[Step], dict[str, dict[str, Any]]]:
    """The step asked for a run of simple successes in turn, in memory, from
    their targets' rows (`health`, updated in place): each one's Step, and the
    columns to write of each target's row (none for most: a success after a
    success). A success asks nothing of a delivery's memory of failing."""
    steps = []
    changed: dict[str, dict[str, Any]] = {}
    for job in jobs:
        target = job.delivery.target
        step = job.decided(health[target], History())
        assert not step.count_waiting  # the target was up
        assert step.remember is None  # a success remembers no failing
        if step.target:
            changed.setdefault(target, {}).update(step.target)
            health[target] = health[target].written(step.target)
        steps.append(step)
    return steps, changed
