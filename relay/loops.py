"""The event loop: uvloop when it is installed, asyncio's own otherwise. Chosen here only."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop
    return uvloop.new_event_loop
