"""The kinds of target relay knows: each is one module, registered here.

Adding a target type is writing `relay/kinds/<type>.py` with its `KIND` (a
`TargetKind`: how its settings are read, how it is built and shown, which
settings are credentials) and adding it to `TARGET_KINDS`; nothing else in
relay names a type. `register_target` adds one at run time (tests do).
"""

from __future__ import annotations

from typing import Any

from relay.kinds import file, http, smtp, telegram
from relay.kinds.base import TargetKind

TARGET_KINDS: dict[str, TargetKind[Any]] = {
    kind.name: kind for kind in (http.KIND, file.KIND, smtp.KIND, telegram.KIND)
}


def register_target(kind: TargetKind[Any]) -> None:
    if kind.name in TARGET_KINDS:
        raise ValueError(f"a target type {kind.name!r} is already registered")
    TARGET_KINDS[kind.name] = kind


def unregister_target(name: str) -> None:
    del TARGET_KINDS[name]


def target_kind(name: str) -> TargetKind[Any]:
    return TARGET_KINDS[name]


__all__ = ["TARGET_KINDS", "TargetKind", "register_target", "target_kind", "unregister_target"]
