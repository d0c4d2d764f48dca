"""A corrected copy stops its original: the rule and its SQL, one for both backends.

A person who makes a corrected copy of an event for a target (`resend`) has
decided what that target gets: the copy. The original's delivery to the
target must never go again, or the receiver, which sees each delivery under
an identity of its own, creates the lead twice. So, in the resend's own
transaction, for each target of the copy:

- the delivery the copy stands in for is found: the original's to the
  target, or, when a copy already superseded it, that copy's, along the chain
  (`follows`); the copy's delivery links to it (`resolves`) and it links back
  (`resolved_by`);
- pending or dead, it is **superseded** at once: never claimed, retried or
  requeued again, out of the dead count, and out of its key's line (order_by),
  whose next delivery goes, as after a skip;
- in flight, it is linked only: the copy's delivery is not claimed while that
  attempt is under way (`COPY_FREE`). When the attempt is recorded, a success
  leaves it delivered, unlinked, and the copy skipped, with a reason naming
  it; anything else supersedes it, and the copy goes. An attempt that never
  ends (relay stopped, or died, and its lease is given back or taken over)
  ends as a failed one: superseded, the copy goes (`STOP_UNFINISHED`);
- delivered, skipped or resolved already, it is left as it is.

Whatever then becomes of the copy, the original stays stopped and names it.
Once the copy is delivered, what it superseded is **resolved**, up the chain
(`RESOLVE`). Retention keeps a superseded delivery's event while the copy
that stands for it is unfinished (relay.store.reads.FINISHED).
"""

from __future__ import annotations

from enum import StrEnum

from relay.store.base import Status

# How deep a chain of copies of copies is followed (a loop cannot be made,
# a copy being a new event; the bound is only a guard).
CHAIN_DEPTH = 20

# Which delivery of the original each delivery of a corrected copy stands in
# for, to begin with: the original's to the same target.
LINK_COPY = """
UPDATE deliveries SET resolves = (
    SELECT o.id FROM deliveries o WHERE o.event_id = ? AND o.target = deliveries.target
    ORDER BY o.id LIMIT 1)
WHERE event_id = ?
"""
# A copy's deliveries: (copy event) -> (id, resolves)
COPY_DELIVERIES = "SELECT id, resolves FROM deliveries WHERE event_id = ? ORDER BY id"
# Where a delivery stands, for the chain: (delivery) -> (status, resolved_by)
LINK_STATE = "SELECT status, resolved_by FROM deliveries WHERE id = ?"
# (resolves, copy's delivery)
SET_RESOLVES = "UPDATE deliveries SET resolves = ? WHERE id = ?"
# Pending or dead: stopped now, linked to the copy's delivery that goes
# instead: (copy's delivery, now, delivery).
SUPERSEDE = """
UPDATE deliveries SET status = 'superseded', resolved_by = ?, next_attempt_at = NULL,
    resume_status = NULL, resume_at = NULL, updated_at = ?
WHERE id = ? AND status IN ('pending', 'dead')
"""
# In flight: linked, to end with its attempt: (copy's delivery, delivery). Its
# updated_at is left as the claim wrote it: PostgreSQL knows a claim of its
# own whose answer was lost by it (relay.store.postgres.cluster.lapsed).
MARK_IN_FLIGHT = "UPDATE deliveries SET resolved_by = ? WHERE id = ? AND status = 'in_flight'"
# A copy's delivery (`c`) may be claimed unless what it stands in for is in
# flight and linked to it: it waits for that attempt to end.
COPY_FREE = (
    "(c.resolves IS NULL OR NOT EXISTS (SELECT 1 FROM deliveries o WHERE o.id = c.resolves"
    " AND o.resolved_by = c.id AND o.status = 'in_flight'))"
)
# The same of the row an UPDATE of deliveries is on (a down target's probe).
COPY_FREE_HERE = f"EXISTS (SELECT 1 FROM deliveries c WHERE c.id = deliveries.id AND {COPY_FREE})"
# The attempt of a delivery linked in flight was recorded, and failed: it
# stops, the copy goes: (now, delivery).
SUPERSEDED_AFTER = """
UPDATE deliveries SET status = 'superseded', next_attempt_at = NULL,
    resume_status = NULL, resume_at = NULL, updated_at = ?
WHERE id = ?
"""
# ... and succeeded: the copy that waited is not sent, (reason, now, copy's
# delivery, delivery); the original keeps no link to it, (delivery).
SKIP_WAITING_COPY = """
UPDATE deliveries SET status = 'skipped', next_attempt_at = NULL, resume_status = NULL,
    resume_at = NULL, last_error = ?, updated_at = ?
WHERE id = ? AND resolves = ? AND status = 'pending'
"""
UNLINK = "UPDATE deliveries SET resolved_by = NULL WHERE id = ?"
# A linked delivery whose attempt never ended (a lease given back, or taken
# over): as if it failed. {leases}: the backend's lease columns cleared;
# {which}: the deliveries meant. (now, attempts added, *which's values)
STOP_UNFINISHED = """
UPDATE deliveries SET status = 'superseded', next_attempt_at = NULL, {leases},
    resume_status = NULL, resume_at = NULL, updated_at = ?, attempts = attempts + ?
WHERE status = 'in_flight' AND resolved_by IS NOT NULL AND {which}
RETURNING id, resolved_by
"""
# A delivered copy resolves what it superseded (a dead one too: copies made
# before copies superseded left their original dead), and so on up a chain of
# copies of copies: (copy's delivery, now, delivery).
RESOLVE = """
UPDATE deliveries SET status = 'resolved', resolved_by = ?, next_attempt_at = NULL,
    resume_status = NULL, resume_at = NULL, updated_at = ?
WHERE id = ? AND status IN ('superseded', 'dead')
RETURNING resolves
"""


