"""The `smtp` target: one mail per delivery, through aiosmtplib.

Network errors, timeouts and 4xx replies are retried; 5xx replies are
permanent. Each message has a Message-ID derived from the event and the
target, so a mail resent after a crash is recognisably the same mail.
"""

from __future__ import annotations

import hashlib
import ssl
from email.headerregistry import Address
from email.message import EmailMessage
from email.utils import formatdate, parseaddr

import aiosmtplib

from relay.budget import TemplateError
from relay.kinds.targets.smtp import SmtpSettings
from relay.outcome import Outcome
from relay.targets.base import Envelope, context, rendered, variables


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
            if reply_to:
                if "@" not in parseaddr(reply_to)[1]:
                    raise TemplateError(f"reply_to is not a mail address: {reply_to!r}")
                message["Reply-To"] = reply_to
        message["Subject"] = subject
        message["Date"] = formatdate(envelope.received_at, localtime=False, usegmt=True)
        message["Message-ID"] = message_id(envelope, self.name, settings.sender)
        message["X-Relay-Event-Id"] = str(envelope.event_id)
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
            # payload) holds this delivery, not the event loop (relay/sandbox.py).
            message = await rendered(self.message, envelope, self._wanted)
        except (TemplateError, ValueError) as error:
            return Outcome.unsendable(
                f"template error: {error}" if not isinstance(error, TemplateError) else str(error)
            )
        if envelope.paced is not None:
            await envelope.paced()
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


def message_id(envelope: Envelope, target: str, sender: str) -> str:
    domain = parseaddr(sender)[1].rpartition("@")[2] or "relay.invalid"
    seed = f"{envelope.event_id}|{envelope.received_at}|{envelope.idempotency_key}|{target}"
    digest = hashlib.sha256(seed.encode()).hexdigest()[:16]
    return f"<relay.{envelope.event_id}.{target}.{digest}@{domain}>"
