"""Retry tables: a default, overridden per target, overridden per route-target."""

from __future__ import annotations

from relay.config.model import Backoff, RetryPolicy
from relay.config.reader import ConfigError, Section

BACKOFFS: tuple[Backoff, ...] = ("exponential", "list")


def parse_retry(section: Section, inherited: RetryPolicy) -> RetryPolicy:
    """Read a retry table; keys it leaves out keep the `inherited` values.

    A list of delays replaces the inherited schedule as a whole: its length
    is the number of retries unless `retries` is set beside it, in which case
    the last delay repeats.
    """
    raw_delays = section.take("delays", None)
    backoff = section.choice("backoff", BACKOFFS, None)
    if backoff is None:
        backoff = "list" if raw_delays is not None else inherited.backoff
    base = section.number("base", inherited.base, minimum=1.0, maximum=100.0)
    unit = section.duration("unit", inherited.unit)
    retries = section.integer("retries", None, minimum=0, maximum=1000)
    jitter = section.number("jitter", inherited.jitter, minimum=0.0, maximum=1.0)
    max_delay = section.duration("max_delay", inherited.max_delay)
    timeout = section.duration("timeout", inherited.timeout)
    retry_on_error = section.boolean("retry_on_error", inherited.retry_on_error)
    delays: tuple[float, ...] = ()
    if backoff == "list":
        if raw_delays is None:
            delays = inherited.delays
            if not delays:
                raise ConfigError(
                    section.key("delays"), 'is required with backoff = "list" (e.g. ["30s", "2m"])'
                )
            if retries is None:
                retries = inherited.retries
        elif not isinstance(raw_delays, list) or not raw_delays:
            raise section.error(
                "delays", 'a non-empty list of durations like ["30s", "2m"]', raw_delays
            )
        else:
            delays = tuple(
                section.parse_duration_value(f"delays[{index}]", item)
                for index, item in enumerate(raw_delays)
            )
    if retries is None:
        if backoff == "list":
            retries = len(delays)
        elif inherited.backoff == "exponential":
            retries = inherited.retries
        else:
            retries = RetryPolicy().retries
    section.done()
    return RetryPolicy(
        backoff=backoff,
        base=base,
        unit=unit,
        retries=retries,
        jitter=jitter,
        max_delay=max_delay,
        delays=delays,
        timeout=timeout,
        retry_on_error=retry_on_error,
    )
