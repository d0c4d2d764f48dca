"""The `smtp` target: one mail per delivery, through aiosmtplib.

Network errors, timeouts and 4xx replies are retried; 5xx replies are
permanent. Each message has a Message-ID derived from the event and the
target, so a mail resent after a crash is recognisably the same mail.
"""

from __future__ import annotations

import hashlib
import logging
import re
import ssl
from collections.abc import Iterable
from dataclasses import dataclass, replace
from email import errors
from email.headerregistry import Address
from email.message import EmailMessage
from email.utils import formatdate, parseaddr
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from relay.config.files import ca_file_problem
from relay.config.reader import ConfigError, Section
from relay.core.budget import TemplateError
from relay.core.outcome import Outcome, SentRequest
from relay.core.payload import EVENT_VARIABLES
from relay.core.printable import printable
from relay.kinds.base import AlertTemplates, TargetKind
from relay.kinds.target import Envelope, Target
from relay.targets.base import context, rendered, variables

if TYPE_CHECKING:
    from relay.core.secrets import Masker
    from relay.templates import Template

log = logging.getLogger("relay.smtp")

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
    return SmtpTarget(name, settings)


def destination(settings: SmtpSettings, masker: Masker) -> str:
    return f"{settings.host}:{settings.port} {settings.tls}, to {', '.join(settings.to)}"


def view(settings: SmtpSettings, masker: Masker) -> dict[str, Any]:
    return {"host": f"{settings.host}:{settings.port} ({settings.tls})", "to": list(settings.to)}


def secrets(settings: SmtpSettings) -> Iterable[str]:
    return [settings.password] if settings.password else []


def alert_settings(settings: SmtpSettings, alert: AlertTemplates) -> SmtpSettings:
    """The alert's summary as the subject, its text as the mail's only part."""
    return replace(settings, subject=alert.summary, text=alert.text, html=None, reply_to=None)


class SmtpTarget:
    def __init__(self, name: str, settings: SmtpSettings) -> None:
        self.name = name
        self._settings = settings
        self._wanted = variables(
            [settings.subject, settings.text, settings.html, settings.reply_to]
        )
        self._tls: ssl.SSLContext | None = None

    async def start(self) -> None:
        settings = self._settings
        if settings.tls != "none":
            tls = ssl.create_default_context(
                cafile=str(settings.ca_file) if settings.ca_file else None
            )
            if not settings.tls_verify:
                tls.check_hostname = False
                tls.verify_mode = ssl.CERT_NONE
            self._tls = tls

    async def close(self) -> None:
        pass

    def message(self, envelope: Envelope) -> EmailMessage:
        """The mail to send; raises TemplateError when a template fails for this event."""
        settings = self._settings
        values = context(envelope, self._wanted)
        subject = " ".join(settings.subject.render(values).split())  # one line
        message = EmailMessage()
        message["From"] = settings.sender
        message["To"] = ", ".join(settings.to)
        if settings.cc:
            message["Cc"] = ", ".join(settings.cc)
        if settings.reply_to is not None:
            reply_to = settings.reply_to.render(values).strip()
            if reply_to and _mail_address(reply_to):
                message["Reply-To"] = reply_to
            elif reply_to:
                # A customer's typo (x@@yandex.ru) must not cost the manager
                # the lead: the mail goes without it, and says so.
                note = f"Reply-To left out: {printable(reply_to)[:200]!r} is not a mail address"
                message["X-Relay-Note"] = note
                log.warning("target %s, event %d: %s", self.name, envelope.delivery.event_id, note)
        message["Subject"] = subject
        message["Date"] = formatdate(envelope.delivery.received_at, localtime=False, usegmt=True)
        message["Message-ID"] = message_id(envelope, self.name, settings.sender)
        message["X-Relay-Event-Id"] = str(envelope.delivery.event_id)
        message["X-Relay-Attempt"] = str(envelope.attempt)
        message.set_content(settings.text.render(values))
        if settings.html is not None:
            message.add_alternative(settings.html.render(values), subtype="html")
        return message

    def preview(self, envelope: Envelope, *, wire: bool = False) -> str:
        settings = self._settings
        head = f"SMTP {settings.host}:{settings.port} ({settings.tls})"
        message = self.message(envelope)
        if wire:
            return head + "\n" + message.as_string()
        return head + "\n" + readable_mail(message)

    async def send(self, envelope: Envelope) -> Outcome:
        settings = self._settings
        try:
            # Rendered in a worker thread: a heavy template (a loop over a large
            # payload) holds this delivery, not the event loop (relay/templates/sandbox.py).
            message = await rendered(self.message, envelope, self._wanted)
        except (TemplateError, ValueError) as error:
            return Outcome.unsendable(
                f"template error: {error}" if not isinstance(error, TemplateError) else str(error)
            )
        if envelope.paced is not None:
            await envelope.paced()
        outcome = await self._send(message)
        # The mail as sent, kept with the attempt as an http request is: its
        # headers and text as a mail program shows them.
        return replace(outcome, request=sent_mail(message, settings))

    async def _send(self, message: EmailMessage) -> Outcome:
        import aiosmtplib  # the mail client: when mail is sent, not when a config is read

        settings = self._settings
        try:
            await aiosmtplib.send(
                message,
                sender=Address(addr_spec=parseaddr(settings.sender)[1]).addr_spec,
                recipients=[parseaddr(a)[1] for a in (*settings.to, *settings.cc)],
                hostname=settings.host,
                port=settings.port,
                username=settings.username,
                password=settings.password,
                use_tls=settings.tls == "implicit",
                start_tls=settings.tls == "starttls",
                tls_context=self._tls,
                timeout=None,  # the scheduler bounds the attempt
            )
        except aiosmtplib.SMTPRecipientsRefused as error:
            return _reply([(r.code, r.message) for r in error.recipients])
        except aiosmtplib.SMTPResponseException as error:
            return _reply([(error.code, error.message)])
        except aiosmtplib.SMTPException as error:
            return Outcome.retry(f"SMTP error: {error}")
        except (OSError, ssl.SSLError) as error:
            return Outcome.retry(f"SMTP connection error: {error.strerror or error}")
        return Outcome.success()


