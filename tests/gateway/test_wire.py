"""The network wire (app/gateway/wire.py's ReqwestWire) on real sockets: a cancelled call is
aborted on the wire and leaves the pool usable, TLS trusts the CA certificates httpx would
(SSL_CERT_FILE, SSL_CERT_DIR), and the environment's proxy is honoured as httpx honours it."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import ssl
import time
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from app.gateway.client import GatewayClient
from app.gateway.errors import GatewayUnavailable
from app.gateway.wire import ReqwestWire, WireError
from tests.gateway_support import REQUEST, ScriptedServer, completion, raw_answer
from tests.helpers import until

OK = raw_answer("200 OK", b'{"ok": true}', keep_alive=True)


def _wire(url: str, limit: int = 4) -> ReqwestWire:
    return ReqwestWire(url, {"Content-Type": "application/json"}, limit=limit, keepalive_s=30,
                       connect_timeout_s=2)


@pytest.mark.parametrize("how", ["deadline", "cancelled"])
async def test_a_cancelled_call_is_aborted_by_its_deadline_and_the_pool_serves_the_next(
        how: str) -> None:
    """The caller's deadline ends the call: its connection is closed then (the gateway stops
    working for nobody) and its pool slot is free for the next call. A call cancelled before
    its deadline runs on in reqwest's thread until that deadline (and a backstop), no longer."""
    server = ScriptedServer(None, OK)
    async with server as url:
        wire = _wire(f"{url}/chat/completions", limit=1)
        try:
            started = time.monotonic()
            if how == "deadline":
                with pytest.raises(TimeoutError):
                    async with asyncio.timeout(0.3):
                        await wire.post(b"{}", None, 0.3)
            else:
                call = asyncio.create_task(wire.post(b"{}", None, 0.3))
                await until(lambda: len(server.heads) == 1, 5, "the request sent", every=0.01)
                call.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await call
            await asyncio.wait_for(server.abandoned.wait(), 10)
            assert time.monotonic() - started < 6  # its deadline (0.3 s) and backstop (1 s)
            answer = await asyncio.wait_for(wire.post(b"{}", None, 2), 2)
        finally:
            await wire.aclose()
    assert (answer.status, answer.content) == (200, b'{"ok": true}')
    assert answer.headers["content-length"] == answer.headers["Content-Length"] == "12"
    assert (len(server.heads), server.connections) == (2, 2)


async def test_many_cancelled_calls_leave_no_slot_taken() -> None:
    """Calls cancelled while waiting for a connection (the pool full) give their place back:
    as many calls as the pool holds still go out together afterwards."""
    server = ScriptedServer(OK)
    async with server as url:
        wire = _wire(f"{url}/chat/completions", limit=2)
        try:
            calls = [asyncio.create_task(wire.post(b"{}", None, 1)) for _ in range(20)]
            await asyncio.sleep(0)
            for call in calls:
                call.cancel()
            await asyncio.gather(*calls, return_exceptions=True)
            answers = await asyncio.wait_for(
                asyncio.gather(*(wire.post(b"{}", None, 2) for _ in range(6))), 5)
        finally:
            await wire.aclose()
    assert [a.status for a in answers] == [200] * 6


def _certificates(tmp_path: Path) -> tuple[Path, ssl.SSLContext]:
    """A throwaway CA (its PEM file) and a server context for 127.0.0.1 signed by it."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(days=1))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(
              digital_signature=True, content_commitment=False, key_encipherment=False,
              data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
              encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
                         critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    ca_file = tmp_path / "ca" / "ca.pem"
    ca_file.parent.mkdir()
    ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    chain, key_file = tmp_path / "leaf.pem", tmp_path / "leaf.key"
    chain.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(chain, key_file)
    return ca_file, context


@pytest.mark.parametrize("trust", ["SSL_CERT_FILE", "SSL_CERT_DIR", None])
async def test_tls_trusts_the_ca_certificates_httpx_would(
        trust: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        waits: list[float]) -> None:
    """A gateway's certificate from a private CA is trusted when SSL_CERT_FILE (or
    SSL_CERT_DIR) names that CA; certifi's bundle alone does not trust it."""
    ca_file, server_tls = _certificates(tmp_path)
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    if trust is not None:
        monkeypatch.setenv(trust, str(ca_file if trust == "SSL_CERT_FILE" else ca_file.parent))
    server = ScriptedServer(raw_answer("200 OK", json.dumps(completion()).encode()),
                            tls=server_tls)
    async with server as url:
        client = GatewayClient(url)
        try:
            if trust is None:
                with pytest.raises(GatewayUnavailable) as caught:
                    await client.complete(REQUEST, max_attempts=1, timeout_s=5)
            else:
                result = await client.complete(REQUEST, max_attempts=1, timeout_s=5)
        finally:
            await client.aclose()
    if trust is None:
        [attempt] = caught.value.attempts
        assert attempt.outcome == "connection_error" and server.heads == []
        assert "certificate" in (attempt.error or "").lower()
    else:
        assert result.content == "hi" and len(server.heads) == 1


@pytest.mark.parametrize("bypass", [False, True])
async def test_the_environments_proxy_carries_the_call_unless_no_proxy_names_the_host(
        bypass: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    proxy = ScriptedServer(OK)
    async with proxy as url:
        for name in ("HTTP_PROXY", "http_proxy"):
            monkeypatch.setenv(name, url.removesuffix("/v1"))
        for name in ("NO_PROXY", "no_proxy"):
            monkeypatch.setenv(name, "gateway.invalid" if bypass else "elsewhere.invalid")
        wire = _wire("http://gateway.invalid/v1/chat/completions")
        try:
            if bypass:  # sent directly: the name does not resolve
                with pytest.raises(WireError):
                    await asyncio.wait_for(wire.post(b"{}", None, 5), 5)
            else:
                answer = await asyncio.wait_for(wire.post(b"{}", None, 5), 5)
                assert answer.status == 200
        finally:
            await wire.aclose()
    if bypass:
        assert proxy.heads == []
    else:
        [head] = proxy.heads
        assert head.startswith(b"POST http://gateway.invalid/v1/chat/completions HTTP/1.1")
