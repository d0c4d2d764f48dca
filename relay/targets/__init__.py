"""Targets: where deliveries go. Each type is one kind (relay.kinds), which builds it."""

from __future__ import annotations

from relay.config import TargetConfig
from relay.kinds import target_kind
from relay.targets.alerting import ALERTS_ROUTE, AlertAware, alert_settings
from relay.targets.base import Envelope, Target


def build_target(config: TargetConfig) -> Target:
    """The target, sending alert deliveries with the alert's own subject and text."""
    target = _build(config)
    alert_config = alert_settings(config)
    return target if alert_config is None else AlertAware(target, _build(alert_config))


def _build(config: TargetConfig) -> Target:
    return target_kind(config.type).build(config.name, config.settings, config.concurrency)


__all__ = ["ALERTS_ROUTE", "Envelope", "Target", "build_target"]
