"""Recording attempts on PostgreSQL, a batch per transaction (relay.store.postgres.batch).

Every attempt writes its row, its delivery's new state and what it changed
of its target's health, as the step that follows it says
(relay.delivery.step), asked under the target's row lock: instances record
attempts of one target at once, and the step must see them in turn.
Recorded one transaction each, every attempt waited for the previous one's
commit on that lock. So:

- a run of successes on targets that are up is written in bulk: one INSERT
  of their rows, one UPDATE of their deliveries, the rule asked attempt by
  attempt in memory. Most change nothing of their targets' rows (a success
  after a success): such a run locks none, and waits for no other instance.
  The others write each changed row once, having locked them;
- anything else (a failure, a probe, a target coming back up, a record made
  again after its answer was lost) attempt by attempt, in order, as alone,
  under the locks of its targets' rows.

A batch locks its targets' rows in name order (two batches never wait on
each other in a cycle).

As on SQLite (relay.store.sqlite.record); only the I/O differs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import relay.store.rows as rows
from relay.store.base import History, RetryAt, Status, Step, TargetHealth
from relay.store.columns import HEALTH, HISTORY
from relay.store.dialect import numbered
from relay.store.postgres.cluster import TargetLimits
from relay.store.postgres.errors import Connection
from relay.store.postgres.supersede import (
    delivered_while_waiting,
    resolve_originals,
    settle_attempt,
)
from relay.store.postgres.writes import NEXT_IN_LINE, lock_lines
from relay.store.record import RecordJob, successes_health
from relay.store.rows import NEW_ATTEMPT, delivery_after

# A down target's line (rows.LINE_UP_BY_ARRIVAL), numbered.
LINE_UP_ALL = numbered(rows.LINE_UP_ALL)  # (target)
LINE_UP_DOWN = numbered(rows.LINE_UP_DOWN)  # (target, target)
LINE_UP_ONE_DOWN = numbered(rows.LINE_UP_ONE_DOWN)  # (target, target, delivery id)
# Only while the lease is still this instance's: one taken over (the attempt
# outlived it) is the new owner's to decide, and its attempt may be under
# way. The attempt itself happened all the same, and is kept.
# With the corrected copy a person made while the attempt was under way, if
# one was (relay.store.supersede): its row as written, so as it was once a
# resend that linked it committed.
DELIVERY_UPDATE = """
UPDATE deliveries SET status = $1, attempts = $2, cycle_attempts = $3, next_attempt_at = $4,
    lease_until = NULL, lease_owner = NULL, last_error = $5, updated_at = $6,
    resume_status = NULL, resume_at = NULL
