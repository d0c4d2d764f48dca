"""An error as one line of a log or a message: its type and what it says."""

from __future__ import annotations


def one_line(error: BaseException) -> str:
    """`Type: what it says`, on one line (a driver's message may span several:
    a journal line, or a 503's reason, must not), or the type alone when it
    says nothing (asyncio.TimeoutError())."""
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
