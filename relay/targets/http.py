"""The `http` target: a CRM API or any URL. Forwards the body as it came, or
builds a JSON or form body from templates, and sends it through the shared
outbound HTTP library (relay.targets.outbound), which classifies the answer
and follows what redirects it is allowed to."""

from __future__ import annotations

import base64
import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlencode

import orjson

from relay.config.reader import ConfigError, Section
from relay.config.shared import secret_list, whsec
from relay.core.budget import TemplateError
from relay.core.identity import delivery_key
from relay.core.outcome import Outcome
from relay.core.payload import EVENT_VARIABLES
from relay.core.secrets import Masker, userinfo_secrets
from relay.kinds.base import AlertTemplates, TargetKind
from relay.kinds.target import Envelope, Target
from relay.targets.base import (
    KEY_FORMS,
    KeyForm,
    context,
    relay_headers,
    render_map,
    rendered,
    variables,
)
from relay.targets.outbound.connections import Outbound, SessionOwner, parse_outbound, parse_url
from relay.targets.outbound.policy import (
    USER_AGENT,
    Follow,
    breaks_header,
    classify,
    exchange,
    is_header_name,
    merged_headers,
)
from relay.targets.outbound.transport import Request
from relay.targets.signing import SIGNATURE_HEADERS, signature_headers

if TYPE_CHECKING:
    from relay.config.model import Listen
    from relay.templates import Template

HttpFormat = Literal["raw", "json", "form"]


@dataclass(frozen=True)
class HttpSettings:
    url: str
    method: str = "POST"
    # Header values are templates (a plain value is a template with no tags).
    headers: Mapping[str, Template] = field(default_factory=lambda: MappingProxyType({}))
    format: HttpFormat = "raw"
    body: Template | None = None  # format = "json": must render valid JSON
    form: Mapping[str, Template] = field(default_factory=lambda: MappingProxyType({}))
    # How Idempotency-Key is written (relay.targets.base.relay_headers).
    idempotency_key_form: KeyForm = "token"
    # 4xx statuses that say "slow down" for this receiver, not "bad request":
    # a throttle, as a 429 is (relay.targets.outbound.policy.classify).
    temporary_statuses: frozenset[int] = frozenset()
    # Standard Webhooks signing keys (decoded from "whsec_<base64>"): one
    # signature each, so a receiver rotating its secret accepts old or new.
    sign: tuple[bytes, ...] = ()
    outbound: Outbound = field(default_factory=Outbound)
    # 307 and 308 followed (method and body kept), to the same origin or these hosts.
    follow_redirects: bool = False
    redirect_hosts: tuple[str, ...] = ()
    # Where relay itself listens (its ingress and admin), told by the loader
    # (own_listeners below): a redirect is never followed there.
    own_listeners: tuple[Listen, ...] = ()


HTTP_METHODS = ("POST", "PUT", "PATCH", "DELETE", "GET")
HTTP_FORMATS: tuple[HttpFormat, ...] = ("raw", "json", "form")


def _check_header(section: Section, name: str, source: str) -> None:
    """A header that could never be what was meant is refused at load: a name
    that is no header name, a value written with a line break. Any other
    value goes out by one rule, templated or not (relay.targets.outbound.
    policy.sendable: non-ASCII text percent-encoded; `relay check` says so)."""
    key = section.key(f"headers.{name}")
    if not is_header_name(name):
        raise ConfigError(key, "is not a header name: letters, digits and !#$%&'*+-.^_`|~ only")
    if "{" not in source and breaks_header(source):
        raise ConfigError(key, "holds a line break or NUL, which a header value cannot hold")


