"""One vocabulary for a delivery's life: its words are the values stored and shown.

    pending ──leased──▶ in_flight ──attempt──▶ delivered
       ▲                    │
       └──── retry ─────────┤
                            └──────────────▶ dead
    skipped: never sent (its route's `when` said no, or a person skipped it)
    superseded: pending or dead (or in flight, once that attempt failed) when
        a person made a corrected copy for its target: never sent again, the
        copy's delivery goes instead ──that copy delivered──▶ resolved

`Status` is a delivery's state: the `status` column of both backends, the
API's and the CLI's `status`, `relay events --status`. An attempt leaves it
delivered, pending or dead (relay.delivery.step decides which).
What a target says of one attempt is its `Verdict` (relay.core.outcome: the
attempts' `outcome` column). Logs and metrics say what an attempt came to in
ATTEMPT_OUTCOMES: the verdict's words, but the attempt that ends a delivery
is said as the state it leaves it in, dead.
"""

from __future__ import annotations

from enum import StrEnum

from relay.core.outcome import Verdict


class Status(StrEnum):
    PENDING = "pending"
    IN_FLIGHT = "in_flight"
    DELIVERED = "delivered"
    DEAD = "dead"
    SKIPPED = "skipped"
    # A person made a corrected copy of its event for its target: it is not
    # sent again, the copy's delivery goes instead (DeliveryView.resolved_by).
    SUPERSEDED = "superseded"
    # Superseded (or dead, before copies superseded), then the corrected copy
    # was delivered to the same target: nothing is left to do for it.
    RESOLVED = "resolved"


# What an attempt came to, in logs (outcome=) and metrics (relay_attempts_total):
# success, retry (it will be tried again), dead (the attempt that ended it).
ATTEMPT_OUTCOMES = (Verdict.SUCCESS.value, Verdict.RETRY.value, Status.DEAD.value)


def attempt_outcome(verdict: Verdict, next: Status) -> str:
    """An attempt in ATTEMPT_OUTCOMES' words: the attempt that ends a delivery
    is "dead" (a permanent failure or the last retry), never "fail" in one
    place and "dead" in another; the stored attempt keeps the target's verdict
    (`fail`: no retry could help), which `relay show` prints."""
    if verdict is Verdict.SUCCESS:
        return Verdict.SUCCESS.value
    return Status.DEAD.value if next is Status.DEAD else Verdict.RETRY.value
