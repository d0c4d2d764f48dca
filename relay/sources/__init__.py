"""Sources: one module a sender (relay/sources/<name>.py), each holding its
settings, the profile that verifies its requests, names its events and
answers it, and its `KIND`; relay.kinds registers them. What a profile
decides is a value (relay.sources.base)."""

from __future__ import annotations

from relay.sources.base import Accept, Check, Ping, Reject, Source

__all__ = ["Accept", "Check", "Ping", "Reject", "Source"]
