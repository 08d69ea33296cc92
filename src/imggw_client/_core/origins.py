"""Where a result download may be redirected (DESIGN 22, "Names and links").

A result link is the gateway's, and whoever serves it may answer with a redirect. Followed
blindly, a redirect turns the SDK into a way in to the user's own network: a CDN answering
``302 http://127.0.0.1:8080/admin/...`` (or the cloud's metadata address) has the user's machine
fetch that page and save the answer as a result. So a redirect to another origin whose host is
loopback, private or link-local is refused; one within the link's own origin, or to a public
host, is followed. Hosts are judged as written: literal addresses in every form a resolver
reads (``127.1``, ``0x7f000001``, ``::ffff:127.0.0.1``) and the names reserved for local use.
"""

from __future__ import annotations

import ipaddress
import socket

__all__ = ["Origin", "internal_host", "refused_redirect"]

Origin = tuple[str, str, int]  # scheme, host (lower case, no trailing dot), port

# Names that never leave the machine or its network (RFC 6761, 6762, 8375; ICANN's .internal).
_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})
_LOCAL_SUFFIXES = (".localhost", ".local", ".home.arpa", ".internal", ".lan", ".intranet")
_NUMERIC = frozenset("0123456789abcdefx.")  # what inet_aton reads: 127.1, 0x7f.1, 2130706433
_SHARED = ipaddress.IPv4Network("100.64.0.0/10")  # carrier-grade NAT: a provider's own network


def host_key(host: str) -> str:
    """A host as origins compare it: lower case, without the trailing dot, brackets or zone."""
    host = host.strip().lower().rstrip(".")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host.partition("%")[0]


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address a literal host names, in any form a resolver accepts, or None (a name)."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    if host and set(host) <= _NUMERIC and any(c.isdigit() for c in host):
        try:  # the C resolver reads "127.1" and "0x7f000001" as 127.0.0.1: so must we
            return ipaddress.IPv4Address(socket.inet_aton(host))
        except (OSError, ValueError):
            return None
    return None


def _kind_of(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    if isinstance(address, ipaddress.IPv6Address):
        embedded = address.ipv4_mapped or address.sixtofour
        if embedded is not None:
            return _kind_of(embedded)
        if address.is_site_local:
            return "private"
    if address.is_loopback or address.is_unspecified:  # 0.0.0.0 reaches this machine
        return "loopback"
    if address.is_link_local:
        return "link-local"
    if address.is_private or address.is_reserved or address in _SHARED:
        return "private"
    return None


def internal_host(host: str) -> str | None:
    """What kind of host ``host`` is when it is not a public one (``"loopback"``,
    ``"link-local"``, ``"private"``, or ``"local name"`` for a name reserved for a local
    network or one without a dot), None for a public host.
    """
    key = host_key(host)
    address = _address(key)
    if address is not None:
        return _kind_of(address)
    if key in _LOOPBACK_NAMES or key.endswith(".localhost"):
        return "loopback"
    if key.endswith(_LOCAL_SUFFIXES) or "." not in key:
        return "local name"
    return None


def refused_redirect(link: Origin, target: Origin) -> str | None:
    """Why a download of a link of origin ``link`` may not follow a redirect to ``target``
    (the kind of host it is), or None: the link's own origin, or a public host, is fine.
    """
    if (link[0], host_key(link[1]), link[2]) == (target[0], host_key(target[1]), target[2]):
        return None
    return internal_host(target[1])
