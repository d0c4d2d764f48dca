"""`type = "http"`: a request to a URL, the body as received or from templates."""

from __future__ import annotations

import base64
import re
import ssl
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

import yarl

from relay.config.files import ca_file_problem
from relay.config.reader import ConfigError, Section
from relay.config.sources import secret_list, whsec
from relay.kinds.base import AlertTemplates, TargetKind
from relay.payload import EVENT_VARIABLES

if TYPE_CHECKING:
    from relay.secrets import Masker
    from relay.targets.base import Target
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
    from relay.targets.http import HttpTarget  # the HTTP client: only to send

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
