"""Form fields as templates read them: exact name first, then any case.

Site builders name fields as people type them: Tilda's defaults are `Name`,
`Email`, `Phone`, and an owner may rename them `name` or `PHONE`. A template
written as `form.name` must find `Name` rather than fall back to its default
and deliver an empty lead.
"""

from __future__ import annotations

from typing import Any


class FormFields(dict[str, str]):
    """A dict of fields whose lookups (`form.name`, `form['name']`, `.get`,
    `in`) fall back to a case-insensitive match, the first such field in order.
    Iteration, `items()` and equality are a plain dict's: nothing is renamed."""

    _folded: dict[str, str] | None = None

    def _fold(self, name: str) -> str | None:
        if self._folded is None:
            folded: dict[str, str] = {}
            for field in self:
                folded.setdefault(field.casefold(), field)
            self._folded = folded
        return self._folded.get(name.casefold())

    def __setitem__(self, name: str, value: str) -> None:
        self._folded = None
        super().__setitem__(name, value)

    def setdefault(self, name: str, value: str) -> str:
        self._folded = None
        return super().setdefault(name, value)

    def __missing__(self, name: object) -> str:
        if isinstance(name, str):
            field = self._fold(name)
            if field is not None:
                return dict.__getitem__(self, field)
        raise KeyError(name)

    def __contains__(self, name: object) -> bool:
        if dict.__contains__(self, name):
            return True
        return isinstance(name, str) and self._fold(name) is not None

    def get(self, name: str, default: Any = None) -> Any:
        try:
            return self[name]
        except KeyError:
            return default
