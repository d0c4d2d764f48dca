"""Recording attempts: what both backends decide and write of each.

Every attempt writes its row (rows.NEW_ATTEMPT), its delivery's new state
and its target's health, as the step that follows it (relay.delivery.step)
says, asked with the target's row read in the same transaction. A run of
attempts waiting for the same group commit that all succeeded, on targets
that are up, is written in bulk, and the step asked attempt by attempt in
memory (successes_health): a target's row is written once if any of them
changed it (most change nothing: a success after a success). Each backend
runs the statements its way: relay.store.sqlite.record on the writer
thread, relay.store.postgres.record under the targets' row locks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from relay.core.outcome import Verdict
from relay.store.base import (
    AttemptRecord,
    ClaimedDelivery,
    Decide,
    History,
    Step,
    TargetHealth,
)
from relay.store.rows import attempt_values, delivery_after


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

    @property
    def simple_success(self) -> bool:
        """A success that the bulk path records exactly as one at a time
        would: on a target that is up (the bulk path reads only those), it is
        delivered, and what it changes of its target is a success's columns alone."""
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
        """Its attempt's row (rows.NEW_ATTEMPT)."""
        assert self.step is not None
        _, next_at, _ = delivery_after(self.step.then, self.attempt.error)
        number = self.cycle if self.step.in_cycle else None
        return attempt_values(self.delivery.id, self.attempt, next_at, number)

    def delivery_row(self) -> tuple[object, ...]:
        """Its delivery's new state: (status, attempts, cycle_attempts,
        next_attempt_at, last_error, updated_at, id)."""
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
