"""The `http` target: a CRM API or any URL. Forwards the body as it came, or
builds a JSON or form body from templates; classifies the answer."""

from __future__ import annotations

import base64
import contextlib
import email.utils
import re
import ssl
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import parse_qsl, urlencode

import orjson
import yarl
from multidict import CIMultiDictProxy
from yarl import URL

from relay import __version__
from relay.config.files import ca_file_problem
from relay.config.reader import ConfigError, Section
from relay.config.shared import secret_list, whsec
from relay.core.budget import TemplateError
from relay.core.outcome import RESPONSE_EXCERPT_BYTES, Outcome, SentRequest, Verdict
from relay.core.payload import EVENT_VARIABLES, media_type
from relay.core.secrets import Masker
from relay.kinds.base import AlertTemplates, TargetKind
from relay.kinds.target import Envelope, Target
from relay.targets.base import context, relay_headers, render_map, rendered, variables
from relay.targets.signing import signature_headers, webhook_id

if TYPE_CHECKING:
    from relay.targets.httpclient import Client
    from relay.templates import Template

HttpFormat = Literal["raw", "json", "form"]


@dataclass(frozen=True)
class Outbound:
    """How an http or telegram target's connections are made: proxy and TLS."""

    # "http://[user:password@]host:port"; "none" for no proxy; None: what
    # HTTPS_PROXY / HTTP_PROXY / NO_PROXY in relay's environment say.
    proxy: str | None = None
    ca_file: Path | None = None  # trusted instead of the system's certificates
    client_cert: Path | None = None  # mTLS: the certificate relay presents
    client_key: Path | None = None  # its key, when not in client_cert's file
    tls_verify: bool = True
    # When those files were last changed, as read: a certificate renewed in
    # place makes the settings differ, so a reload (SIGHUP) takes it up.
    files_changed: tuple[int, ...] = ()

    def tls_context(self) -> ssl.SSLContext | None:
        """The context https URLs are verified with; None: the system's default."""
        if self.ca_file is None and self.client_cert is None and self.tls_verify:
            return None
        context = ssl.create_default_context(
            cafile=str(self.ca_file) if self.ca_file is not None else None
        )
        if self.client_cert is not None:
            key = str(self.client_key) if self.client_key is not None else None
            context.load_cert_chain(str(self.client_cert), key)
        if not self.tls_verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context

    def secrets(self) -> list[str]:
        """The proxy's password, masked wherever it could show."""
        if self.proxy is None or "@" not in self.proxy:
            return []
        password = yarl.URL(self.proxy).password
        return [password] if password else []


def parse_outbound(section: Section, base: Path) -> Outbound:
    """`proxy`, `ca_file`, `client_cert`, `client_key`, `tls_verify`: the files
    are loaded now, so a wrong one is one line from `relay check`, not a
    failure at the first delivery."""
    proxy = section.string("proxy", None)
    if proxy is not None and proxy != "none":
        try:
            parsed = yarl.URL(proxy)
        except (ValueError, TypeError):
            parsed = None
        if parsed is None or parsed.scheme != "http" or not parsed.host or parsed.path not in "/":
            # Never the value in the message: it may hold a password.
            raise ConfigError(
                section.key("proxy"),
                'expected "http://[user:password@]host:port" (an HTTP proxy; an https'
                ' URL is tunnelled through it) or "none"',
            )
    ca_file = section.path("ca_file", base, None)
    if ca_file is not None and (problem := ca_file_problem(ca_file)):
        raise ConfigError(section.key("ca_file"), problem)
    client_cert = section.path("client_cert", base, None)
    client_key = section.path("client_key", base, None)
    if client_key is not None and client_cert is None:
        raise ConfigError(section.key("client_key"), "is used only with client_cert")
    if client_cert is not None:
        try:
            ssl.create_default_context().load_cert_chain(
                str(client_cert), str(client_key) if client_key is not None else None
            )
        except FileNotFoundError as error:
            raise ConfigError(
                section.key("client_cert"), f"{error.filename or client_cert}: no such file"
            ) from None
        except (ssl.SSLError, OSError) as error:
            raise ConfigError(
                section.key("client_cert"),
                "cannot load the certificate and its key (PEM, the key unencrypted):"
                f" {getattr(error, 'reason', None) or error.strerror or error}",
            ) from None
    files = [path for path in (ca_file, client_cert, client_key) if path is not None]
    return Outbound(
        proxy=proxy,
        ca_file=ca_file,
        client_cert=client_cert,
        client_key=client_key,
        tls_verify=section.boolean("tls_verify", True),
        files_changed=tuple(_changed(path) for path in files),
    )


