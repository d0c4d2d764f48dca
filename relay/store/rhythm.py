"""What the silence watch keeps (the Rhythms role): its SQL, for both
backends. The rule that reads it is relay.background.silence; the rows are
written by the leading instance alone, a pass of its learning in one
transaction."""

from __future__ import annotations

from typing import Any

from relay.store.base import Learned
from relay.store.columns import ARRIVAL, ROUTE_WATCH, ROUTE_WATCHES

# (after, limit)
ARRIVALS = f"SELECT {ARRIVAL.columns} FROM events WHERE id > ? ORDER BY id LIMIT ?"
WATCHES = f"SELECT {ROUTE_WATCHES.columns} FROM route_watch"
LEARNT_THROUGH = "SELECT learnt_through FROM rhythm_progress WHERE id = 1"
# (slot, first week, week past the last)
RHYTHM_AT = (
    "SELECT route, week, longest FROM route_rhythm WHERE slot = ? AND week >= ? AND week < ?"
)
# A route's first and last event learnt: (route, first, last). {least},
# {greatest}: the dialect's.
SEEN = (
    "INSERT INTO route_watch (route, first_event_at, last_event_at) VALUES (?, ?, ?)"
    " ON CONFLICT (route) DO UPDATE SET"
    " first_event_at = {least}(route_watch.first_event_at, excluded.first_event_at),"
    " last_event_at = {greatest}(route_watch.last_event_at, excluded.last_event_at)"
)
# (slot, route, week, seconds)
LONGEST = (
    "INSERT INTO route_rhythm (slot, route, week, longest) VALUES (?, ?, ?, ?)"
    " ON CONFLICT (slot, route, week) DO UPDATE SET"
    " longest = {greatest}(route_rhythm.longest, excluded.longest)"
)
PRUNE = "DELETE FROM route_rhythm WHERE week < ?"  # (first week kept)
LEARNT = "UPDATE rhythm_progress SET learnt_through = ? WHERE id = 1 AND learnt_through < ?"
# A silent route that received again, as it was; then silent no more: (route).
SILENT = (
    f"SELECT {ROUTE_WATCH.columns} FROM route_watch WHERE route = ? AND silent_since IS NOT NULL"
)
NOT_SILENT = (
    "UPDATE route_watch SET silent_since = NULL, silent_usual = NULL, silent_limit = NULL"
    " WHERE route = ?"
)
# (since, usual, limit, route): only if it is not said silent already.
MARK_SILENT = (
    "UPDATE route_watch SET silent_since = ?, silent_usual = ?, silent_limit = ?"
    " WHERE route = ? AND silent_since IS NULL"
)


def seen_rows(learned: Learned) -> list[tuple[Any, ...]]:
    """SEEN's rows of a pass."""
    return [(route, first, last) for route, (first, last) in learned.seen.items()]


def longest_rows(learned: Learned) -> list[tuple[Any, ...]]:
    """LONGEST's rows of a pass."""
    return [(slot, route, week, s) for (route, week, slot), s in learned.longest.items()]
