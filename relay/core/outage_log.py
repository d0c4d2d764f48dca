"""The log of an outage: said in a few lines rather than one per try.

Whatever retries on its own while the store is away (ingress answering
503, the scheduler, the search indexer) says once that it failed, again once a REMINDER while it
still fails, and once that it works again, with how long it did not: a
database restart must read as a handful of lines in the journal, not one
per try.
"""

from __future__ import annotations

REMINDER = 60.0  # seconds between two lines of one outage


class OutageLog:
    def __init__(self) -> None:
        self._since: float | None = None  # when the outage began
        self._said: float | None = None  # when it was last said
        self.failures = 0  # tries failed in the outage under way (0: none is)

    def failed(self, now: float) -> bool:
        """A try failed at `now`: whether to say so now."""
        self.failures += 1
        if self._since is None:
            self._since = now
        said = self._said
        if said is None or now - said >= REMINDER or now < said:
            self._said = now
            return True
        return False

    def lasted(self, now: float) -> float:
        """How long the outage under way has lasted at `now` (0 if none is)."""
        return 0.0 if self._since is None else max(0.0, now - self._since)

    def ended(self, now: float) -> float | None:
        """A try worked at `now`: how long the outage lasted, if one was under way."""
        lasted = self.lasted(now) if self._since is not None else None
        self._since = self._said = None
        self.failures = 0
        return lasted