def _changed(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:  # read a moment ago: gone since, and start will say so
        return 0


@dataclass(frozen=True)
class HttpSettings:
    url: str
    method: str = "POST"
    # Header values are templates (a plain value is a template with no tags).
    headers: Mapping[str, Template] = field(default_factory=lambda: MappingProxyType({}))
    format: HttpFormat = "raw"
    body: Template | None = None  # format = "json": must render valid JSON
    form: Mapping[str, Template] = field(default_factory=lambda: MappingProxyType({}))
    # Standard Webhooks signing keys (decoded from "whsec_<base64>"): one
    # signature each, so a receiver rotating its secret accepts old or new.
    sign: tuple[bytes, ...] = ()
    outbound: Outbound = field(default_factory=Outbound)
    # 307 and 308 followed (method and body kept), to the same host or these.
    follow_redirects: bool = False
    redirect_hosts: tuple[str, ...] = ()


HTTP_METHODS = ("POST", "PUT", "PATCH", "DELETE", "GET")
HTTP_FORMATS: tuple[HttpFormat, ...] = ("raw", "json", "form")


def parse_url(section: Section, name: str, default: str | None = None) -> str:
    url: str = section.string(name) if default is None else section.string(name, default)
    try:
        parsed = yarl.URL(url)
    except (ValueError, TypeError):
        parsed = None
    if (
        parsed is None
        or parsed.scheme not in ("http", "https")
        or not parsed.host
        or not _host_name(parsed.host)
    ):
        raise section.error(name, "an http:// or https:// URL", url)
    return url


def _host_name(host: str) -> bool:
    """Whether a lookup could ever find `host`: yarl takes "crm .example" and
    "crm%20.example" as hosts, whose deliveries would wait out every retry.
    (An IPv6 literal's zone, "fe80::1%eth0", keeps its "%".)"""
    if any(not char.isprintable() or char.isspace() for char in host):
        return False
    return "%" not in host or ":" in host


# RFC 9110 section 5.1: a field name is a token.
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


def breaks_header(value: str) -> bool:
    """Whether a header value holds what no value may: CR, LF or NUL (RFC 9110
    section 5.5). Asked of a value as written (at load) and as rendered."""
    return any(char in value for char in "\r\n\0")


def _check_header(section: Section, name: str, source: str) -> None:
    """A header that could never be sent is refused at load: every delivery
    with it would be dead at its first attempt. A value written without
    template syntax is sent as written; a templated one is checked as rendered
    (relay.targets.http.header_values)."""
    key = section.key(f"headers.{name}")
    if not _TOKEN.fullmatch(name):
        raise ConfigError(key, "is not a header name: letters, digits and !#$%&'*+-.^_`|~ only")
    if "{" not in source and breaks_header(source):
        raise ConfigError(key, "holds a line break or NUL, which a header value cannot hold")
    if "{" not in source and not source.isascii():
        # RFC 9110 section 5.5: field values are ASCII (other bytes are
        # obs-text, which many servers refuse). A templated value is checked
        # as rendered (relay.targets.http.header_values).
        raise ConfigError(
            key, "holds non-ASCII text, which a header cannot carry: percent-encode it"
        )


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
        sign=sign,
        outbound=parse_outbound(section, base),
        follow_redirects=follow_redirects,
        redirect_hosts=redirect_hosts,
    )


def build(name: str, settings: HttpSettings, concurrency: int) -> Target:
    return HttpTarget(name, settings, concurrency=concurrency)


def describe(settings: HttpSettings, masker: Masker) -> str:
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
    # The base64 part of "whsec_...": masked whether or not the prefix shows.
    return [base64.b64encode(key).decode() for key in settings.sign] + settings.outbound.secrets()


