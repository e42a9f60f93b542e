"""Who a client is, for every per-client limit of the server: its address, an IPv6 one by its /64.

One IPv6 subscriber is routinely given a whole /64 (2^64 addresses), so a cap per address would
be no cap at all there: every limit that counts per client (connections, upload budgets, the
queue's shares, the MCP callers' calls, new sessions) counts per :func:`client_group`. An IPv4
address is itself (an IPv4-mapped IPv6 address is its IPv4 one); a name that is no address
(``?``, a test's) is itself too. Standard library only.
"""

from __future__ import annotations

import functools
import ipaddress

V6_PREFIX = 64  # bits of an IPv6 address that name one client


@functools.lru_cache(maxsize=1 << 16)
def client_group(host: str | None) -> str | None:
    """The client ``host`` counts as: ``2001:db8:1:2::/64`` for any address of that /64, the
    address itself for IPv4 (and IPv4-mapped IPv6), ``host`` as it is when it is no address."""
    if not host:
        return host
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, V6_PREFIX), strict=False))
    return str(ip)
