"""The aiohttp network path (app/gateway/wire.py) on real sockets: one pool, hostile answers,
redirects, size caps, connections that never open, keep-alive against a closing server."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from app.gateway import wire
from app.gateway.answers import _loads
from app.gateway.chat import Usage
from app.gateway.client import GatewayClient
from app.gateway.errors import GatewayRejected, GatewayUnavailable
from tests.gateway_support import (
    API_KEY,
    REQUEST,
    ScriptedServer,
    completion,
    raw_answer,
)
from tests.helpers import until

OK_BODY = json.dumps(completion()).encode()


async def test_network_calls_share_one_pool_of_at_most_max_inflight_connections() -> None:
    server = ScriptedServer(raw_answer("200 OK", OK_BODY, "Content-Type: application/json",
                                       keep_alive=True))
    async with server as url:
        client = GatewayClient(url, max_inflight=4)
        try:
            server.release.clear()
            calls = [asyncio.create_task(client.complete(REQUEST)) for _ in range(12)]
            await until(lambda: server.held == 4, 10, "4 requests held", every=0.01)
            await asyncio.sleep(0.05)  # the other 8 wait for a connection, not a new one
            assert (server.held, server.connections) == (4, 4)
            server.release.set()
            results = await asyncio.gather(*calls)
        finally:
            await client.aclose()
    assert all(r.content == "hi" and len(r.attempts) == 1 for r in results)
    assert (server.requests, server.connections, server.most_held) == (12, 4, 4)


def _gzipped(body: bytes) -> bytes:
    import gzip
    return gzip.compress(body)


# What a hostile or broken gateway can answer on a real socket, and how each attempt is
# classified (the aiohttp path: the mock-transport cases above go through httpx).
NETWORK_ANSWERS = [
    ("ok-gzip", raw_answer("200 OK", _gzipped(OK_BODY), "Content-Encoding: gzip"),
     "ok", 200, None),
    ("bad-gzip", raw_answer("200 OK", b"not gzip", "Content-Encoding: gzip"),
     "invalid_response", None, "undecodable body"),
    ("not-http", b"\x00\x01garbage\r\n\r\n", "connection_error", None, "Bad status line"),
    ("bad-status", b"HTTP/1.1 abc OK\r\n\r\n", "connection_error", None, "status"),
    ("truncated", b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"a\":",
     "connection_error", None, "payload"),
    ("closed-unanswered", b"", "connection_error", None, "disconnected"),
    ("huge-header", raw_answer("200 OK", OK_BODY, "X-Pad: " + "a" * 20_000),
     "connection_error", None, "8190"),
    ("bad-chunks", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
     "connection_error", None, "chunk"),
    ("latin-1-reason", raw_answer("503 \u00dcberlastet", b"{}"), "server_error", 503, "HTTP 503"),
    ("silent", None, "timeout", None, "no response within"),
]


@pytest.mark.parametrize(("answer", "outcome", "status", "error"),
                         [case[1:] for case in NETWORK_ANSWERS],
                         ids=[case[0] for case in NETWORK_ANSWERS])
async def test_hostile_answers_on_the_network_are_classified(
        answer: bytes | None, outcome: str, status: int | None, error: str | None,
        waits: list[float]) -> None:
    good = raw_answer("200 OK", OK_BODY)
    server = ScriptedServer(answer, good, close=True)
    async with server as url:
        client = GatewayClient(url, API_KEY)
        try:
            result = await client.complete(REQUEST, timeout_s=0.3)
        finally:
            await client.aclose()
    first = result.attempts[0]
    assert (first.outcome, first.status_code) == (outcome, status)
    assert error is None or error.lower() in (first.error or "").lower()
    assert API_KEY not in (first.error or "") and result.content == "hi"
    assert len(result.attempts) == (1 if outcome == "ok" else 2)


@pytest.mark.parametrize("status", ["307 Temporary Redirect", "308 Permanent Redirect",
                                    "302 Found"])
async def test_a_redirect_is_an_answer_not_an_address_to_follow(status: str) -> None:
    """A gateway naming another URL (its own, or an internal one) is refused as it is: the
    caller's body and our key are not sent again anywhere."""
    server = ScriptedServer(raw_answer(status, b"", "Location: /stolen"),
                            raw_answer("200 OK", OK_BODY), close=True)
    async with server as url:
        client = GatewayClient(url, API_KEY)
        try:
            with pytest.raises(GatewayRejected) as caught:
                await client.complete(REQUEST, timeout_s=2)
        finally:
            await client.aclose()
    assert server.requests == 1
    [attempt] = caught.value.attempts
    assert (attempt.outcome, attempt.status_code) == ("client_error", int(status[:3]))


