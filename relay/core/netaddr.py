"""Who is really sending: the peer address, or X-Forwarded-For behind a trusted proxy."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

Network = IPv4Network | IPv6Network


def parse_address(text: str | None) -> IPv4Address | IPv6Address | None:
    if not text:
        return None
    value = text.strip()
    if value.startswith("[") and "]" in value:
        value = value[1 : value.index("]")]
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        return None
    # An IPv4 client seen through an IPv6 socket: compare it as IPv4.
    if isinstance(address, IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def within(address: str | None, networks: Sequence[Network]) -> bool:
    parsed = parse_address(address)
    return parsed is not None and any(parsed in network for network in networks)


def client_address(
    peer: str | None, forwarded_for: str | None, trusted: Sequence[Network]
) -> str | None:
    """The sender's address. X-Forwarded-For counts only when the peer is a trusted
    proxy; then the client is the right-most hop that is not itself trusted (hops
    further left were written by the client and prove nothing)."""
    if not trusted or not forwarded_for or not within(peer, trusted):
        return peer
    hops = [hop.strip() for hop in forwarded_for.split(",") if hop.strip()]
    for hop in reversed(hops):
        if not within(hop, trusted):
            return hop
    return hops[0] if hops else peer
