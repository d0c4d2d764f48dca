"""What a kind of target or source is, declared once for every part of relay.

A kind is one module. A target type is `relay/targets/<type>.py`: its
settings and how they are read, the target that sends (its client imported
when it starts, not when a config is read), and its `KIND` (a `TargetKind`:
how it is built and shown, which settings are credentials). A source is
`relay/sources/<name>.py`: its settings, the profile that checks and names
its requests, and its `KIND` (a `SourceKind`: its credentials, its sender's
own retry window). This package holds only the declarations: `TargetKind`
and `SourceKind` (base), what a target is given and does (target), what a
source decides (source). The registry that lists every kind is
relay.loader.registry.
"""

from __future__ import annotations

from relay.kinds.base import AlertTemplates, SenderRetry, SourceKind, TargetKind

__all__ = ["AlertTemplates", "SenderRetry", "SourceKind", "TargetKind"]
