"""`type = "smtp"`: a mail, subject and text (and HTML) from templates."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from relay.config.files import ca_file_problem
from relay.config.reader import ConfigError, Section
from relay.kinds.base import AlertTemplates, TargetKind
from relay.payload import EVENT_VARIABLES

if TYPE_CHECKING:
    from relay.secrets import Masker
    from relay.targets.base import Target
    from relay.templates import Template


SmtpTls = Literal["implicit", "starttls", "none"]


@dataclass(frozen=True)
class SmtpSettings:
    host: str
    port: int
    tls: SmtpTls
    sender: str  # the `from` key
    to: tuple[str, ...]
    subject: Template
    text: Template
    cc: tuple[str, ...] = ()
    reply_to: Template | None = None
    html: Template | None = None
    username: str | None = None
    password: str | None = None
    tls_verify: bool = True
    ca_file: Path | None = None


_EMAIL = re.compile(r"[^@\s<>]+@[^@\s<>]+|.*<[^@\s<>]+@[^@\s<>]+>")
SMTP_TLS: tuple[SmtpTls, ...] = ("implicit", "starttls", "none")
DEFAULT_MAIL_SUBJECT = "{{ json.summary | default('relay: event ' ~ event.id) }}"
DEFAULT_MAIL_TEXT = "{{ json.text | default(body) }}"


def _addresses(section: Section, name: str, *, required: bool) -> tuple[str, ...]:
    value = section.take(name) if required else section.take(name, None)
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items or not all(isinstance(i, str) for i in items):
        raise section.error(name, "a list of mail addresses", value)
    for item in items:
        if not _EMAIL.fullmatch(item.strip()):
            raise section.error(name, 'mail addresses like "sales@example.com"', item)
    return tuple(item.strip() for item in items)


def parse(section: Section, base: Path) -> SmtpSettings:
    host = section.string("host")
    tls: SmtpTls = section.choice("tls", SMTP_TLS, "starttls")
    default_port = {"implicit": 465, "starttls": 587, "none": 25}[tls]
    port = section.integer("port", default_port, minimum=1, maximum=65535)
    username = section.string("username", None)
    password = section.string("password", None, nonempty=False)
    if (username is None) != (password is None):
        missing = "password" if password is None else "username"
        raise ConfigError(
            section.key(missing),
            "is required with " + ("username" if missing == "password" else "password"),
        )
    sender = section.string("from")
    if not _EMAIL.fullmatch(sender):
        raise section.error("from", 'a mail address like "relay@example.com"', sender)
    ca_file = section.path("ca_file", base, None)
    if ca_file is not None and (problem := ca_file_problem(ca_file)):
        raise ConfigError(section.key("ca_file"), problem)
    return SmtpSettings(
        host=host,
        port=port,
        tls=tls,
        sender=sender,
        to=_addresses(section, "to", required=True),
        cc=_addresses(section, "cc", required=False),
        reply_to=section.template("reply_to", None, offers=EVENT_VARIABLES),
        subject=section.template_or("subject", DEFAULT_MAIL_SUBJECT, offers=EVENT_VARIABLES),
        text=section.template_or("text", DEFAULT_MAIL_TEXT, offers=EVENT_VARIABLES),
        html=section.template("html", None, offers=EVENT_VARIABLES, html=True),
        username=username,
        password=password,
        tls_verify=section.boolean("tls_verify", True),
        ca_file=ca_file,
    )


def build(name: str, settings: SmtpSettings, concurrency: int) -> Target:
    from relay.targets.smtp import SmtpTarget  # aiosmtplib: only to send

    return SmtpTarget(name, settings)


def describe(settings: SmtpSettings, masker: Masker) -> str:
    return f"{settings.host}:{settings.port} {settings.tls}, to {', '.join(settings.to)}"


def view(settings: SmtpSettings, masker: Masker) -> dict[str, Any]:
    return {"host": f"{settings.host}:{settings.port} ({settings.tls})", "to": list(settings.to)}


def secrets(settings: SmtpSettings) -> Iterable[str]:
    return [settings.password] if settings.password else []


def alert_settings(settings: SmtpSettings, alert: AlertTemplates) -> SmtpSettings:
    """The alert's summary as the subject, its text as the mail's only part."""
    return replace(settings, subject=alert.summary, text=alert.text, html=None, reply_to=None)


KIND = TargetKind(
    name="smtp",
    parse=parse,
    build=build,
    describe=describe,
    view=view,
    secrets=secrets,
    secret_keys=("password",),
    alert_settings=alert_settings,
)