def parse(section: Section, base: Path) -> HttpSettings:
    url = parse_url(section, "url")
    method = section.string("method", "POST").upper()
    if method not in HTTP_METHODS:
        raise section.error("method", "one of " + ", ".join(HTTP_METHODS), method)
    headers = section.template_map("headers", offers=EVENT_VARIABLES)
    for name, template in headers.items():
        _check_header(section, name, template.source)
    body_format: HttpFormat = section.choice("format", HTTP_FORMATS, "raw")
    body = section.template("body", None, offers=EVENT_VARIABLES)
    form = section.template_map("form", offers=EVENT_VARIABLES)
    if body_format == "json" and body is None:
        raise ConfigError(section.key("body"), 'is required with format = "json"')
    if body_format == "form" and not form:
        raise ConfigError(section.key("form"), 'is required with format = "form"')
    if body_format != "json" and body is not None:
        raise ConfigError(section.key("body"), 'is used only with format = "json"')
    if body_format != "form" and form:
        raise ConfigError(section.key("form"), 'is used only with format = "form"')
    sign = tuple(
        whsec(section, "sign", value) for value in secret_list(section, "sign", required=False)
    )
    signed = [name for name in headers if sign and name.lower() in SIGNATURE_HEADERS]
    if signed:
        # The signature covers webhook-id and webhook-timestamp as relay sends
        # them: another value would make every request fail its check.
        raise ConfigError(
            section.key(f"headers.{signed[0]}"),
            "is written by relay when sign is set (Standard Webhooks): remove it here",
        )
    key_form: KeyForm = section.choice("idempotency_key_form", KEY_FORMS, "token")
    temporary = _temporary_statuses(section)
    follow_redirects = section.boolean("follow_redirects", False)
    redirect_hosts = tuple(
        host.strip().lower().rstrip(".") for host in section.string_list("redirect_hosts", ())
    )
    if redirect_hosts and not follow_redirects:
        raise ConfigError(
            section.key("redirect_hosts"), "is used only with follow_redirects = true"
        )
    return HttpSettings(
        url=url,
        method=method,
        headers=MappingProxyType(headers),
        format=body_format,
        body=body,
        form=MappingProxyType(form),
        idempotency_key_form=key_form,
        temporary_statuses=temporary,
        sign=sign,
        outbound=parse_outbound(section, base),
        follow_redirects=follow_redirects,
        redirect_hosts=redirect_hosts,
    )


def _temporary_statuses(section: Section) -> frozenset[int]:
    """`temporary_statuses`: 4xx statuses this receiver answers while it
    limits the sender (amoCRM: 403 while an address is blocked)."""
    value = section.take("temporary_statuses", [])
    expected = "a list of 4xx statuses, like [403]"
    if not isinstance(value, list):
        raise section.error("temporary_statuses", expected, value)
    statuses = set()
    for status in value:
        if isinstance(status, bool) or not isinstance(status, int) or not 400 <= status < 500:
            raise section.error("temporary_statuses", expected, status)
        if status == 429:
            raise ConfigError(
                section.key("temporary_statuses"), "need not list 429: it always is one"
            )
        statuses.add(status)
    return frozenset(statuses)


def build(name: str, settings: HttpSettings, concurrency: int) -> Target:
    return HttpTarget(name, settings, concurrency=concurrency)


def destination(settings: HttpSettings, masker: Masker) -> str:
    body = "" if settings.format == "raw" else f", {settings.format} body"
    return f"{settings.method} {masker.text(settings.url)}{body}"


def view(settings: HttpSettings, masker: Masker) -> dict[str, Any]:
    sources = [(name, template.source) for name, template in settings.headers.items()]
    return {
        "url": masker.text(settings.url),
        "method": settings.method,
        "headers": dict(masker.headers(sources)),
        "format": settings.format,
    }


def secrets(settings: HttpSettings) -> Iterable[str]:
    # The base64 part of "whsec_...": masked whether or not the prefix shows;
    # the url's user:password as sent (Basic authorization) too.
    return [
        *(base64.b64encode(key).decode() for key in settings.sign),
        *userinfo_secrets(settings.url),
        *settings.outbound.secrets(),
    ]


