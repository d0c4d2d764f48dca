"""Targets: where deliveries go. Each type is one module; `build_target` picks it."""

from __future__ import annotations

from relay.config import FileTarget as FileSettings
from relay.config import HttpTarget as HttpSettings
from relay.config import TargetConfig
from relay.targets.base import Envelope, Target
from relay.targets.file import FileTarget
from relay.targets.http import HttpTarget


def build_target(config: TargetConfig) -> Target:
    settings = config.settings
    if isinstance(settings, HttpSettings):
        return HttpTarget(config.name, settings, concurrency=config.concurrency)
    if isinstance(settings, FileSettings):
        return FileTarget(config.name, settings.path)
    raise TypeError(f"no target type for {type(settings).__name__}")


__all__ = ["Envelope", "Target", "build_target"]
