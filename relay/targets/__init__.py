"""Targets: where deliveries go. Each type is one module; `build_target` picks it."""

from __future__ import annotations

from relay.config import FileTarget as FileSettings
from relay.config import HttpTarget as HttpSettings
from relay.config import SmtpTarget as SmtpSettings
from relay.config import TargetConfig
from relay.config import TelegramTarget as TelegramSettings
from relay.targets.alerting import ALERTS_ROUTE, AlertAware, alert_settings
from relay.targets.base import Envelope, Target
from relay.targets.file import FileTarget
from relay.targets.http import HttpTarget
from relay.targets.smtp import SmtpTarget
from relay.targets.telegram import TelegramTarget


def build_target(config: TargetConfig) -> Target:
    """The target, sending alert deliveries with the alert's own subject and text."""
    target = _build(config)
    alert_config = alert_settings(config)
    return target if alert_config is None else AlertAware(target, _build(alert_config))


def _build(config: TargetConfig) -> Target:
    settings = config.settings
    if isinstance(settings, HttpSettings):
        return HttpTarget(config.name, settings, concurrency=config.concurrency)
    if isinstance(settings, FileSettings):
        return FileTarget(config.name, settings.path)
    if isinstance(settings, SmtpSettings):
        return SmtpTarget(config.name, settings)
    if isinstance(settings, TelegramSettings):
        return TelegramTarget(config.name, settings, concurrency=config.concurrency)
    raise TypeError(f"no target type for {type(settings).__name__}")


__all__ = ["ALERTS_ROUTE", "Envelope", "Target", "build_target"]
