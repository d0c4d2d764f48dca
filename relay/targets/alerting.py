"""Alerts through any target: they carry their own subject and text.

An alert is an event on the internal route `ALERTS_ROUTE` whose JSON body
has a `summary` and a `text` (see relay/alerts.py). The target named in
`[alerts] target` is usually built for something else (a lead mail, a sales
chat): its templates would read form fields an alert does not have and send
"New lead: no name". So every target sends alert deliveries through a twin
built from the same settings with the alert's own templates: the mail's
subject is the summary and its text the alert's text, Telegram gets the
text as plain text (no parse mode to trip on), an HTTP target gets the
alert's JSON as is (its URL, method and header templates kept: they carry
its credentials), a file target writes it as it writes everything.
"""

from __future__ import annotations

import dataclasses

from relay.config import TargetConfig
from relay.kinds.targets.http import HttpSettings
from relay.kinds.targets.smtp import SmtpSettings
from relay.kinds.targets.telegram import TelegramSettings
from relay.outcome import Outcome
from relay.targets.base import Envelope, Target
from relay.templates import compile_template

ALERTS_ROUTE = "_alerts"

_SUMMARY = compile_template("{{ json.summary }}")
_TEXT = compile_template("{{ json.text }}")


def alert_settings(config: TargetConfig) -> TargetConfig | None:
    """The target's settings with the alert's templates; None when it has none to replace."""
    settings = config.settings
    replaced: object
    if isinstance(settings, SmtpSettings):
        replaced = dataclasses.replace(
            settings, subject=_SUMMARY, text=_TEXT, html=None, reply_to=None
        )
    elif isinstance(settings, TelegramSettings):
        replaced = dataclasses.replace(settings, text=_TEXT, parse_mode="none")
    elif isinstance(settings, HttpSettings) and settings.format != "raw":
        replaced = dataclasses.replace(settings, format="raw", body=None, form={})
    else:
        return None
    return dataclasses.replace(config, settings=replaced)


class AlertAware:
    """A target that sends deliveries of the alerts route through its alert twin."""

    def __init__(self, target: Target, twin: Target) -> None:
        self.name = target.name
        self.target = target
        self._twin = twin

    def _for(self, envelope: Envelope) -> Target:
        return self._twin if envelope.route == ALERTS_ROUTE else self.target

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
