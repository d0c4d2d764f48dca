"""Counts said the way a person reads them: "1 attempt", "2 attempts"."""

from __future__ import annotations


def count(number: int | str, noun: str, plural: str | None = None) -> str:
    """`number` and `noun`, the noun in the plural unless the number is one."""
    one = str(number) == "1"
    return f"{number} {noun if one else plural or noun + 's'}"