def _mail_address(text: str) -> bool:
    """Whether `text` is one mail address a reader can answer to ("Anna
    <anna@example.com>", "anna@example.com")."""
    _, spec = parseaddr(text)
    if "@" not in spec or any(char in text for char in "\r\n"):
        return False
    try:
        address = Address(addr_spec=spec)
    except (ValueError, IndexError, errors.HeaderParseError):
        return False
    return bool(address.username and address.domain)


def _reply(replies: list[tuple[int, str]]) -> Outcome:
    """5xx from the server is permanent; 4xx (and anything odd) is worth a retry."""
    text = "; ".join(f"SMTP {code} {message}" for code, message in replies)
    if replies and all(500 <= code < 600 for code, _ in replies):
        return Outcome.fail(text, status=replies[0][0])
    return Outcome.retry(text, status=replies[0][0] if replies else None)


def readable_mail(message: EmailMessage) -> str:
    """The mail as a mail program shows it: headers and text decoded (the
    wire form has them in RFC 2047 words and base64)."""
    lines = [f"{name}: {message[name]}" for name in _SHOWN_HEADERS if message[name] is not None]
    plain = message.get_body(preferencelist=("plain",))
    html = message.get_body(preferencelist=("html",))
    lines.append("")
    if plain is not None:
        lines.append(str(plain.get_content()).rstrip("\n"))
    if html is not None:
        lines += ["", "--- HTML part ---", str(html.get_content()).rstrip("\n")]
    return "\n".join(lines)


_SHOWN_HEADERS = ("From", "To", "Cc", "Reply-To", "Subject", "Date", "Message-ID")


def sent_mail(message: EmailMessage, settings: SmtpSettings) -> SentRequest:
    """The mail an attempt sent, as it is kept (relay.delivery.kept bounds and
    masks it): the headers a person reads, decoded, and the plain text (else
    the HTML), so an attempt's page shows what the manager received."""
    headers = [
        (name, str(message[name]))
        for name in (*_SHOWN_HEADERS, "X-Relay-Note")
        if message[name] is not None
    ]
    part = message.get_body(preferencelist=("plain", "html"))
    text = str(part.get_content()) if part is not None else ""
    return SentRequest(
        "SMTP", f"smtp://{settings.host}:{settings.port}", tuple(headers), text.encode()
    )


def message_id(envelope: Envelope, target: str, sender: str) -> str:
    """The same on every attempt of a delivery (a mail client shows a copy
    sent twice once): made from its identity, which an older delivery keeps
    as its event's key, so mail already sent keeps its Message-ID."""
    domain = parseaddr(sender)[1].rpartition("@")[2] or "relay.invalid"
    delivery = envelope.delivery
    seed = f"{delivery.event_id}|{delivery.received_at}|{envelope.receiver_key}|{target}"
    digest = hashlib.sha256(seed.encode()).hexdigest()[:16]
    return f"<relay.{delivery.event_id}.{target}.{digest}@{domain}>"


KIND = TargetKind(
    name="smtp",
    parse=parse,
    build=build,
    destination=destination,
    view=view,
    secrets=secrets,
    secret_keys=("password",),
    alert_settings=alert_settings,
)
