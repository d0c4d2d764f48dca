"""What the source kinds (relay/sources/<name>.py) and a route table share: secrets
given as one or a list, Standard Webhooks keys, networks, a fixed answer.

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

from relay.config.model import Answer
from relay.config.reader import ConfigError, Section, as_toml


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
                f'expected an address or network like "91.194.226.0/23", got {as_toml(value)}',
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
