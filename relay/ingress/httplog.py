"""Requests refused for what the client sent: one line each, rate-limited.

aiohttp logs every malformed request (bad request line, oversized header, a
client that hangs up mid-body) as an ERROR with an 11-line traceback. A few
hundred of them exhaust journald's default rate limit, and then relay's own
attempt lines are suppressed with them. Both listeners log through this
logger instead (the admin listener's aiohttp through the filter, ingress's
own HTTP/1.1 protocol through `refused`): a request refused for what the
client sent is one WARNING line, at most LINES_PER_WINDOW per window, with
the count of lines left out. Anything else (a bug in a handler) keeps its
traceback.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from aiohttp.http_exceptions import HttpProcessingError

LINES_PER_WINDOW = 10
WINDOW_SECONDS = 10.0

server_log = logging.getLogger("relay.http")


class RefusedRequests(logging.Filter):
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._clock = clock
        self._window_start = -WINDOW_SECONDS
        self._lines = 0
        self._left_out = 0

    def admit(self) -> int | None:
        """None when this window's lines are used up; else how many lines were
        left out before this one (to say so in it)."""
        now = self._clock()
        if now - self._window_start >= WINDOW_SECONDS:
            self._window_start, self._lines = now, 0
        self._lines += 1
        if self._lines > LINES_PER_WINDOW:
            self._left_out += 1
            return None
        left_out, self._left_out = self._left_out, 0
        return left_out

    def line(self, remote: object, reason: str, left_out: int) -> tuple[str, tuple[object, ...]]:
        msg = "refused a malformed request from %s: %s"
        args: tuple[object, ...] = (remote, " ".join(reason.split())[:200])
        if left_out:
            msg += " (%d more not logged)"
            args += (left_out,)
        return msg, args

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if not isinstance(error, HttpProcessingError | ConnectionError):
            return True
        left_out = self.admit()
        if left_out is None:
            return False
        remote = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
        reason = getattr(error, "message", "") or str(error) or type(error).__name__
        record.msg, record.args = self.line(remote, str(reason), left_out)
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.exc_info = record.exc_text = None
        return True


_refusals = RefusedRequests()
server_log.addFilter(_refusals)


def refused(remote: str | None, reason: str) -> None:
    """One line for a request refused as malformed, within the same rate limit."""
    left_out = _refusals.admit()
    if left_out is not None:
        msg, args = _refusals.line(remote or "?", reason, left_out)
        server_log.warning(msg, *args)
