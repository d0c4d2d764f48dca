"""What one render may cost: bounded sizes, arithmetic, loops and time.

Each attack below escaped the operation budget before (it counted only calls
and lookups): `'x' * 10**8`, `center(huge)`, `**` with a huge exponent, loops
over a payload that do no lookups. Each must now end in a TemplateError, fast.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from relay.core.budget import WORKER_SECONDS, TemplateError
from relay.templates import MAX_OUTPUT_CHARS, compile_template

HUGE = 10**9
PAYLOAD: dict[str, Any] = {
    "json": {
        "name": "x",
        "width": HUGE,
        "b": 7,
        "e": HUGE,
        "s": "ab" * 200_000,
        "l": list(range(100_000)),
        "sep": "-" * 100_000,
    }
}

ATTACKS = {
    "repeat a string": "{{ 'x' * 10**8 }}",
    "repeat from the payload": "{{ json.name * json.width }}",
    "repeat a list": "{{ ([1] * json.width)|length }}",
    "center filter": "{{ json.name|center(json.width) }}",
    "str.center": "{{ json.name.center(json.width) }}",
    "str.ljust": "{{ json.name.ljust(json.width) }}",
    "str.zfill": "{{ json.name.zfill(json.width) }}",
    "indent filter": "{{ json.s|indent(json.width) }}",
    "power": "{{ json.b ** json.e }}",
    "power of literals": "{{ 7 ** 1000000000 }}",
    "big multiplication": "{% set n = 10 ** 4000 %}{{ (n * n * n * n)|string|length }}",
    "percent width": "{{ '%*d'|format(json.width, 1) }}",
    "percent width literal": "{{ '%999999999d' % 1 }}",
    # CPython's mapping keys nest: this key is "a(b)c", its width 999999999.
    "percent width behind a nested key": "{{ '%(a(b)c)999999999s' % {'a(b)c': 1} }}",
    "format width": "{{ '{:>999999999}'.format(json.name) }}",
    "replace everywhere": "{{ json.s.replace('', json.sep) }}",
    "replace filter": "{{ json.s|replace('a', json.sep) }}",
    "join with a huge separator": "{{ json.l|join(json.sep) }}",
    "str.join": "{{ json.sep.join(json.s) }}",
    "concat doubling": (
        "{% set ns = namespace(s=json.sep) %}"
        "{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}"
    ),
    "nested loops over the payload": (
        "{% for a in json.l %}{% for b in json.l %}{% endfor %}{% endfor %}"
    ),
    "nested loops over a string": (
        "{% for a in json.s %}{% for b in json.s %}{% endfor %}{% endfor %}"
    ),
    "slice filter": "{{ json.l|slice(json.width)|list|length }}",
    "batch filter": "{{ [1]|batch(json.width, 0)|list|length }}",
    "lipsum": "{{ lipsum(json.width) }}",
    "wordwrap": "{{ json.s|wordwrap(1, true, json.sep) }}",
    "expandtabs": "{{ ('\t' * 1000).expandtabs(json.width) }}",
    "a Python-per-item filter over a large list": "{{ json.l|sort|unique|list|length }}",
    "filters over a large list, many times": (
        "{% set ns = namespace(l=json.l) %}"
        "{% for i in range(2000) %}{% set ns.l = ns.l|sort(reverse=true) %}{% endfor %}"
    ),
}


@pytest.mark.parametrize("source", ATTACKS.values(), ids=ATTACKS.keys())
async def test_attack_on_the_event_loop_ends_in_an_error_at_once(source: str) -> None:
    # As ingress renders keys and `when` conditions: on the loop, LOOP_SECONDS at most.
    template = compile_template(source)
    started = time.perf_counter()
    with pytest.raises(TemplateError):
        template.render(PAYLOAD)
    # The budget is LOOP_SECONDS (50 ms); the rest is room for a loaded machine.
    assert time.perf_counter() - started < 0.25


async def test_a_render_in_a_worker_thread_has_a_longer_budget_but_still_ends() -> None:
    # As targets render bodies: off the loop, which meanwhile keeps serving.
    template = compile_template(ATTACKS["nested loops over the payload"])
    started = time.perf_counter()
    with pytest.raises(TemplateError, match="too expensive"):
        await asyncio.to_thread(template.render, PAYLOAD)
    assert time.perf_counter() - started < WORKER_SECONDS + 0.5


def test_ordinary_templates_still_work() -> None:
    data = {"json": {"items": [{"sku": f"s{i}", "qty": i} for i in range(2000)], "n": 5}}
    template = compile_template(
        "{% for item in json['items'] %}{{ item.sku }}x{{ item.qty }}{{ ',' if not loop.last }}"
        "{% endfor %}|{{ json.n ** 3 }}|{{ 'ab' * 3 }}|{{ '%05d'|format(json.n) }}"
        "|{{ '{:>6}'.format(json.n) }}|{{ 'x'|center(5) }}|{{ json['items']|length }}"
        "|{{ 'a' ~ 'b' ~ json.n }}"
    )
    out = template.render(data)
    assert out.startswith("s0x0,s1x1,")
    assert out.endswith("|125|ababab|00005|     5|  x  |2000|ab5")
    assert len(out) < MAX_OUTPUT_CHARS


def test_a_template_nested_too_deeply_is_a_one_line_config_error() -> None:
    deep_filters = "{{ json.l" + "|list" * 2000 + " }}"
    deep_brackets = "{{ " + "(" * 500 + "1" + ")" * 500 + " }}"
    for source in (deep_filters, deep_brackets):
        with pytest.raises(ValueError, match=r"nested too deeply|syntax error"):
            compile_template(source)
