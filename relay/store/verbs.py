"""What an operator's verb on one delivery (retry, skip) found, as values.

A backend's transaction answers the delivery's new view, `Missing`, or
`NotApplicable` with the delivery's state in words; `outcome` turns the
last two into the store's exceptions, the same on every backend.
"""

from __future__ import annotations

from dataclasses import dataclass

from relay.store.base import Conflict, DeliveryView, NotFound


@dataclass(frozen=True)
class Missing:
    """No delivery has this id."""


@dataclass(frozen=True)
class NotApplicable:
    """The verb does not apply to the delivery as it is: `state` says how it is
    ("delivered", "waiting its turn behind delivery 7 (pending): ...")."""

    state: str


VerbResult = DeliveryView | Missing | NotApplicable


def outcome(delivery_id: int, result: VerbResult) -> DeliveryView:
    if isinstance(result, Missing):
        raise NotFound(f"no delivery {delivery_id}")
    if isinstance(result, NotApplicable):
        raise Conflict(f"delivery {delivery_id} is {result.state}")
    return result