def alert_settings(settings: HttpSettings, alert: AlertTemplates) -> HttpSettings | None:
    """The alert's JSON as is; the URL, method and header templates kept (they
    carry its credentials). A raw body already is the alert's JSON."""
    if settings.format == "raw":
        return None
    return replace(settings, format="raw", body=None, form=MappingProxyType({}))


USER_AGENT = f"relay/{__version__}"


@dataclass(frozen=True)
class Request:
    method: str
    url: str
    headers: dict[str, str]
    body: bytes

    def describe(self, *, wire: bool = False) -> str:
        """For display (`relay render`, the resend preview): credential headers
        are masked. A form body shows its fields decoded, one a line; a JSON
        body indented, its text as text (a template's `tojson` writes Cyrillic
        as \\u escapes: valid, and unreadable) — unless `wire` asks for the
        bytes that go out."""
        masker = Masker()
        lines = [f"{self.method} {masker.text(self.url)}"]
        lines += [f"{name}: {masker.header(name, value)}" for name, value in self.headers.items()]
        kind = media_type(self.headers.get("Content-Type", ""))
        if not wire and kind == "application/x-www-form-urlencoded":
            fields = parse_qsl(self.body.decode("utf-8", "replace"), keep_blank_values=True)
            lines += ["", "form fields (decoded):"]
            lines += [f"  {name} = {value}" for name, value in fields]
            return "\n".join(lines)
        if not wire and (kind == "application/json" or kind.endswith("+json")):
            # Numbers orjson cannot hold (past 64 bits): the bytes as they are.
            with contextlib.suppress(orjson.JSONDecodeError, orjson.JSONEncodeError):
                pretty = orjson.dumps(orjson.loads(self.body), option=orjson.OPT_INDENT_2)
                return "\n".join([*lines, "", pretty.decode()])
        lines += ["", self.body.decode("utf-8", errors="replace")]
        return "\n".join(lines)

    def sent(self) -> SentRequest:
        """This request as the attempt keeps it (the scheduler masks and cuts it)."""
        return SentRequest(self.method, self.url, tuple(self.headers.items()), self.body)


class SessionOwner:
    """A target that sends over its own kept-alive connections, opened by `start`."""

    def __init__(self, concurrency: int, outbound: Outbound | None = None) -> None:
        self._concurrency = concurrency
        self._outbound = outbound or Outbound()
        self._client: Client | None = None

    async def start(self) -> None:
        # The client is imported when a target is started to send, not when a
        # config is read (`relay check`, the operator commands).
        from relay.targets.httpclient import ENVIRONMENT, Client, Proxy

        outbound = self._outbound
        proxy: Proxy | str | None = ENVIRONMENT
        if outbound.proxy == "none":
            proxy = None
        elif outbound.proxy is not None:
            proxy = Proxy.parse(outbound.proxy)
        # As many idle connections kept as attempts may run at once.
        self._client = Client(keep=self._concurrency, tls=outbound.tls_context(), proxy=proxy)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    @property
    def session(self) -> Client:
        assert self._client is not None, "target not started"
        return self._client


