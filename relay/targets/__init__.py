"""Targets: where deliveries go. A type is one module here (its settings, the
target that sends, its `KIND`); relay.kinds registers them and builds one
for a config (`build_target`)."""

from __future__ import annotations

from relay.targets.alerting import ALERTS_ROUTE
from relay.targets.base import Envelope, Target

__all__ = ["ALERTS_ROUTE", "Envelope", "Target"]
