"""What aiohttp's server says about requests it refused: one line each, rate-limited.

aiohttp logs every malformed request (bad request line, oversized header, a
client that hangs up mid-body) as an ERROR with an 11-line traceback. A few
hundred of them exhaust journald's default rate limit, and then relay's own
attempt lines are suppressed with them. Both listeners log through this
logger instead: a request refused for what the client sent is one WARNING
line, at most LINES_PER_WINDOW per window, with the count of lines left out.
Anything else (a bug in a handler) keeps its traceback.
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

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if not isinstance(error, HttpProcessingError | ConnectionError):
            return True
        now = self._clock()
        if now - self._window_start >= WINDOW_SECONDS:
            self._window_start, self._lines = now, 0
        self._lines += 1
        if self._lines > LINES_PER_WINDOW:
            self._left_out += 1
            return False
        remote = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
        reason = getattr(error, "message", "") or str(error) or type(error).__name__
        record.msg = "refused a malformed request from %s: %s"
        record.args = (remote, " ".join(str(reason).split())[:200])
        if self._left_out:
            record.msg += " (%d more not logged)"
            record.args += (self._left_out,)
            self._left_out = 0
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.exc_info = record.exc_text = None
        return True


server_log.addFilter(RefusedRequests())