class HttpTarget(SessionOwner):
    def __init__(self, name: str, settings: HttpSettings, *, concurrency: int) -> None:
        super().__init__(concurrency, settings.outbound)
        self.name = name
        self._settings = settings
        self._wanted = variables(
            [*settings.headers.values(), settings.body, *settings.form.values()]
        )

    def prepare(self, envelope: Envelope) -> Request:
        """The request to send; raises TemplateError when a template fails for this event."""
        settings = self._settings
        values = context(envelope, self._wanted) if self._wanted else {}
        headers = {"User-Agent": USER_AGENT, **header_values(render_map(settings.headers, values))}
        if settings.format == "json":
            assert settings.body is not None
            body = settings.body.render(values).encode()
            try:
                orjson.loads(body)
            except orjson.JSONDecodeError as error:
                raise TemplateError(f"body template did not produce valid JSON: {error}") from None
            headers["Content-Type"] = "application/json"
        elif settings.format == "form":
            body = urlencode(render_map(settings.form, values)).encode()
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        else:
            body = envelope.payload.body
            if envelope.payload.content_type:
                headers["Content-Type"] = envelope.payload.content_type
        headers.update(relay_headers(envelope))
        if settings.sign:
            # Last: the signature covers the body exactly as it goes out.
            message_id = webhook_id(envelope.delivery.id, envelope.delivery.message_tag)
            headers.update(signature_headers(settings.sign, message_id, envelope.sent_at, body))
        return Request(settings.method, settings.url, headers, body)

    def preview(self, envelope: Envelope, *, wire: bool = False) -> str:
        return self.prepare(envelope).describe(wire=wire)

    async def send(self, envelope: Envelope) -> Outcome:
        session = self.session
        try:
            # Rendered in a worker thread: a heavy template (a loop over a large
            # payload) holds this delivery, not the event loop (relay/templates/sandbox.py).
            prepared = await rendered(self.prepare, envelope, self._wanted)
        except TemplateError as error:
            return Outcome.unsendable(str(error))
        settings = self._settings
        outcome = await exchange(
            session,
            prepared,
            classify,
            envelope.paced,
            body_by=envelope.answer_by,
            follow=Follow(settings.redirect_hosts) if settings.follow_redirects else None,
        )
        return replace(outcome, request=prepared.sent())


def header_values(rendered: dict[str, str]) -> dict[str, str]:
    """Rendered header values, refused when one cannot be a header (a line
    break from the payload, a non-ASCII character), with the name of the
    header and the reason."""
    for name, value in rendered.items():
        if breaks_header(value):
            raise TemplateError(
                f"header {name}: the template's output contains a line break or NUL,"
                " which a header value cannot hold"
            )
        if not value.isascii():
            # RFC 9110 section 5.5: field values are ASCII; anything else is
            # obs-text, refused by many servers and read as Latin-1 by others
            # (httpx refuses it too). Not guessed at: the person chooses.
            raise TemplateError(
                f"header {name}: the template's output holds non-ASCII text, which a header"
                " cannot carry as such: encode it in the template (| urlencode) or send it"
                " in the body"
            )
    return rendered


# A 307 or 308 repeats the request as it was, method and body (RFC 9110
# sections 15.4.8-9); 301, 302 and 303 let clients turn a POST into a GET
# (15.4.2-4), which would deliver nothing: never followed.
_KEEPS_THE_REQUEST = (307, 308)
MAX_REDIRECTS = 5


@dataclass(frozen=True)
class Follow:
    """Redirects followed: 307 and 308, to the same host or these."""

    hosts: tuple[str, ...] = ()


async def exchange(
    session: Client,
    prepared: Request,
    judge: Callable[[int, CIMultiDictProxy[str], bytes], Outcome],
    paced: Callable[[], Awaitable[None]] | None = None,
    *,
    body_by: Callable[[], float] | None = None,
    follow: Follow | None = None,
) -> Outcome:
    """Send a request; network trouble is a retry (ClientError says which),
    the answer goes to `judge`. A redirect is followed only as `follow`
    allows; compressed answers are not asked for. `paced` (Envelope.paced)
    is awaited with the connection open, right before the first request is
    written; the hops of a redirect are one request, one turn."""
    from relay.targets.httpclient import ClientError  # loaded already: the session is one

    for _ in range(MAX_REDIRECTS + 1):
        try:
            answer = await session.request(
                prepared.method,
                prepared.url,
                prepared.headers,
                prepared.body,
                keep=RESPONSE_EXCERPT_BYTES,
                body_by=body_by,
                before_write=paced,
            )
            paced = None
        except ClientError as error:
            return Outcome.retry(str(error)) if error.retryable else Outcome.fail(str(error))
        status = answer.status
        if 300 <= status < 400:
            where = answer.headers.get("Location")
            moved = _redirect(prepared.url, where, status, follow)
            if isinstance(moved, str):
                return Outcome.fail(moved, status, answer.excerpt)
            prepared = replace(prepared, url=str(moved))
            continue
        outcome = judge(status, answer.headers, answer.excerpt)
        if not answer.whole and outcome.verdict is Verdict.SUCCESS:
            # The status came: the target took the request. Waiting out the
            # body would make the attempt a timeout, and a retry deliver it again.
            return replace(outcome, error=f"HTTP {status}; its body stopped coming, kept as sent")
        return outcome
    return Outcome.fail(f"more than {MAX_REDIRECTS} redirects, the last to {prepared.url}")


