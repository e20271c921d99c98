"""Webhook addresses (SSRF): IPv6 forms that embed an IPv4 address are refused as that address
is, and a delivery resolves its host once and sends to what it checked."""

from __future__ import annotations

import httpx
import pytest

from tests.webhook_support import assert_webhook_url_refused


@pytest.mark.parametrize("url", [
    "https://[::127.0.0.1]/x",                     # IPv4-compatible
    "https://[::ffff:127.0.0.1]/x",                # IPv4-mapped
    "https://[::ffff:a9fe:a9fe]/latest",           # mapped 169.254.169.254
    "https://[64:ff9b::7f00:1]/x",                 # NAT64 of 127.0.0.1
    "https://[64:ff9b::a00:1]/x",                  # NAT64 of 10.0.0.1
    "https://[64:ff9b:1::a00:1]/x",                # local-use NAT64
    "https://[2002:7f00:1::]/x",                   # 6to4 of 127.0.0.1
    "https://[2002:c0a8:101::1]/x",                # 6to4 of 192.168.1.1
    "https://[2001:0:4136:e378:8000:63bf:80ff:fffe]/x",  # Teredo, client 127.0.0.1
    "https://[::]/x",
    "https://[fe80::1%25eth0]/x",
    "https://2130706433/x",                        # 127.0.0.1 as one number
    "https://0x7f.1/x",
    "https://[ff0e::1]/x",                         # multicast
    "https://[::1:8443/x",                         # not a URL at all
])
async def test_ipv6_forms_of_private_addresses_are_refused(sqlite_url: str, url: str) -> None:
    await assert_webhook_url_refused(sqlite_url, url)


def test_embedded_ipv4_is_judged_like_the_ipv4_address() -> None:
    from app.outbound import refusal

    assert refusal("93.184.216.34") is None
    assert refusal("2606:2800:220:1:248:1893:25c8:1946") is None
    for private in ("::127.0.0.1", "64:ff9b::7f00:1", "2002:7f00:1::", "::ffff:10.0.0.1",
                    "127.0.0.1", "10.1.2.3", "100.64.0.1", "0.0.0.0", "::1"):
        assert refusal(private) is not None, private


async def test_the_connection_goes_to_the_address_that_was_checked() -> None:
    """One resolution per request: a name that changes its answer between the check and the
    connection (DNS rebinding) cannot redirect the request."""
    from app.outbound import AddressRefused, PinnedTransport

    answers = [["93.184.216.34"], ["127.0.0.1"]]
    lookups: list[str] = []

    async def resolve(host: str, port: int) -> list[str]:
        lookups.append(f"{host}:{port}")
        from app.outbound import refusal

        addrs = answers.pop(0)
        if any(refusal(a) for a in addrs):
            raise ValueError(f"{host!r} resolves to a non-public address")
        return addrs

    seen: list[httpx.Request] = []

    def receiver(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200)

    pinned = PinnedTransport(httpx.MockTransport(receiver), resolve=resolve)
    async with httpx.AsyncClient(transport=pinned) as client:
        r = await client.post("https://hooks.example/x", content=b"{}")
        assert r.status_code == 200
        with pytest.raises(AddressRefused):
            await client.post("https://hooks.example/x", content=b"{}")
    assert lookups == ["hooks.example:443", "hooks.example:443"]
    assert len(seen) == 1  # the refused one never left
    sent = seen[0]
    assert sent.url.host == "93.184.216.34" and sent.url.path == "/x"
    assert sent.headers["host"] == "hooks.example"
    assert sent.extensions["sni_hostname"] == "hooks.example"  # TLS checks the name
