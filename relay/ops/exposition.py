"""Prometheus's text exposition format (version 0.0.4), written out by hand.

relay exports a dozen families; prometheus-client brought 1.5 MiB of
imports to every running relay (its HTTP server, WSGI and multiprocess
support among them) and a lock on every increment. The format is a few
lines of text per sample; tests read our output with prometheus-client's own
parser.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Generic, TypeVar

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

Labels = Sequence[tuple[str, str]]
Child = TypeVar("Child")


def number(value: float) -> str:
    """A sample value as Prometheus's Go code writes it: `3.0`, `+Inf`, and
    an exponent from a million up (`1.5e+06`), as prometheus-client does."""
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    text = repr(float(value))
    dot = text.find(".")
    if value > 0 and dot > 6:  # repr wrote all the digits: Go switches sooner
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return text


def _escaped_label(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def family(lines: list[str], name: str, help_text: str, kind: str) -> None:
    """The `# HELP` and `# TYPE` lines that open a family."""
    escaped = help_text.replace("\\", r"\\").replace("\n", r"\n")
    lines.append(f"# HELP {name} {escaped}")
    lines.append(f"# TYPE {name} {kind}")


def sample(lines: list[str], name: str, labels: Labels, value: float) -> None:
    """One sample line, its labels sorted by name as Prometheus's own clients do."""
    if labels:
        pairs = ",".join(f'{key}="{_escaped_label(text)}"' for key, text in sorted(labels))
        lines.append(f"{name}{{{pairs}}} {number(value)}")
    else:
        lines.append(f"{name} {number(value)}")


def render(lines: list[str]) -> bytes:
    return ("\n".join(lines) + "\n").encode() if lines else b""


class _Family(Generic[Child]):
    """A family of samples, one child per set of label values, made on first use.

    Children are used from the event loop's thread only, so no lock: a `+=`
    on a float is what prometheus-client guarded with one per call.
    """

    def __init__(
        self, name: str, help_text: str, labelnames: Sequence[str], child: Callable[[], Child]
    ) -> None:
        self.name = name
        self.help_text = help_text
        self.labelnames = tuple(labelnames)
        self._new_child = child
        self._children: dict[tuple[str, ...], Child] = {}

    def labels(self, *values: str) -> Child:
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name} takes labels {self.labelnames}, got {values}")
            child = self._children[values] = self._new_child()
        return child

    def _labelled(self) -> Iterator[tuple[Labels, Child]]:
        for values, child in self._children.items():
            yield tuple(zip(self.labelnames, values, strict=True)), child


class Counter(_Family["CounterChild"]):
    """A counter family, one plain number per set of label values."""

    def __init__(self, name: str, help_text: str, labelnames: Sequence[str] = ()) -> None:
        super().__init__(f"{name}_total", help_text, labelnames, CounterChild)
        if not self.labelnames:  # exported as 0 before the first increment
            self.labels()

    def inc(self, amount: float = 1.0) -> None:
        """For a counter without labels."""
        self._children[()].inc(amount)

    def set_total(self, value: float) -> None:
        """For a counter without labels whose count is kept elsewhere (the
        store's writer): its running total since start."""
        self._children[()].value = value

    def total(self) -> float:
        """The sum over every set of labels."""
        return sum(child.value for child in self._children.values())

    def expose(self, lines: list[str]) -> None:
        family(lines, self.name, self.help_text, "counter")
        for labels, child in self._labelled():
            sample(lines, self.name, labels, child.value)


class CounterChild:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("counters only go up")
        self.value += amount


class Gauge:
    """A gauge without labels, set to the latest figure."""

    def __init__(self, name: str, help_text: str) -> None:
        self.name = name
        self.help_text = help_text
        self.value = 0.0

    def set(self, value: float) -> None:
        self.value = float(value)

    def expose(self, lines: list[str]) -> None:
        family(lines, self.name, self.help_text, "gauge")
        sample(lines, self.name, (), self.value)


class Histogram(_Family["HistogramChild"]):
    """A histogram family with one label set per child."""

    def __init__(
        self, name: str, help_text: str, labelnames: Sequence[str], buckets: Sequence[float]
    ) -> None:
        bounds = tuple(buckets)
        super().__init__(name, help_text, labelnames, lambda: HistogramChild(bounds))
        self.bounds = bounds

    def expose(self, lines: list[str]) -> None:
        family(lines, self.name, self.help_text, "histogram")
        for labels, child in self._labelled():
            histogram_samples(lines, self.name, labels, self.bounds, child.counts, child.total)


class HistogramChild:
    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one past every bound: +Inf
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1  # le: value <= bound
        self.total += value


def histogram_samples(
    lines: list[str],
    name: str,
    labels: Labels,
    bounds: Sequence[float],
    counts: Sequence[int],
    total: float,
) -> None:
    """A histogram's `_bucket` lines (cumulative), then `_count` and `_sum`."""
    cumulative = 0
    for bound, count in zip([*bounds, math.inf], counts, strict=True):
        cumulative += count
        sample(lines, f"{name}_bucket", (*labels, ("le", number(bound))), cumulative)
    sample(lines, f"{name}_count", labels, cumulative)
    sample(lines, f"{name}_sum", labels, total)
