"""A route's `source` and its options, read from the route table itself.

[routes.payments]
path = "/hooks/tbank"
source = "tbank"
password = "${TBANK_PASSWORD}"       # or a list, to rotate without losing events
"""

from __future__ import annotations

import base64
import binascii
import importlib.util
import ipaddress
from ipaddress import IPv4Network, IPv6Network

from relay.config.model import (
    Answer,
    CdekSource,
    GenericSource,
    HmacSource,
    SourceSettings,
    StandardWebhooksSource,
    TbankSource,
    TelegramSource,
    TildaSource,
    WooCommerceSource,
)
from relay.config.reader import ConfigError, Section, describe

SOURCES = (
    "generic",
    "tilda",
    "tbank",
    "woocommerce",
    "telegram",
    "cdek",
    "standard-webhooks",
    "hmac",
)

# T-Bank resends a notification for up to a month: its duplicates must be
# recognised that long, whatever the storage retention.
TBANK_DEDUP_WINDOW = 30 * 86400.0


def parse_source(section: Section) -> SourceSettings:
    kind = section.choice("source", SOURCES, "generic")
    if kind == "generic":
        return GenericSource(
            tokens=secret_list(section, "token", required=False),
            token_header=section.string("token_header", "X-Relay-Token"),
            token_query=section.string("token_query", "token"),
        )
    if kind == "tilda":
        return TildaSource(
            api_keys=secret_list(section, "api_key", required=False),
            api_key_header=section.string("api_key_header", "X-Tilda-Api-Key"),
            api_key_field=section.string("api_key_field", "api_key"),
        )
    if kind == "tbank":
        return TbankSource(passwords=secret_list(section, "password"))
    if kind == "woocommerce":
        return WooCommerceSource(secrets=secret_list(section, "secret"))
    if kind == "telegram":
        return TelegramSource(secret_tokens=secret_list(section, "secret_token"))
    if kind == "cdek":
        return CdekSource()
    if kind == "standard-webhooks":
        secrets = tuple(
            whsec(section, "secret", value)
            for value in secret_list(section, "secret", required=False)
        )
        public_keys = tuple(
            whpk(section, "public_key", value)
            for value in secret_list(section, "public_key", required=False)
        )
        if not secrets and not public_keys:
            raise ConfigError(
                section.key("secret"),
                'expected a secret like "whsec_<base64>" (v1 signatures), or public_key'
                ' = "whpk_<base64>" (v1a, ed25519), or both',
            )
        return StandardWebhooksSource(
            secrets=secrets,
            public_keys=public_keys,
            tolerance=section.duration("tolerance", 300.0),
        )
    return HmacSource(
        header=section.string("header"),
        secrets=secret_list(section, "secret"),
        algorithm=section.choice("algorithm", ("sha1", "sha256", "sha512"), "sha256"),
        encoding=section.choice("encoding", ("hex", "base64"), "hex"),
        prefix=section.string("prefix", "", nonempty=False),
    )


def secret_list(section: Section, name: str, *, required: bool = True) -> tuple[str, ...]:
    """One secret, or a list of them (old and new, while rotating)."""
    value = section.take(name) if required else section.take(name, None)
    if value is None:
        return ()
    values = [value] if isinstance(value, str) else value
    if (
        not isinstance(values, list)
        or not values
        or not all(isinstance(v, str) and v for v in values)
    ):
        # Never print the value: it is a secret.
        raise ConfigError(section.key(name), "expected a non-empty string or a list of them")
    return tuple(values)


def whsec(section: Section, name: str, value: str) -> bytes:
    """A Standard Webhooks secret: "whsec_" and the base64 of the key bytes.

    As the spec's reference libraries do, the prefix may be left out and the
    base64 padding too (Webhook.__init__ in standardwebhooks and svix)."""
    key = _base64(value.removeprefix("whsec_"))
    if not key:
        # Never print the value: it is a secret.
        raise ConfigError(section.key(name), 'expected a secret like "whsec_<base64>"')
    return key


def whpk(section: Section, name: str, value: str) -> bytes:
    """A Standard Webhooks ed25519 public key (v1a signatures): "whpk_<base64>"
    of the 32 key bytes. Checking v1a needs the `cryptography` package."""
    key = _base64(value.strip().removeprefix("whpk_"))
    if len(key) != 32:
        raise ConfigError(
            section.key(name), 'expected an ed25519 public key like "whpk_<base64 of 32 bytes>"'
        )
    if importlib.util.find_spec("cryptography") is None:
        raise ConfigError(
            section.key(name),
            "v1a (ed25519) signatures need the cryptography package:"
            " pip install 'relay[ed25519]' (or apt install python3-cryptography)",
        )
    return key


def _base64(text: str) -> bytes:
    """Standard base64, padded or not; b"" when it is not base64 at all."""
    text = text.strip()
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        return b""


def parse_networks(section: Section, name: str) -> tuple[IPv4Network | IPv6Network, ...]:
    values = section.string_list(name, ())
    networks = []
    for index, value in enumerate(values):
        try:
            networks.append(ipaddress.ip_network(value.strip(), strict=False))
        except ValueError:
            raise ConfigError(
                section.key(f"{name}[{index}]"),
                f'expected an address or network like "91.194.226.0/23", got {describe(value)}',
            ) from None
    return tuple(networks)


def parse_answer(section: Section, name: str) -> Answer | None:
    if not section.has(name):
        return None
    table = section.section(name)
    answer = Answer(
        status=table.integer("status", 200, minimum=200, maximum=299),
        body=table.string("body", "", nonempty=False).encode(),
        content_type=table.string("content_type", "text/plain"),
    )
    table.done()
    return answer


def source_secrets(source: SourceSettings) -> set[str]:
    """The credentials in a source's settings, to be masked wherever they show."""
    if isinstance(source, GenericSource):
        return set(source.tokens)
    if isinstance(source, TildaSource):
        return set(source.api_keys)
    if isinstance(source, TbankSource):
        return set(source.passwords)
    if isinstance(source, WooCommerceSource | HmacSource):
        return set(source.secrets)
    if isinstance(source, TelegramSource):
        return set(source.secret_tokens)
    return set()


def minimum_dedup_window(source: SourceSettings) -> float | None:
    return TBANK_DEDUP_WINDOW if isinstance(source, TbankSource) else None
