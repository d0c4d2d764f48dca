"""Ed25519 signature checks for Standard Webhooks' `v1a` scheme.

Done with `cryptography` (PyCA), imported only when a route names a
`public_key`: it is the package most Python installs already carry (pip,
Debian's python3-cryptography), and it binds OpenSSL's ed25519 rather than
shipping a crypto library of its own. The config loader refuses a
`public_key` when it is not installed, naming the package to install.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from typing import Any


def ed25519_keys(raw_keys: Sequence[bytes]) -> tuple[Any, ...]:
    """Public key objects for the 32-byte keys (none: no import at all)."""
    if not raw_keys:
        return ()
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    return tuple(Ed25519PublicKey.from_public_bytes(key) for key in raw_keys)


def ed25519_valid(public_keys: Sequence[Any], signature: str, message: bytes) -> bool:
    """True when `signature` (base64) is one of these keys' signature of `message`."""
    if not public_keys:
        return False
    from cryptography.exceptions import InvalidSignature

    try:
        raw = base64.b64decode(signature, validate=True)
    except (binascii.Error, ValueError):
        return False
    for key in public_keys:
        try:
            key.verify(raw, message)
        except InvalidSignature:
            continue
        return True
    return False
