"""Log setup (text or JSON lines on stdout), and the one line every attempt writes.

Every line passes through the masker last, tracebacks included, so a
configured secret cannot reach the journal by any path.
"""

from __future__ import annotations

import logging
import re
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import orjson

from relay.config import Config, LogConfig
from relay.core.printable import printable_lines
from relay.core.records import next_due, next_status
from relay.core.secrets import Masker
from relay.core.status import Status
from relay.ops.views import iso

if TYPE_CHECKING:
    from relay.delivery.scheduler import AttemptReport

attempt_log = logging.getLogger("relay.attempts")


# Every delivery attempt writes a line: the date and time up to the second are
# formatted once a second, not once a line (a fifth of a line's cost).
_second: tuple[int, str] = (-1, "")


def _timestamp(record: logging.LogRecord) -> str:
    global _second
    whole = int(record.created)
    micro = round((record.created - whole) * 1_000_000)
    if micro == 1_000_000:  # rounds up into the next second, as datetime does
        whole, micro = whole + 1, 0
    second, prefix = _second
    if whole != second:
        prefix = datetime.fromtimestamp(whole, UTC).strftime("%Y-%m-%dT%H:%M:%S.")
        _second = (whole, prefix)
    return f"{prefix}{micro // 1000:03d}Z"


class TextFormatter(logging.Formatter):
    def __init__(self, masker: Masker) -> None:
        super().__init__()
        self.masker = masker

    def format(self, record: logging.LogRecord) -> str:
        line = f"{_timestamp(record)} {record.levelname} {record.name} {record.getMessage()}"
        fields: dict[str, Any] | None = getattr(record, "fields", None)
        if fields:
            line += " " + _text_fields(fields)
        # ESC and its kin from whatever a line quotes (a target's answer, a
        # sender's field) would drive the terminal of whoever tails the
        # journal: written as escapes. (JSON lines escape them already.)
        line = printable_lines(line)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return self.masker.text(line)


class JsonFormatter(logging.Formatter):
    def __init__(self, masker: Masker) -> None:
        super().__init__()
        self.masker = masker

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update(getattr(record, "fields", None) or {})
        if record.exc_info:
            entry["traceback"] = self.formatException(record.exc_info)
        return self.masker.text(orjson.dumps(entry).decode())


_NEEDS_QUOTES = re.compile(r'[ "=]')
# Control characters but line breaks and tabs (a message may span lines).


def _text_fields(fields: dict[str, Any]) -> str:
    """key=value pairs, a value quoted when it holds a space, a quote or "=".
    One loop, numbers and None without a look at their text: an attempt's line
    has ten fields, and a call and a regex search for each were a measurable
    share of the line's cost (bench/RESULTS.md)."""
    parts = []
    for key, value in fields.items():
        kind = type(value)
        if kind is int or kind is float:
            parts.append(f"{key}={value}")
        elif value is None:
            parts.append(f"{key}=-")
        else:
            text = str(value)
            if not text or _NEEDS_QUOTES.search(text):
                text = '"' + text.replace('"', '\\"') + '"'
            parts.append(f"{key}={text}")
    return " ".join(parts)


def configure(config: LogConfig, masker: Masker | None = None) -> None:
    # Nothing relay writes names the caller's file and line, the thread or
    # the process: the logging module is told not to look them up for every
    # line (its documented switches).
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    handler = logging.StreamHandler(sys.stdout)
    formatter = JsonFormatter if config.format == "json" else TextFormatter
    handler.setFormatter(formatter(masker or Masker()))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(config.level.upper())
    # aiohttp logs each request at INFO; at webhook rates that drowns the attempt log.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


def reconfigure(config: Config) -> None:
    """A new config (a reload, a token written at start): mask its secrets in
    every line from now on, and keep masking the old ones (lines still being
    written may name them)."""
    for handler in logging.getLogger().handlers:
        formatter = handler.formatter
        if isinstance(formatter, TextFormatter | JsonFormatter):
            formatter.masker = formatter.masker.merged(config.masker)


def attempt_fields(report: AttemptReport) -> dict[str, Any]:
    delivery = report.delivery
    after = next_status(report.then)
    due = next_due(report.then)
    return {
        "event": delivery.event_id,
        "route": delivery.route,
        "target": delivery.target,
        "delivery": delivery.id,
        # Its step of the current cycle ("3/16"); "manual" (a person's retry
        # now) or "probe" (of a down target) for the attempts that are none.
        "attempt": (
            f"{report.cycle_step}/{report.cycle_length}"
            if report.cycle_step is not None
            else report.kind.value
        ),
        "total": report.number,  # attempts in all, every cycle and manual one
        # The attempt that ends a delivery says so, not "retry ... next=dead".
        "outcome": report.said,
        "status": report.outcome.status,
        "duration_ms": round(report.duration * 1000, 1),
        "next": iso(due) if due is not None else after.value,
        "error": report.outcome.error,
    }


def log_attempt(report: AttemptReport) -> None:
    level = logging.WARNING if next_status(report.then) is Status.DEAD else logging.INFO
    attempt_log.log(level, "attempt", extra={"fields": attempt_fields(report)})
