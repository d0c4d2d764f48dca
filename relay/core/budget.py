"""What one template render may spend, and the error for a render that cannot be done.

Every render draws on a budget of operations, sizes and time (the sandbox,
relay/templates/sandbox.py, spends it). Kept apart from Jinja2 so that ingress and the
targets can set budgets and catch TemplateError without importing it: a relay
whose config has no template (and whose dashboard is not opened) never loads
Jinja2, ~2 MiB.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from collections.abc import Iterator
from dataclasses import dataclass

# Output beyond this is an error, not a silently truncated message; it is also
# the largest string, list or number of digits any one operation may build.
MAX_OUTPUT_CHARS = 1024 * 1024
MAX_SIZE = MAX_OUTPUT_CHARS
MAX_INT_BITS = 16_384  # ~4,900 digits: more than any amount or id needs
# Calls, lookups and loop iterations one render may make.
MAX_OPERATIONS = 1_000_000
# How long one render may run: on the event loop (keys, `when` conditions)
# every other request waits meanwhile; in a worker thread (target bodies)
# it only holds that one delivery.
LOOP_SECONDS = 0.05
WORKER_SECONDS = 2.0
_CLOCK_EVERY = 256  # operations between two looks at the clock


class TemplateError(Exception):
    """A template could not be rendered for this payload (missing field, bad output)."""


@dataclass
class _Budget:
    operations: int
    deadline: float
    seconds: float
    worker: bool
    tick: int = 0
    shared: bool = False  # several renders draw on it (see one_budget)


_budget: contextvars.ContextVar[_Budget] = contextvars.ContextVar("template_budget")


def _new_budget(*, shared: bool = False) -> _Budget:
    try:
        asyncio.get_running_loop()
        worker = False
    except RuntimeError:
        worker = True
    seconds = WORKER_SECONDS if worker else LOOP_SECONDS
    return _Budget(MAX_OPERATIONS, time.perf_counter() + seconds, seconds, worker, shared=shared)


def start_budget() -> contextvars.Token[_Budget] | None:
    """A budget for one render, or None when it draws on a shared one."""
    current = _budget.get(None)
    if current is not None and current.shared:
        if current.operations == MAX_OPERATIONS:  # its first render: the clock starts now
            current.deadline = time.perf_counter() + current.seconds
        return None
    return _budget.set(_new_budget())


def end_budget(token: contextvars.Token[_Budget] | None) -> None:
    if token is not None:
        _budget.reset(token)


@contextlib.contextmanager
def one_budget() -> Iterator[None]:
    """Every render within shares one budget: ingress gives a request's key and
    `when` conditions LOOP_SECONDS together, not each."""
    token = _budget.set(_new_budget(shared=True))
    try:
        yield
    finally:
        _budget.reset(token)


def spend(amount: int = 1) -> None:
    budget = _budget.get(None)
    if budget is None:
        return
    budget.operations -= amount
    if budget.operations < 0:
        raise TemplateError(f"template too expensive: more than {MAX_OPERATIONS} operations")
    budget.tick += amount
    if budget.tick >= _CLOCK_EVERY:
        budget.tick = 0
        if time.perf_counter() > budget.deadline:
            raise TemplateError(
                f"template too expensive: took longer than {budget.seconds * 1000:g} ms"
            )
        if budget.worker:
            # Hand the GIL over now and then: otherwise the event loop thread
            # waits up to the 5 ms switch interval each time it needs it back
            # (after every socket call), and one render slows every request.
            time.sleep(0)


def check_size(size: int, what: str) -> None:
    if size > MAX_SIZE:
        raise TemplateError(
            f"template too expensive: {what} would be {size} long (at most {MAX_SIZE})"
        )


def check_bits(bits: float) -> None:
    if bits > MAX_INT_BITS:
        raise TemplateError(f"template too expensive: a number of more than {MAX_INT_BITS} bits")


def on_loop() -> bool:
    """The render under way runs on the event loop (not in a worker thread)."""
    budget = _budget.get(None)
    return budget is not None and not budget.worker