def _chunked(body: bytes) -> bytes:
    pieces = [body[i:i + 700] for i in range(0, len(body), 700)]
    return (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
            + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n")


BIG = json.dumps(completion("x" * 5000)).encode()


@pytest.mark.parametrize("answer", [
    pytest.param(raw_answer("200 OK", BIG), id="declared-length"),
    pytest.param(_chunked(BIG), id="chunked"),
    pytest.param(raw_answer("200 OK", _gzipped(BIG), "Content-Encoding: gzip"), id="gzip-bomb"),
])
async def test_an_answer_past_the_size_cap_is_refused(
        answer: bytes, waits: list[float], monkeypatch: pytest.MonkeyPatch) -> None:
    """An endless (or decompression-bomb) answer would take the process's memory: it is read
    up to the call's bound, then an invalid_response, retried."""
    monkeypatch.setattr(wire, "ANSWER_FLOOR_BYTES", 4000)  # REQUEST's 64 tokens: 4,096 bytes
    monkeypatch.setattr(wire, "BYTES_PER_TOKEN", 1)
    server = ScriptedServer(answer, raw_answer("200 OK", OK_BODY), close=True)
    async with server as url:
        client = GatewayClient(url, API_KEY)
        try:
            result = await client.complete(REQUEST, timeout_s=2)
        finally:
            await client.aclose()
    first, ok = result.attempts
    assert (first.outcome, ok.outcome) == ("invalid_response", "ok") and result.content == "hi"
    assert "answer over" in (first.error or "") and first.usage == Usage()


async def test_a_connection_that_never_opens_is_a_timeout(waits: list[float]) -> None:
    """A gateway whose accept queue is full never completes the handshake: the connect timer
    runs out, and the attempt is a `timeout` (retried), not a broken connection."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    queued = []
    try:
        for _ in range(3):  # fill the accept queue: later handshakes get no answer
            extra = socket.socket()
            extra.setblocking(False)
            extra.connect_ex(("127.0.0.1", port))
            queued.append(extra)
        await asyncio.sleep(0.1)
        client = GatewayClient(f"http://127.0.0.1:{port}/v1", connect_timeout_s=0.2)
        try:
            with pytest.raises(GatewayUnavailable) as caught:
                await client.complete(REQUEST, max_attempts=2, timeout_s=5)
        finally:
            await client.aclose()
    finally:
        for sock in (*queued, listener):
            sock.close()
    assert [a.outcome for a in caught.value.attempts] == ["timeout", "timeout"]
    assert all(a.latency_s < 2 for a in caught.value.attempts)  # the connect timer, not 5 s
    # the stored error names the timer that ran out, not the attempt's 5 s
    assert all(a.error == "no connection within 0.2 s" for a in caught.value.attempts)


async def test_wait_hints_arrive_over_the_network_in_any_case() -> None:
    server = ScriptedServer(raw_answer("429 Too Many Requests", b"{}", "RETRY-AFTER-MS: 150"),
                            raw_answer("200 OK", OK_BODY))
    async with server as url:
        client = GatewayClient(url)
        try:
            started = time.monotonic()
            result = await client.complete(REQUEST)
        finally:
            await client.aclose()
    assert [a.outcome for a in result.attempts] == ["rate_limited", "ok"]
    assert result.attempts[0].retry_after_s == 0.15 and time.monotonic() - started >= 0.15


class ClosingServer(ScriptedServer):
    """A real HTTP/1.1 server that, like uvicorn past its keep-alive timeout, has given up on
    a connection idle for `idle_s`: a request arriving on it is dropped unanswered."""

    def __init__(self, idle_s: float) -> None:
        super().__init__()
        self.idle_s = idle_s
        self.answered = 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        body = json.dumps(completion()).encode()
        idle_since = time.monotonic()
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if time.monotonic() - idle_since > self.idle_s:
                    return  # closed unanswered: the client sees a ReadError
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                await reader.readexactly(length)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
                await writer.drain()
                self.answered += 1
                idle_since = time.monotonic()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.mark.parametrize(("keepalive_s", "attempts", "connections"),
                         [(0.2, 1, 2), (5.0, 2, 2)])
async def test_idle_connections_are_closed_before_the_server_closes_them(
        keepalive_s: float, attempts: int, connections: int, waits: list[float]) -> None:
    """A connection idle past the server's keep-alive timeout is one the server is closing: a
    request sent on it fails unread and costs an attempt. Closed by the client first (its
    keep-alive below the server's), the call goes out on a fresh connection at once."""
    server = ClosingServer(idle_s=0.5)
    async with server as url:
        client = GatewayClient(url, keepalive_s=keepalive_s)
        try:
            await client.complete(REQUEST)
            await asyncio.sleep(0.7)
            result = await client.complete(REQUEST)
        finally:
            await client.aclose()
    assert [a.outcome for a in result.attempts] == ["connection_error", "ok"][-attempts:]
    assert (server.connections, server.answered) == (connections, 2)


@pytest.mark.parametrize("raw", [
    b'{"a": 1, "a": 2}', b"[NaN, Infinity, -Infinity]", b"1e400", b"123456789012345678901234567890",
    b'"\\ud800"',  # a lone surrogate escape: pydantic-core refuses it, json reads it
    b"\xef\xbb\xbf{}",  # a BOM
    '{"a": "\u00e9"}'.encode("utf-16"),  # json detects UTF-16
    b"[1,]", b"01", b"1" * 5000, b"[" * 3000 + b"]" * 3000, b"\xff", b"",
])
def test_an_answer_reads_as_the_standard_library_reads_it(raw: bytes) -> None:
    try:
        expected = json.loads(raw)
    except (ValueError, RecursionError):
        expected = None
    assert repr(_loads(raw)) == repr(expected)