class OnCopy(StrEnum):
    """What a new corrected copy does to the delivery it stands in for."""

    AT_ONCE = "at_once"  # pending or dead: superseded now
    AFTER_ATTEMPT = "after_attempt"  # in flight: linked, ends with its attempt
    NOTHING = "nothing"  # delivered, skipped, resolved: left as it is


def on_copy(status: Status) -> OnCopy:
    if status in (Status.PENDING, Status.DEAD):
        return OnCopy.AT_ONCE
    if status is Status.IN_FLIGHT:
        return OnCopy.AFTER_ATTEMPT
    return OnCopy.NOTHING


def follows(status: Status, resolved_by: int | None) -> int | None:
    """The next delivery along a chain of copies: a superseded one's copy, which
    a newer copy stops in its place (two copies of one original must not
    both go)."""
    return resolved_by if status is Status.SUPERSEDED else None


# History lines (kind "superseded", "copy", "skip") and reasons.
SUPERSEDED = "superseded"
COPY = "copy"


def superseded_now(was: str, copy: int, copy_event: int) -> str:
    return (
        f"not sent again (was {was}): delivery {copy} of event {copy_event},"
        " a corrected copy, goes instead"
    )


def waits_for_attempt(copy: int, copy_event: int) -> str:
    return (
        f"a corrected copy, delivery {copy} of event {copy_event}, waits for this attempt:"
        " sent if it fails, skipped if it succeeds"
    )


def superseded_after(copy: int) -> str:
    return (
        "not sent again: its attempt failed while a corrected copy waited;"
        f" delivery {copy} goes instead"
    )


def superseded_unfinished(copy: int) -> str:
    return (
        "not sent again: its attempt was cut short while a corrected copy waited;"
        f" delivery {copy} goes instead"
    )


def delivered_while_waiting(copy: int) -> str:
    return f"delivered while a corrected copy waited: delivery {copy} is skipped"


def copy_not_needed(original: int) -> str:
    return f"not sent: delivery {original}, the original, was delivered while this copy waited"


def resolved_by_copy(copy: int, copy_event: int) -> str:
    return f"a corrected copy was delivered: delivery {copy} of event {copy_event}"
