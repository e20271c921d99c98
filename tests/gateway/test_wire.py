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
from tests.gateway_support import REQUEST, completion, raw_answer
from tests.helpers import until

OK = raw_answer("200 OK", b'{"ok": true}', keep_alive=True)


class Recorder:
    """A real HTTP/1.1 server that records each request's head, holds the first request
    `hold` unanswered (noting when its client goes away) and answers every other with OK."""

    def __init__(self, answer: bytes = OK, *, hold: bool = False,
                 tls: ssl.SSLContext | None = None) -> None:
        self.answer = answer
        self.hold = hold
        self.tls = tls
        self.heads: list[bytes] = []
        self.connections = 0
        self.aborted = asyncio.Event()
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.tls)
        port: int = self.server.sockets[0].getsockname()[1]
        return port

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                await reader.readexactly(length)
                self.heads.append(head)
                if self.hold and len(self.heads) == 1:
                    await reader.read()  # nothing comes: returns when the client closes
                    self.aborted.set()
                    return
                writer.write(self.answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()


def _wire(url: str, limit: int = 4) -> ReqwestWire:
    return ReqwestWire(url, {"Content-Type": "application/json"}, limit=limit, keepalive_s=30,
                       connect_timeout_s=2)


@pytest.mark.parametrize("how", ["deadline", "cancelled"])
async def test_a_cancelled_call_is_aborted_by_its_deadline_and_the_pool_serves_the_next(
        how: str) -> None:
    """The caller's deadline ends the call: its connection is closed then (the gateway stops
    working for nobody) and its pool slot is free for the next call. A call cancelled before
    its deadline runs on in reqwest's thread until that deadline, no longer."""
    server = Recorder(hold=True)
    async with server as port:
        wire = _wire(f"http://127.0.0.1:{port}/v1/chat/completions", limit=1)
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
            await asyncio.wait_for(server.aborted.wait(), 2)
            assert time.monotonic() - started < 1.5
            answer = await asyncio.wait_for(wire.post(b"{}", None, 2), 2)
        finally:
            await wire.aclose()
    assert (answer.status, answer.content) == (200, b'{"ok": true}')
    assert answer.headers["content-length"] == answer.headers["Content-Length"] == "12"
    assert (len(server.heads), server.connections) == (2, 2)


async def test_many_cancelled_calls_leave_no_slot_taken() -> None:
    """Calls cancelled while waiting for a connection (the pool full) give their place back:
    as many calls as the pool holds still go out together afterwards."""
    server = Recorder()
    async with server as port:
        wire = _wire(f"http://127.0.0.1:{port}/v1/chat/completions", limit=2)
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
    server = Recorder(raw_answer("200 OK", json.dumps(completion()).encode()), tls=server_tls)
    async with server as port:
        client = GatewayClient(f"https://127.0.0.1:{port}/v1")
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
    proxy = Recorder()
    async with proxy as port:
        for name in ("HTTP_PROXY", "http_proxy"):
            monkeypatch.setenv(name, f"http://127.0.0.1:{port}")
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