def alert_settings(settings: HttpSettings, alert: AlertTemplates) -> HttpSettings | None:
    """The alert's JSON as is; the URL, method and header templates kept (they
    carry its credentials). A raw body already is the alert's JSON."""
    if settings.format == "raw":
        return None
    return replace(settings, format="raw", body=None, form=MappingProxyType({}))


def own_listeners(settings: HttpSettings, listening: tuple[Listen, ...]) -> HttpSettings:
    return replace(settings, own_listeners=listening)


class HttpTarget(SessionOwner):
    def __init__(self, name: str, settings: HttpSettings, *, concurrency: int) -> None:
        super().__init__(concurrency, settings.outbound)
        self.name = name
        self._settings = settings
        self._wanted = variables(
            [*settings.headers.values(), settings.body, *settings.form.values()]
        )
        self._judge = functools.partial(classify, temporary=settings.temporary_statuses)

    def prepare(self, envelope: Envelope) -> Request:
        """The request to send; raises TemplateError when a template fails for this event.

        Its headers in layers, later ones winning whatever the case of a name:
        relay's defaults (User-Agent, Content-Type, the identity headers a
        receiver de-duplicates on), then the target's `headers` (an operator's
        Idempotency-Key or Content-Type replaces relay's), then the Standard
        Webhooks signature (refused in `headers` at load when `sign` is set)."""
        settings = self._settings
        values = context(envelope, self._wanted) if self._wanted else {}
        defaults = {"User-Agent": USER_AGENT}
        if settings.format == "json":
            assert settings.body is not None
            body = settings.body.render(values).encode()
            try:
                orjson.loads(body)
            except orjson.JSONDecodeError as error:
                raise TemplateError(f"body template did not produce valid JSON: {error}") from None
            defaults["Content-Type"] = "application/json"
        elif settings.format == "form":
            body = urlencode(render_map(settings.form, values)).encode()
            defaults["Content-Type"] = "application/x-www-form-urlencoded"
        else:
            body = envelope.payload.body
            if envelope.payload.content_type:
                defaults["Content-Type"] = envelope.payload.content_type
        layers = [
            defaults,
            relay_headers(envelope, settings.idempotency_key_form),
            render_map(settings.headers, values),
        ]
        if settings.sign:
            # Last: the signature covers the body exactly as it goes out.
            # webhook-id is the delivery's identity (for one stored before
            # identities, the msg_relay_<id> its signed attempts carried).
            delivery = envelope.delivery
            message_id = delivery_key(delivery.id, delivery.message_tag)
            layers.append(signature_headers(settings.sign, message_id, envelope.sent_at, body))
        return Request(settings.method, settings.url, merged_headers(*layers), body)

    def preview(self, envelope: Envelope, *, wire: bool = False) -> str:
        return self.prepare(envelope).display(wire=wire)

    async def send(self, envelope: Envelope) -> Outcome:
        try:
            # Rendered in a worker thread: a heavy template (a loop over a large
            # payload) holds this delivery, not the event loop (relay/templates/sandbox.py).
            prepared = await rendered(self.prepare, envelope, self._wanted)
        except TemplateError as error:
            return Outcome.unsendable(str(error))
        settings = self._settings
        follow = None
        if settings.follow_redirects:
            own = tuple((listen.host, listen.port) for listen in settings.own_listeners)
            follow = Follow(settings.redirect_hosts, own)
        outcome = await exchange(
            self.transport,
            prepared,
            self._judge,
            envelope.paced,
            body_by=envelope.answer_by,
            follow=follow,
        )
        return replace(outcome, request=prepared.sent())


KIND = TargetKind(
    name="http",
    parse=parse,
    build=build,
    destination=destination,
    view=view,
    secrets=secrets,
    secret_keys=("sign",),
    alert_settings=alert_settings,
    own_listeners=own_listeners,
)