def _redirect(url: str, location: str | None, status: int, follow: Follow | None) -> URL | str:
    """The URL a redirect is followed to, or why it is not: where it pointed
    and what to change in the config (the delivery is dead: a person decides)."""
    if not location or not location.strip():
        return f"HTTP {status} without a Location: a redirect to nowhere"
    try:
        current = URL(url)
        moved = current.join(URL(location.strip()))
    except (ValueError, TypeError):
        return f"HTTP {status} to a Location that is not a URL"
    shown = str(moved.with_user(None))  # never a password, were one in it
    if len(shown) > _SHOWN_LIMIT:
        shown = shown[: _SHOWN_LIMIT - 1] + "…"
    said = f"HTTP {status} to {shown}"
    if moved.scheme not in ("http", "https") or not moved.host:
        return f"{said}: not an http(s) URL"
    if status in (301, 302, 303):
        return (
            f"{said}: not followed ({status} may turn a POST into a GET);"
            " if the target moved, set its url to this one"
        )
    if follow is None or status not in _KEEPS_THE_REQUEST:
        return (
            f"{said}: redirects are not followed; if the target moved, set its url to"
            " this one, or set follow_redirects = true"
        )
    host = (moved.host or "").lower()
    if host != (current.host or "").lower() and host not in follow.hosts:
        return f"{said}: another host, not followed unless listed in redirect_hosts"
    if current.scheme == "https" and moved.scheme == "http":
        return f"{said}: from https to http, never followed"
    if current.user is not None and moved.user is None and moved.host == current.host:
        # Basic credentials written in the url go on to the same host.
        moved = moved.with_user(current.user).with_password(current.password)
    return moved


_SHOWN_LIMIT = 300


def classify(status: int, headers: CIMultiDictProxy[str], excerpt: bytes) -> Outcome:
    if 200 <= status < 300:
        return Outcome.success(status, excerpt)
    reason = f"HTTP {status}"
    said = answer_says(excerpt)
    if said:
        reason += f": {said}"
    if status == 429 or status >= 500:
        # Bitrix24's QUERY_LIMIT_EXCEEDED is a 503: a retry, like every 5xx.
        retry_after = parse_retry_after(headers.get("Retry-After"))
        return Outcome.retry(reason, status, excerpt, retry_after)
    return Outcome.fail(reason, status, excerpt)


# Where JSON APIs put their reason: Bitrix24 ({"error": "...", "error_description":
# "..."}), OAuth-style and most CRMs (error_description, message, detail).
_REASON_KEYS = ("error_description", "message", "detail", "description", "error")
_REASON_LIMIT = 200


def answer_says(excerpt: bytes) -> str:
    """The reason a JSON error answer gives, on one short line ("" if none).

    A person reading `relay stats`, an alert or the attempt log should see the
    CRM's "Phone is not valid", not only "HTTP 400"."""
    try:
        answer = orjson.loads(excerpt)
    except orjson.JSONDecodeError:
        return ""
    if not isinstance(answer, dict):
        return ""
    for key in _REASON_KEYS:
        value = answer.get(key)
        if isinstance(value, str) and value.strip():
            line = " ".join(value.split())
            return line if len(line) <= _REASON_LIMIT else line[: _REASON_LIMIT - 1] + "…"
    return ""


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds from a Retry-After header: a number of seconds or an HTTP date
    (RFC 9110 section 10.2.3); None for anything else, which leaves the
    normal backoff (a header that cannot be read is no reason to lose the
    answer's status)."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():  # not "²": str.isdigit takes it, float() not
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError, OSError):
        return None
    return max(0.0, when - (now if now is not None else time.time()))


KIND = TargetKind(
    name="http",
    parse=parse,
    build=build,
    describe=describe,
    view=view,
    secrets=secrets,
    secret_keys=("sign",),
    alert_settings=alert_settings,
)
