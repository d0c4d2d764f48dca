"""Log setup, and the one line every delivery attempt writes."""

from __future__ import annotations

import logging
import sys

from relay.retry import Next
from relay.scheduler import AttemptReport
from relay.secrets import Masker
from relay.views import iso

attempt_log = logging.getLogger("relay.attempts")


class _MaskingFormatter(logging.Formatter):
    """Masks the finished line, tracebacks included: nothing escapes by another path."""

    def __init__(self, masker: Masker) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s", "%Y-%m-%dT%H:%M:%S")
        self.masker = masker

    def format(self, record: logging.LogRecord) -> str:
        return self.masker.text(super().format(record))


def configure(level: str = "info", masker: Masker | None = None) -> None:
    """Text lines on stdout (journald keeps them), secrets masked."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(_MaskingFormatter(masker or Masker()))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # aiohttp logs each request at INFO; at webhook rates that drowns the attempt log.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


def log_attempt(report: AttemptReport) -> None:
    delivery = report.delivery
    decision = report.decision
    if decision.next is Next.RETRY:
        then = f"next={iso(decision.at)}"
    else:
        then = f"final={decision.next.value}"
    fields = [
        f"event={delivery.event_id}",
        f"route={delivery.route}",
        f"target={delivery.target}",
        f"delivery={delivery.id}",
        f"attempt={report.number}/{report.max_attempts}",
        f"outcome={report.outcome.verdict.value}",
        f"status={report.outcome.status or '-'}",
        f"duration={report.duration * 1000:.0f}ms",
        then,
    ]
    if report.outcome.error:
        fields.append(f'error="{report.outcome.error}"')
    level = logging.WARNING if decision.next is Next.DEAD else logging.INFO
    attempt_log.log(level, " ".join(fields))
