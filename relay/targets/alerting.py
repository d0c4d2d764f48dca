"""Alerts through any target: they carry their own subject and text.

An alert is an event on the internal route `ALERTS_ROUTE` whose JSON body
has a `summary` and a `text` (see relay/background/alerts.py). The target named in
`[alerts] target` is usually built for something else (a lead mail, a sales
chat): its templates would read form fields an alert does not have and send
"New lead: no name". So a target sends alert deliveries through a twin
built from the same settings with the alert's own templates, as its kind
declares (`TargetKind.alert_settings`): the mail's subject is the summary
and its text the alert's text, Telegram gets the text as plain text, an HTTP
target gets the alert's JSON as is; a kind that declares none (a file
target) sends an alert as it sends everything.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Any

from relay.core.outcome import Outcome
from relay.kinds.base import AlertTemplates, TargetKind
from relay.kinds.target import Envelope, Target

if TYPE_CHECKING:
    from relay.config.model import TargetConfig
    from relay.templates import Template

ALERTS_ROUTE = "_alerts"


class _AlertTemplates:
    """The alert's templates, each compiled when a kind first reads it, not at
    import: a relay whose config holds no template never loads Jinja2 (an
    HTTP target sends alerts as their JSON, and reads neither)."""

    @functools.cached_property
    def summary(self) -> Template:
        return _compiled("{{ json.summary }}")

    @functools.cached_property
    def text(self) -> Template:
        return _compiled("{{ json.text }}")


def _compiled(source: str) -> Template:
    from relay.templates import compile_template

    return compile_template(source)


ALERT: AlertTemplates = _AlertTemplates()


def alert_settings(config: TargetConfig, kind: TargetKind[Any]) -> TargetConfig | None:
    """The target's settings with the alert's templates; None when it has none to replace."""
    replaced = kind.alert_settings(config.settings, ALERT)
    return None if replaced is None else dataclasses.replace(config, settings=replaced)


class AlertAware:
    """A target that sends deliveries of the alerts route through its alert twin."""

    def __init__(self, target: Target, twin: Target) -> None:
        self.name = target.name
        self.target = target
        self._twin = twin

    def _for(self, envelope: Envelope) -> Target:
        return self._twin if envelope.delivery.route == ALERTS_ROUTE else self.target

    async def start(self) -> None:
        await self.target.start()
        await self._twin.start()

    async def send(self, envelope: Envelope) -> Outcome:
        return await self._for(envelope).send(envelope)

    def preview(self, envelope: Envelope, *, wire: bool = False) -> str:
        return self._for(envelope).preview(envelope, wire=wire)

    async def close(self) -> None:
        try:
            await self.target.close()
        finally:
            await self._twin.close()
