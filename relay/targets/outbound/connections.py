"""How a target's connections are made: the `proxy`, `ca_file`, `client_cert`,
`client_key`, `tls_verify` and `transport` keys every HTTP-style target takes
(http, telegram), its URL's check, and the transport it sends through,
chosen here and nowhere else."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yarl

from relay.config.files import ca_file_problem
from relay.config.reader import ConfigError, Section
from relay.core.secrets import userinfo_secrets
from relay.targets.outbound.transport import Transport

TransportName = Literal["relay", "aiohttp"]
TRANSPORTS: tuple[TransportName, ...] = ("relay", "aiohttp")


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
    # Which transport carries the requests (relay.targets.outbound.transport).
    transport: TransportName = "relay"
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
        """The proxy's credentials, masked wherever they could show, in every
        form they are sent (relay.core.secrets.userinfo_secrets)."""
        return userinfo_secrets(self.proxy) if self.proxy is not None else []


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
        transport=section.choice("transport", TRANSPORTS, "relay"),
        files_changed=tuple(_changed(path) for path in files),
    )


def _changed(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:  # read a moment ago: gone since, and start will say so
        return 0


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


class SessionOwner:
    """A target that sends over its own transport (kept-alive connections),
    opened by `start`."""

    def __init__(self, concurrency: int, outbound: Outbound | None = None) -> None:
        self._concurrency = concurrency
        self._outbound = outbound or Outbound()
        self._transport: Transport | None = None

    async def start(self) -> None:
        self._transport = open_transport(self._outbound, self._concurrency)

    async def close(self) -> None:
        if self._transport is not None:
            await self._transport.close()
            self._transport = None

    @property
    def transport(self) -> Transport:
        assert self._transport is not None, "target not started"
        return self._transport


def open_transport(outbound: Outbound, concurrency: int) -> Transport:
    """The transport `outbound` asks for, keeping as many idle connections as
    attempts may run at once. Imported when a target is started to send, not
    when a config is read (`relay check`, the database commands)."""
    from relay.targets.outbound.client import ENVIRONMENT, Client, Proxy

    proxy: Proxy | str | None = ENVIRONMENT
    if outbound.proxy == "none":
        proxy = None
    elif outbound.proxy is not None:
        proxy = Proxy.parse(outbound.proxy)
    if outbound.transport == "aiohttp":
        from relay.targets.outbound.aiohttp_client import AiohttpTransport

        return AiohttpTransport(keep=concurrency, tls=outbound.tls_context(), proxy=proxy)
    return Client(keep=concurrency, tls=outbound.tls_context(), proxy=proxy)