WHERE id = $7 AND status = 'in_flight' AND lease_owner = $8
RETURNING resolved_by
"""
# Successes on targets that are up, in one statement: their attempts, their
# deliveries (those whose lease was still this instance's, as DELIVERY_UPDATE),
# the next of each ordering line they were at the head of (as NEXT_IN_LINE:
# the statement sees the rows as they were before it, so the delivered ones,
# still in flight there, are left out by id), and their targets' health;
# it returns those a corrected copy was made for while they were under way
# (relay.store.supersede), each with the copy's delivery.
SUCCESSES = f"""
WITH attempt AS ({NEW_ATTEMPT.from_arrays()}
), done AS (
    UPDATE deliveries SET status = u.status, attempts = u.attempts, cycle_attempts = u.cycle,
        next_attempt_at = u.next_at, lease_until = NULL, lease_owner = NULL,
        last_error = u.error, updated_at = u.now, resume_status = NULL, resume_at = NULL
    FROM unnest($14::text[], $15::int[], $16::int[], $17::float8[], $18::text[],
        $19::float8[], $20::bigint[]) AS u(status, attempts, cycle, next_at, error, now, id)
    WHERE deliveries.id = u.id AND deliveries.status = 'in_flight'
    AND deliveries.lease_owner = $21
    RETURNING deliveries.id, deliveries.target, deliveries.order_key, deliveries.resolved_by
), health AS (
    UPDATE targets SET last_success_at = h.at, consecutive_failures = 0, down_streak = 0,
        successes = h.successes
    FROM unnest($22::text[], $23::float8[], $24::bigint[]) AS h(name, at, successes)
    WHERE targets.name = h.name
), moved AS (
    UPDATE deliveries SET next_attempt_at = $25, updated_at = $25
    WHERE id IN (
        SELECT (SELECT n.id FROM deliveries n
                WHERE n.target = d.target AND n.order_key = d.order_key
                AND n.status IN ('pending', 'in_flight', 'dead')
                AND n.id NOT IN (SELECT id FROM done)
                ORDER BY n.id LIMIT 1)
        FROM done d WHERE d.order_key IS NOT NULL)
    AND status = 'pending' AND next_attempt_at IS NULL
)
SELECT id, resolved_by FROM done WHERE resolved_by IS NOT NULL
"""
# The success columns a success's step sets, in SUCCESSES's order.
SUCCESS_COLUMNS = ("last_success_at", "successes")
# Targets' health by name.
HEALTH_BY_NAME = HEALTH.keyed("name")
READ_HEALTH = f"SELECT {HEALTH_BY_NAME.columns} FROM targets WHERE name = ANY($1::text[])"
LOCK_TARGETS = f"{READ_HEALTH} ORDER BY name FOR UPDATE"
# An attempt's row, recorded alone.
INSERT_ATTEMPT = numbered(NEW_ATTEMPT.insert + NEW_ATTEMPT.row)


@dataclass(eq=False)
class Record:
    """One attempt to record; `first`: the answer of its earlier record that
    failed once its transaction had run (it may have committed)."""

    job: RecordJob
    instance_id: str
    limits: Mapping[str, TargetLimits]
    first: Step | None = None
    answer: Step | None = None  # once its batch ran to its end

    @property
    def key(self) -> tuple[int, int, float]:
        return (self.job.delivery.id, self.job.attempt.number, self.job.attempt.started_at)


async def record_batch(connection: Connection, records: Sequence[Record]) -> list[Step]:
    """Record a batch in the caller's transaction; each one's Step, in order."""
    for record in records:
        record.answer = None
    lined = [record.job.delivery.id for record in records if record.job.delivery.order_key]
    if lined:
        await lock_lines(connection, lined)
    targets = sorted({record.job.delivery.target for record in records})
    simple = all(record.first is None and record.job.simple_success for record in records)
    if simple:
        # Successes after successes change nothing of their targets' rows
        # (relay.delivery.step): read unlocked, they take no lock, and wait for
        # no other instance's records. Were a failure recorded meanwhile, they
        # are the successes just before it.
        health = await _health(connection, targets, READ_HEALTH)
        if _all_up(health, targets):
            steps, changed = successes_health([record.job for record in records], health)
            if not changed:
                await _successes(connection, records, {})
                return _answered(records, steps)
    health = await _health(connection, targets, LOCK_TARGETS)
    if simple and _all_up(health, targets):
        steps, changed = successes_health([record.job for record in records], health)
        await _successes(connection, records, changed)
    else:
        steps = [await _one(connection, record) for record in records]
    return _answered(records, steps)


def _answered(records: Sequence[Record], steps: list[Step]) -> list[Step]:
    for record, step in zip(records, steps, strict=True):
        record.answer = step
    return steps


def _all_up(health: dict[str, TargetHealth], targets: list[str]) -> bool:
    """Every target up and in no throttle's episode: a success changes only
    SUCCESSES's columns of their rows."""
    return len(health) == len(targets) and all(
        health[t].down_since is None and health[t].throttles == 0 for t in targets
    )


async def _health(
    connection: Connection, targets: list[str], query: str
) -> dict[str, TargetHealth]:
    """The targets' health (columns.HEALTH), by READ_HEALTH or LOCK_TARGETS
    (which locks their rows in name order, making those missing first)."""
    rows_now = await connection.fetch(query, targets)
    if len(rows_now) < len(targets) and query is LOCK_TARGETS:  # a target's first attempt
        await connection.execute(
            "INSERT INTO targets (name) SELECT unnest($1::text[]) ON CONFLICT (name) DO NOTHING",
            targets,
        )
        rows_now = await connection.fetch(LOCK_TARGETS, targets)
    return dict(map(HEALTH_BY_NAME.from_row, rows_now))


async def _successes(
    connection: Connection, records: Sequence[Record], changed: dict[str, dict[str, Any]]
) -> None:
    """Successes on targets that are up (RecordJob.simple_success), in one
    statement, with the targets' rows that changed (successes_health)."""
    jobs = [record.job for record in records]
    attempts = [list(values) for values in zip(*(job.attempt_row() for job in jobs), strict=True)]
    updates = [list(values) for values in zip(*(job.delivery_row() for job in jobs), strict=True)]
    names = sorted(changed)
    now = max(job.now for job in jobs)
    waited = await connection.fetch(
        SUCCESSES,
        *attempts,
        *updates,
        records[0].instance_id,
        names,
        *([changed[name][column] for name in names] for column in SUCCESS_COLUMNS),
        now,
    )
    # A statement after the one that wrote them: it sees the copies' deliveries.
    for delivery_id, copy in waited:
        await delivered_while_waiting(connection, delivery_id, copy, now)


