"""The kinds of target and source relay knows: each is one module, registered here.

A kind is one module. A target type is `relay/targets/<type>.py`: its
settings and how they are read, the target that sends (its client imported
when it starts, not when a config is read), and its `KIND` (a `TargetKind`:
how it is built and shown, which settings are credentials), added to
`TARGET_KINDS`. A source is `relay/sources/<name>.py`: its settings, the
profile that checks and names its requests, and its `KIND` (a `SourceKind`:
its credentials, its sender's own retry window), added to `SOURCE_KINDS`.
Nothing else in relay names a kind. `register_target` and `register_source`
add one at run time (tests do).
"""

from __future__ import annotations

import importlib
from typing import Any

from relay.kinds.base import AlertTemplates, SenderRetry, SourceKind, TargetKind

# The registry (relay.kinds.registry) imports every kind's module, and each of
# those imports the declarations above: it is loaded on first use of one of
# its names, so that a kind's module importing relay.kinds.base never runs the
# registry that imports it (no import runs in a circle).
_REGISTRY = (
    "SECRET_HEADERS",
    "SOURCE_KINDS",
    "TARGET_KINDS",
    "build_source",
    "build_target",
    "register_source",
    "register_target",
    "source_kind",
    "target_kind",
    "unregister_source",
    "unregister_target",
)


def __getattr__(name: str) -> Any:
    if name not in _REGISTRY:
        raise AttributeError(f"module 'relay.kinds' has no attribute {name!r}")
    return getattr(importlib.import_module("relay.kinds.registry"), name)


__all__ = ["AlertTemplates", "SenderRetry", "SourceKind", "TargetKind", *_REGISTRY]
