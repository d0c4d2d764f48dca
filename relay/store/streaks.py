"""A route's failed attempts in a row at a target (the Streaks role): the
rule and its SQL, one for both backends.

A batch of runs is counted in one transaction: the rows of its (route,
target) pairs are read (locked, on PostgreSQL), the runs applied to them in
order in memory (`counted`), and the rows that changed written. A pair's row
stays once made, at 0 while the pair is not failing: one row per route and
target the config has had. A batch of runs that all got through, on pairs
not failing, changes nothing and writes nothing: a healthy relay's batches
are read, not written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from relay.store.base import RouteRun, RouteStreak
from relay.store.columns import ROUTE_STREAKS
from relay.store.shape import Row

Key = tuple[str, str]

COLUMNS = ROUTE_STREAKS.columns
FAILING = f"SELECT {COLUMNS} FROM route_streaks WHERE failures > 0"
# (route, target, failures, last_error, updated_at)
WRITE = (
    "INSERT INTO route_streaks (route, target, failures, last_error, updated_at)"
    " VALUES (?, ?, ?, ?, ?) ON CONFLICT (route, target) DO UPDATE SET"
    " failures = excluded.failures, last_error = excluded.last_error,"
    " updated_at = excluded.updated_at"
)


def streaks_of(rows: Sequence[Row]) -> dict[Key, RouteStreak]:
    """Rows of COLUMNS by (route, target)."""
    return dict(map(ROUTE_STREAKS.from_row, rows))


def nothing_to_count(failing: Mapping[Key, RouteStreak], runs: Sequence[RouteRun]) -> bool:
    """Every run got through, on a pair that is not failing (`failing`: the
    pairs that are): counting them changes nothing."""
    return all(run.failures == 0 and (run.route, run.target) not in failing for run in runs)


def counted(
    streaks: Mapping[Key, RouteStreak], runs: Sequence[RouteRun]
) -> tuple[list[tuple[int, int]], dict[Key, RouteStreak]]:
    """Each run's streak before and after it, counted in order from `streaks`
    (a pair missing is at 0); and the pairs whose row changed, as they end."""
    answers = []
    changed: dict[Key, RouteStreak] = {}
    for run in runs:
        key = (run.route, run.target)
        streak = changed.get(key) or streaks.get(key) or RouteStreak(0, None)
        before = streak.failures
        after = before + run.failures if run.failures else 0
        answers.append((before, after))
        written = RouteStreak(after, run.error if run.failures else None)
        if written != streak:
            changed[key] = written
    return answers, changed
