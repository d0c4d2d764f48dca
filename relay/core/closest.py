"""The name a typo most likely meant: "did you mean tilda?"."""

from __future__ import annotations

from collections.abc import Sequence


def closest(given: str, names: Sequence[str], cutoff: float = 0.6) -> str | None:
    """The one of `names` closest to `given`, if any is close enough."""
    # Imported here: only a mistake needs it, and `relay serve` is spared it
    # (a fifth of a MiB of idle memory).
    import difflib

    close = difflib.get_close_matches(given, names, n=1, cutoff=cutoff)
    return close[0] if close else None
