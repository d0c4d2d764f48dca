"""Recording attempts on SQLite, many per statement where the outcome allows.

Done one attempt at a time, recording is six statements each, and every
statement hands the GIL between the writer thread and the event loop. A run
of simple successes waiting for the same group commit (RecordJob.simple_success,
on targets that are up) is written in bulk instead: one INSERT for their
rows, one executemany for their deliveries, their targets' rows once
(relay.store.record.successes_health). Anything else (a failure, a probe, a
target coming back up) is recorded attempt by attempt, in order.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from relay.store.base import (
    FailureStreak,
    History,
    Status,
    Step,
    TargetHealth,
    Waits,
)
from relay.store.columns import HEALTH, HISTORY
from relay.store.dialect import placeholders
from relay.store.record import RecordJob, successes_health
from relay.store.rows import (
    LINE_UP_ALL,
    LINE_UP_DOWN,
    LINE_UP_ONE_DOWN,
    NEW_ATTEMPT,
    NEXT_IN_LINE,
    delivery_after,
)
from relay.store.sqlite.supersede import resolve_originals, settle_attempt

DELIVERY_UPDATE = (
    "UPDATE deliveries SET status = ?, attempts = ?, cycle_attempts = ?,"
    " next_attempt_at = ?, lease_until = NULL, last_error = ?, updated_at = ?,"
    " resume_status = NULL, resume_at = NULL"
    " WHERE id = ? AND status = 'in_flight'"
)
# One attempt's: with the corrected copy made while it was under way, if one was
# (relay.store.supersede).
DELIVERY_UPDATE_ONE = DELIVERY_UPDATE + " RETURNING resolved_by"
# Targets' health by name, of those that are up.
HEALTH_BY_NAME = HEALTH.keyed("name")
# Attempts per INSERT (NEW_ATTEMPT's 13 values each), within SQLite's 32766 bound values.
_ATTEMPTS_PER_STATEMENT = 1000


class SqliteRecord(RecordJob):
    """A RecordJob as the writer runs it (relay.store.sqlite.writer): a run of
    them waiting for the same commit is recorded by one run_many."""

    __slots__ = ()

    def __call__(self, connection: sqlite3.Connection) -> Step:
        return self.one(connection)

    @staticmethod
    def run_many(connection: sqlite3.Connection, jobs: Sequence[SqliteRecord]) -> list[Step]:
        if (
            len(jobs) == 1
            or not all(job.simple_success for job in jobs)
            or _copy_waits(connection, jobs)
        ):
            return [job.one(connection) for job in jobs]
        targets = sorted({job.delivery.target for job in jobs})
        health = dict(
            map(
                HEALTH_BY_NAME.from_row,
                connection.execute(
                    f"SELECT {HEALTH_BY_NAME.columns} FROM targets WHERE name IN"
                    f" ({placeholders(len(targets))}) AND down_since IS NULL",
                    targets,
                ),
            )
        )
        if any(target not in health for target in targets):
            # New, or down: the step is asked attempt by attempt.
            return [job.one(connection) for job in jobs]
        steps, changed = successes_health(jobs, health)
        for start in range(0, len(jobs), _ATTEMPTS_PER_STATEMENT):
            chunk = jobs[start : start + _ATTEMPTS_PER_STATEMENT]
            connection.execute(
                NEW_ATTEMPT.insert + ",".join([NEW_ATTEMPT.row] * len(chunk)),
                [value for job in chunk for value in job.attempt_row()],
            )
        connection.executemany(DELIVERY_UPDATE, [job.delivery_row() for job in jobs])
        connection.executemany(NEXT_IN_LINE, [(job.now, job.now, job.delivery.id) for job in jobs])
        for target, columns in changed.items():
            write_health(connection, target, columns)
        return steps

    def one(self, connection: sqlite3.Connection) -> Step:
        """This attempt alone, every rule asked in order."""
        target = self.delivery.target
        step = self.decided(*standing(connection, target, self.delivery.id))
        connection.execute(NEW_ATTEMPT.insert + NEW_ATTEMPT.row, self.attempt_row())
        updated = connection.execute(DELIVERY_UPDATE_ONE, self.delivery_row()).fetchone()
        if updated is not None and updated[0] is not None:
            # A corrected copy was made while this attempt was under way.
            step = settle_attempt(connection, self.delivery, updated[0], step, self.now)
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


def _copy_waits(connection: sqlite3.Connection, jobs: Sequence[SqliteRecord]) -> bool:
    """Whether a corrected copy was made while one of these attempts was under
    way (it is then recorded alone, relay.store.supersede)."""
    ids = [job.delivery.id for job in jobs]
    for start in range(0, len(ids), _ATTEMPTS_PER_STATEMENT):
        chunk = ids[start : start + _ATTEMPTS_PER_STATEMENT]
        if connection.execute(
            f"SELECT 1 FROM deliveries WHERE id IN ({placeholders(len(chunk))})"
            " AND resolved_by IS NOT NULL LIMIT 1",
            chunk,
        ).fetchone():
            return True
    return False


def _with_streak(step: Step, streak: FailureStreak) -> Step:
    return step if streak is step.streak else replace(step, streak=streak)


def standing(
    connection: sqlite3.Connection, target: str, delivery_id: int
) -> tuple[TargetHealth, History]:
    """What the step that follows an attempt reads (relay.delivery.step): its
    target's row (made if the target was never attempted) and the delivery's
    memory of failing. The writer holds the database's one write lock."""
    connection.execute("INSERT OR IGNORE INTO targets (name) VALUES (?)", (target,))
    health = connection.execute(
        f"SELECT {HEALTH.columns} FROM targets WHERE name = ?", (target,)
    ).fetchone()
    history = connection.execute(
        f"SELECT {HISTORY.columns} FROM deliveries WHERE id = ?", (delivery_id,)
    ).fetchone()
    return HEALTH.from_row(health), HISTORY.from_row(history)


def write_step(
    connection: sqlite3.Connection, target: str, delivery_id: int, step: Step
) -> FailureStreak:
    """What a step changes beside the attempt's and the delivery's rows: the
    target's, the delivery's memory of failing; the streak, with how many
    deliveries waited when the target came up."""
    write_health(connection, target, step.target)
    if step.remember is not None:
        connection.execute(
            "UPDATE deliveries SET seen_successes = ?, fails_alone = ? WHERE id = ?",
            (step.remember.seen_successes, int(step.remember.fails_alone), delivery_id),
        )
    if not step.count_waiting:
        return step.streak
    (waited,) = connection.execute(
        "SELECT COUNT(*) FROM deliveries WHERE status = 'pending' AND target = ?", (target,)
    ).fetchone()
    return replace(step.streak, waited=waited)


def write_health(connection: sqlite3.Connection, target: str, columns: dict[str, Any]) -> None:
    """Set these columns of the target's row (nothing when there are none)."""
    if columns:
        assignments = ", ".join(f"{column} = ?" for column in columns)
        connection.execute(
            f"UPDATE targets SET {assignments} WHERE name = ?", (*columns.values(), target)
        )


def line_up_by_arrival(
    connection: sqlite3.Connection, target: str, *, up: bool, delivery_id: int | None = None
) -> None:
    """Every pending delivery of a target that just came `up`; of one that
    just went down, those due by its first probe; or one more, failed while
    it is down (rows.LINE_UP_BY_ARRIVAL)."""
    if up:
        connection.execute(LINE_UP_ALL, (target,))
    elif delivery_id is None:
        connection.execute(LINE_UP_DOWN, (target, target))
    else:
        connection.execute(LINE_UP_ONE_DOWN, (target, target, delivery_id))
