"""`[targets.NAME]` tables: the keys common to every target; each type reads
its own through its kind (relay.kinds)."""

from __future__ import annotations

import re
from pathlib import Path

from relay.config.model import Rate, RetryPolicy, TargetConfig
from relay.config.policy import parse_retry
from relay.config.reader import ConfigError, Section
from relay.loader.registry import target_kinds

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_\-]*")
_RATE = re.compile(r"\s*(\d+)\s*/\s*(s|sec|second|m|min|minute|h|hour)\s*")
_RATE_UNITS = {
    "s": 1.0,
    "sec": 1.0,
    "second": 1.0,
    "m": 60.0,
    "min": 60.0,
    "minute": 60.0,
    "h": 3600.0,
    "hour": 3600.0,
}


def parse_target(
    name: str, section: Section, default_retry: RetryPolicy, base: Path
) -> TargetConfig:
    if not NAME.fullmatch(name):
        raise ConfigError(section.where, "expected a name of letters, digits, _ and -")
    kind = target_kinds()[section.choice("type", target_kinds())]
    retry = parse_retry(section.section("retry"), default_retry)
    settings = kind.parse(section, base)
    shared_rates = kind.shared_rates(settings)
    held_by_a_wait = kind.held_by_a_wait(settings) if kind.held_by_a_wait is not None else None
    concurrency = section.integer("concurrency", kind.default_concurrency, minimum=1, maximum=1000)
    rate = _rate(section, "rate")
    rate_group = section.string("rate_group", None)
    if rate_group is not None:
        if rate is None:
            raise ConfigError(section.key("rate_group"), "needs a rate, shared by the group")
        # One pacer for every target of the group (two Bitrix24 targets on one
        # portal: its limit is the portal's, not each target's).
        shared_rates += ((f"group-{rate_group}", rate),)
        if held_by_a_wait is not None:
            held_by_a_wait |= {f"group-{rate_group}"}
        rate = None
    hold_when_down = section.boolean("hold_when_down", False)
    down_after = section.integer("down_after", None, minimum=1, maximum=1000)
    if down_after is not None and not hold_when_down:
        raise ConfigError(section.key("down_after"), "is used only with hold_when_down = true")
    section.done()
    return TargetConfig(
        name=name,
        retry=retry,
        settings=settings,
        type=kind.name,
        concurrency=concurrency,
        rate=rate,
        shared_rates=shared_rates,
        held_by_a_wait=held_by_a_wait,
        hold_when_down=hold_when_down,
        down_after=down_after if down_after is not None else TargetConfig.down_after,
    )


def _rate(section: Section, name: str) -> Rate | None:
    value = section.string(name, None)
    if value is None:
        return None
    match = _RATE.fullmatch(value)
    if match is None or int(match.group(1)) == 0:
        raise section.error(name, 'a rate like "2/s", "120/m" or "5000/h"', value)
    return Rate(int(match.group(1)), _RATE_UNITS[match.group(2)])
