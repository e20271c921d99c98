"""Requests to addresses a client chose (webhooks) go to public addresses only, and to the very
address that was checked.

An IPv6 address that embeds an IPv4 one (IPv4-mapped `::ffff:a.b.c.d`, SIIT's IPv4-translated
`::ffff:0:a.b.c.d`, IPv4-compatible `::a.b.c.d`, NAT64 `64:ff9b::/96` and `64:ff9b:1::/48`, 6to4
`2002::/16`, Teredo) is judged by the IPv4 address it carries too: `[::127.0.0.1]` reaches
loopback on many stacks. The rest of `::/64` is unassigned (no public host lives there) and is
refused whole, whatever a translator may make of it. Resolving a
name once to check it and again to connect leaves a DNS-rebinding window, so the transport
below resolves once and connects to the checked address, keeping the name for the `Host`
header and for TLS (SNI and the certificate check).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable

import httpx

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], Awaitable[list[str]]]

_LOW32 = 0xFFFF_FFFF
# IPv6 ranges that carry an IPv4 address, and where it sits (bits to shift right)
_EMBEDDING: tuple[tuple[ipaddress.IPv6Network, int], ...] = (
    (ipaddress.IPv6Network("::ffff:0:0/96"), 0),   # IPv4-mapped
    (ipaddress.IPv6Network("::ffff:0:0:0/96"), 0),  # IPv4-translated (SIIT, RFC 2765)
    (ipaddress.IPv6Network("::/96"), 0),           # IPv4-compatible (deprecated)
    (ipaddress.IPv6Network("64:ff9b::/96"), 0),    # NAT64, well-known prefix
    (ipaddress.IPv6Network("64:ff9b:1::/48"), 0),  # NAT64, local use (RFC 8215)
    (ipaddress.IPv6Network("2002::/16"), 80),      # 6to4
)
_UNASSIGNED = ipaddress.IPv6Network("::/64")  # beside the embeddings above, nothing routable


class AddressRefused(httpx.ConnectError):
    """The destination resolves to an address that is not public."""


def embedded_ipv4(ip: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries, if it is of a form that carries one."""
    if isinstance(ip, ipaddress.IPv4Address):
        return None
    for network, shift in _EMBEDDING:
        if ip in network:
            return ipaddress.IPv4Address((int(ip) >> shift) & _LOW32)
    if ip.teredo is not None:
        return ip.teredo[1]  # the client's address
    return None


def refusal(address: str) -> str | None:
    """Why `address` is not a public unicast address (None when it is)."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if not ip.is_global or ip.is_multicast:
        return f"{address} is not a public address"
    inner = embedded_ipv4(ip)
    if inner is not None and (not inner.is_global or inner.is_multicast):
        return f"{address} embeds the non-public IPv4 address {inner}"
    if inner is None and isinstance(ip, ipaddress.IPv6Address) and ip in _UNASSIGNED:
        return f"{address} is not a public address"
    return None


async def resolve_public(host: str, port: int) -> list[str]:
    """Every address `host` resolves to, checked; ValueError when one is not public."""
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port,
                                                              type=socket.SOCK_STREAM)
    except OSError as exc:
        raise ValueError(f"cannot resolve {host!r}") from exc
    addrs = list(dict.fromkeys(str(info[4][0]) for info in infos))  # resolver order, no dups
    if not addrs:
        raise ValueError(f"cannot resolve {host!r}")
    for a in addrs:
        if (why := refusal(a)) is not None:
            raise ValueError(f"{host!r} resolves to a non-public address: {why}")
    return addrs


class PinnedTransport(httpx.AsyncBaseTransport):
    """Resolves each request's host once, refuses it unless every address is public, and
    sends the request to the first checked address (no second resolution)."""

    def __init__(self, inner: httpx.AsyncBaseTransport | None = None,
                 resolve: Resolver = resolve_public) -> None:
        self._inner = inner or httpx.AsyncHTTPTransport()
        self._resolve = resolve

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        host = url.host
        port = url.port or (443 if url.scheme == "https" else 80)
        try:
            addrs = await self._resolve(host, port)
        except ValueError as exc:
            raise AddressRefused(str(exc), request=request) from None
        # the Host header was set from the name when the request was built; TLS keeps the name
        request.url = url.copy_with(host=addrs[0])
        request.extensions = {**request.extensions, "sni_hostname": host}
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()
