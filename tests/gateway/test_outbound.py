"""The outbound address check (app/outbound.py): every IPv6 form that carries an IPv4 address is
judged by that address, SIIT's `::ffff:0:a.b.c.d` included, and the unassigned rest of `::/64`
is refused whole."""

from __future__ import annotations

import ipaddress

import pytest

from app.outbound import embedded_ipv4, refusal
from tests.webhook_support import assert_webhook_url_refused

# the addresses a request to a private target would use: loopback, RFC 1918, link-local (cloud
# metadata), carrier-grade NAT, "this network"
TARGETS = ["127.0.0.1", "10.0.0.1", "192.168.1.1", "169.254.169.254", "100.64.0.1", "0.0.0.0"]


def _forms(v4: str) -> dict[str, str]:
    """`v4` inside each IPv6 form that embeds an IPv4 address."""
    n = int(ipaddress.IPv4Address(v4))
    high, low = n >> 16, n & 0xFFFF
    return {
        "mapped": f"::ffff:{v4}",
        "siit": f"::ffff:0:{v4}",
        "siit-hex": f"::ffff:0:{high:x}:{low:x}",
        "compatible": f"::{v4}",
        "nat64": f"64:ff9b::{v4}",
        "nat64-local": f"64:ff9b:1::{high:x}:{low:x}",
        "6to4": f"2002:{high:x}:{low:x}::1",
        # Teredo: server 65.54.227.120, client obfuscated (bits inverted) in the low 32 bits
        "teredo": f"2001:0:4136:e378:8000:63bf:{high ^ 0xFFFF:x}:{low ^ 0xFFFF:x}",
    }


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("form", list(_forms("127.0.0.1")))
def test_every_embedding_of_a_private_ipv4_address_is_refused(form: str, target: str) -> None:
    address = _forms(target)[form]
    assert refusal(address) is not None, address


@pytest.mark.parametrize("form", ["siit", "siit-hex"])
def test_siit_carries_its_ipv4_address(form: str) -> None:
    ip = ipaddress.IPv6Address(_forms("127.0.0.1")[form])
    assert embedded_ipv4(ip) == ipaddress.IPv4Address("127.0.0.1")
    assert "127.0.0.1" in (refusal(str(ip)) or "")


@pytest.mark.parametrize("address", ["::1:2:3:4", "::1:ffff:7f00:1", "::2", "::1:0:7f00:1"])
def test_the_unassigned_rest_of_the_first_64_bits_is_refused(address: str) -> None:
    assert refusal(address) is not None


@pytest.mark.parametrize("address", ["93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946",
                                     "64:ff9b::5db8:d822", "2002:5db8:d822::1"])
def test_public_addresses_pass(address: str) -> None:
    assert refusal(address) is None


@pytest.mark.parametrize("url", [
    "https://[::ffff:0:127.0.0.1]/x",      # SIIT of loopback
    "https://[::ffff:0:a9fe:a9fe]/latest",  # SIIT of 169.254.169.254 (cloud metadata)
    "https://[::ffff:0:a00:1]/x",           # SIIT of 10.0.0.1
    "https://[::1:0:7f00:1]/x",             # unassigned ::/64
])
async def test_a_webhook_to_a_siit_address_is_refused(database_url: str, url: str) -> None:
    await assert_webhook_url_refused(database_url, url)