async def _one(connection: Connection, record: Record) -> Step:
    """One attempt, every rule asked in order (its target's row already locked)."""
    job, delivery = record.job, record.job.delivery
    if record.first is not None:
        # This record failed after its transaction ran: it may have committed
        # (its answer lost), or still be committing. Its lock on the delivery
        # says when that transaction ended.
        await connection.execute(
            "SELECT 1 FROM deliveries WHERE id = $1 FOR NO KEY UPDATE", delivery.id
        )
        if await connection.fetchval(
            "SELECT EXISTS (SELECT 1 FROM attempts"
            " WHERE delivery_id = $1 AND number = $2 AND started_at = $3)",
            *record.key,
        ):
            return record.first  # it did commit: kept once, with its answer
    step = job.decided(*await _standing(connection, delivery.target, delivery.id))
    await connection.execute(INSERT_ATTEMPT, *job.attempt_row())
    updated = await connection.fetchrow(DELIVERY_UPDATE, *job.delivery_row(), record.instance_id)
    held = updated is not None
    if updated is not None and updated[0] is not None:
        # A corrected copy was made while this attempt was under way.
        step = await settle_attempt(connection, delivery, updated[0], step, job.now)
    status, _, _ = delivery_after(step.then, None)
    if held and status is Status.DELIVERED:
        await connection.execute(NEXT_IN_LINE, job.now, job.now, delivery.id)
        await resolve_originals(
            connection, delivery.id, delivery.event_id, delivery.resolves, job.now
        )
    then = step.then
    if isinstance(then, RetryAt) and then.hold_until is not None:
        await _hold_paces(connection, record.limits.get(delivery.target), then.hold_until)
    streak = await _write_step(connection, delivery.target, delivery.id, step)
    if streak.came_up:
        await connection.execute(LINE_UP_ALL, delivery.target)
    elif streak.went_down:
        await connection.execute(LINE_UP_DOWN, delivery.target, delivery.target)
    elif held and streak.down and isinstance(then, RetryAt):
        await connection.execute(LINE_UP_ONE_DOWN, delivery.target, delivery.target, delivery.id)
    return step if streak is step.streak else replace(step, streak=streak)


async def _hold_paces(connection: Connection, limits: TargetLimits | None, until: float) -> None:
    """A receiver's wait holds the paces it is about (a rate group's, a
    Telegram chat's) for every instance: none claims for them before `until`
    (cluster.allowed reads these rows). The target itself is held by its
    row's throttled_until."""
    names = list(limits.held_paces) if limits is not None else []
    if names:
        await connection.execute(
            "UPDATE pacing SET next_at = GREATEST(next_at, $1) WHERE name = ANY($2::text[])",
            until,
            names,
        )


async def _standing(
    connection: Connection, target: str, delivery_id: int
) -> tuple[TargetHealth, History]:
    """What the step reads: the target's row (locked by record_batch) and the
    delivery's memory of failing (its lease is held: never purged)."""
    health = await connection.fetchrow(
        f"SELECT {HEALTH.columns} FROM targets WHERE name = $1", target
    )
    assert health is not None  # inserted by record_batch
    history = await connection.fetchrow(
        f"SELECT {HISTORY.columns} FROM deliveries WHERE id = $1", delivery_id
    )
    assert history is not None
    return HEALTH.from_row(health), HISTORY.from_row(history)


async def _write_step(connection: Connection, target: str, delivery_id: int, step: Step) -> Any:
    """As SQLite's write_step: the target's row, the delivery's memory of failing,
    and the streak with how many deliveries waited when the target came up."""
    await _write_health(connection, target, step.target)
    if step.remember is not None:
        await connection.execute(
            "UPDATE deliveries SET seen_successes = $1, fails_alone = $2 WHERE id = $3",
            step.remember.seen_successes,
            step.remember.fails_alone,
            delivery_id,
        )
    if not step.count_waiting:
        return step.streak
    waited = await connection.fetchval(
        "SELECT COUNT(*) FROM deliveries WHERE status = 'pending' AND target = $1", target
    )
    return replace(step.streak, waited=waited)


async def _write_health(connection: Connection, target: str, columns: dict[str, Any]) -> None:
    if columns:
        assignments = ", ".join(
            f"{column} = ${number}" for number, column in enumerate(columns, start=1)
        )
        await connection.execute(
            f"UPDATE targets SET {assignments} WHERE name = ${len(columns) + 1}",
            *columns.values(),
            target,
        )
