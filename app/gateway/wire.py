"""How a buffered gateway call travels: reqwest on the network, or an httpx transport handed in.

reqwest (Rust, through pyreqwest) is the network path because of what one call costs the event
loop: its connections, parser and TLS run on a Tokio thread, so the loop's thread only hands
over the body and takes the answer, a fraction of what aiohttp spent there, and that CPU
bounds the engine (docs/decisions/0027-gateway-wire-on-reqwest.md).
The httpx path serves the in-process simulator (ASGITransport) and tests' MockTransports.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

import certifi
import httpx
import pydantic_core
from pyreqwest.client import Client, ClientBuilder
from pyreqwest.exceptions import BodyDecodeError, RequestError, RequestTimeoutError
from pyreqwest.logging import flush_logs
from pyreqwest.proxy import ProxyBuilder
from pyreqwest.response import Response


@dataclass(frozen=True, slots=True)
class Answer:
    """A complete HTTP answer; `headers` look up case-insensitively."""

    status: int
    headers: Mapping[str, str]
    content: bytes


# the most a buffered answer may hold, decoded, when its request names no max_tokens; an
# endless or decompression-bomb answer would take the process's memory, and every swarm with it
MAX_ANSWER_BYTES = 32 * 1024 * 1024
# an answer's bound follows its call (SPEC §4 "Bounded answers"): a token is a few characters,
# each at most 6 bytes as a JSON escape, so 64 bytes a token is generous; the floor leaves
# room for the envelope (ids, usage, a refusal's text) of a short call
ANSWER_FLOOR_BYTES = 1024 * 1024
BYTES_PER_TOKEN = 64


def answer_limit(max_tokens: int | None, choices: int = 1) -> int:
    """The most an answer to a call of `max_tokens` (and `choices` choices) may hold."""
    if not max_tokens or max_tokens < 1:
        return MAX_ANSWER_BYTES
    return max(ANSWER_FLOOR_BYTES, max_tokens * max(choices, 1) * BYTES_PER_TOKEN)


class WireError(Exception):
    """No usable answer: `undecodable` when the body's Content-Encoding did not decode,
    `too_large` when it passed MAX_ANSWER_BYTES, else the connection failed (refused, reset,
    closed early, or the answer was not HTTP)."""

    def __init__(self, message: str, *, undecodable: bool = False,
                 too_large: bool = False) -> None:
        super().__init__(message)
        self.undecodable = undecodable
        self.too_large = too_large


def limit_of(body: bytes) -> int:
    """`answer_limit` of a request body sent as the caller wrote it (a forwarded call)."""
    try:
        request = pydantic_core.from_json(body)
    except ValueError:
        return MAX_ANSWER_BYTES
    if not isinstance(request, dict):
        return MAX_ANSWER_BYTES
    tokens = request.get("max_completion_tokens", request.get("max_tokens"))
    n = request.get("n")
    return answer_limit(tokens if isinstance(tokens, int) else None,
                        n if isinstance(n, int) else 1)


def too_large(limit: int) -> WireError:
    return WireError(f"answer over its bound of {limit} bytes", too_large=True)


# reqwest's timer runs past the caller's deadline by this much: the caller's asyncio timeout
# (in the loop's time) decides a call's outcome, reqwest's (in real time, on its own thread)
# only ends a call whose await was cancelled, so a busy loop never sees an answer that had
# arrived in time turned into a timeout
_BACKSTOP_S = 1.0

# how long a closed client's threads are given to let go of Python's objects (aclose)
_SETTLE_S = 0.05


def _trusted_certificates() -> list[bytes]:
    """The CA certificates (DER) httpx.create_ssl_context trusts: SSL_CERT_FILE's, else
    SSL_CERT_DIR's, else certifi's bundle."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if os.environ.get("SSL_CERT_FILE"):
        context.load_verify_locations(cafile=os.environ["SSL_CERT_FILE"])
    elif os.environ.get("SSL_CERT_DIR"):
        # a directory's certificates load lazily, at a handshake: read here one by one
        for entry in sorted(Path(os.environ["SSL_CERT_DIR"]).iterdir()):
            with contextlib.suppress(ssl.SSLError, OSError):
                context.load_verify_locations(cafile=entry)
    else:
        context.load_verify_locations(cafile=certifi.where())
    return [bytes(cert) for cert in context.get_ca_certs(binary_form=True)]


def _env_proxy(url: str) -> str | None:
    """The proxy the environment names for `url` (HTTP(S)_PROXY, NO_PROXY), as httpx honours
    it; read once, not per call."""
    parts = urlsplit(url)
    if urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    return urllib.request.getproxies().get(parts.scheme)


async def _read(response: Response, limit: int) -> bytes:
    """The body, at most `limit` bytes of it decoded (a declared length over it is refused
    before a byte is read; a decoded body carries no length: reqwest drops it)."""
    length = response.headers.get("content-length")
    if length is not None and length.isdigit():
        if int(length) > limit:
            raise too_large(limit)
        return bytes(await response.bytes())  # the common case: bounded by its length
    body = bytearray()
    reader = response.body_reader
    while (piece := await reader.read_chunk()) is not None:
        body += piece
        if len(body) > limit:
            raise too_large(limit)
    return bytes(body)


class ReqwestWire:
    """One reqwest client (one connection pool, its IO on Rust's threads), opened at the first
    call; the event loop's thread only hands over the body and takes the answer."""

    def __init__(self, url: str, headers: Mapping[str, str], *, limit: int,
                 keepalive_s: float, connect_timeout_s: float) -> None:
        self._url = url
        self._headers = dict(headers)
        self._limit = limit
        self._keepalive_s = keepalive_s
        self._connect_timeout_s = connect_timeout_s
        self._client: Client | None = None

    def _open(self) -> Client:
        # made at the first call, inside the running loop its answers are delivered to; the
        # environment's proxy and CA certificates are read then, once
        builder = (ClientBuilder()
                   .default_headers(self._headers)
                   .max_connections(self._limit)
                   .pool_max_idle_per_host(self._limit)
                   .pool_idle_timeout(timedelta(seconds=self._keepalive_s))
                   # the call's whole deadline is set on each request (post)
                   .connect_timeout(timedelta(seconds=self._connect_timeout_s))
                   # a redirect is the gateway's answer, not an address to send the caller's
                   # body and our key to (a 3xx fails as client_error, as on the streaming path)
                   .follow_redirects(False)
                   .no_proxy())
        proxy = _env_proxy(self._url)
        if proxy:
            builder = builder.proxy(ProxyBuilder.all(proxy))
        for certificate in _trusted_certificates():
            builder = builder.add_root_certificate_der(certificate)
        self._client = builder.build()
        return self._client

    async def post(self, body: bytes, headers: Mapping[str, str] | None, timeout: float,
                   limit: int = MAX_ANSWER_BYTES) -> Answer:
        """One POST, bounded as a whole by the caller's asyncio.timeout and by reqwest's timer
        of `timeout` (and a backstop): cancelling the await does not stop reqwest's task
        (pyreqwest lets it run on), its own timer does, closing the connection and freeing its
        slot."""
        # reqwest's errors are raised again as our own, unchained, from this frame, which
        # holds none of pyreqwest's objects: an error's frames (held by an asyncio task that
        # failed, in a reference cycle) would keep a request or a client for the collection at
        # interpreter exit, and one dropped while Python is finalizing can abort the process
        try:
            return await self._exchange(body, headers, timeout, limit)
        except RequestTimeoutError as exc:  # reqwest's timer (connecting, or the call's)
            message, timed_out, undecodable = _described(exc), True, False
        except RequestError as exc:
            message, timed_out, undecodable = _described(exc), False, _undecodable(exc)
        if timed_out:
            raise TimeoutError(message)
        raise WireError(message, undecodable=undecodable)

    async def _exchange(self, body: bytes, headers: Mapping[str, str] | None, timeout: float,
                        limit: int) -> Answer:
        client = self._client or self._open()
        request = (client.post(self._url).body_bytes(body)
                   .timeout(timedelta(seconds=timeout + _BACKSTOP_S)))
        if headers:
            request = request.headers(headers)
        async with request.build_streamed() as response:
            return Answer(response.status, response.headers, await _read(response, limit))

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()
            # reqwest's threads finish with what they still hold of Python's (a failed call's
            # response, its log records) while Python runs: at interpreter exit, while it is
            # finalizing, a thread handing such an object back aborts the process
            await asyncio.sleep(_SETTLE_S)
            flush_logs()


def _causes(exc: RequestError) -> list[str]:
    return [cause["message"] for cause in exc.details.get("causes") or []]


def _described(exc: RequestError) -> str:
    # the innermost cause names what went wrong; the outer ones only where (the URL)
    causes = _causes(exc)
    return f"{type(exc).__name__}: {causes[-1] if causes else exc.message}"


def _undecodable(exc: RequestError) -> bool:
    # reqwest reports a body that failed to arrive (cut short, bad chunks) and one that
    # failed to decompress as the same error: only the cause tells a broken connection
    return (isinstance(exc, BodyDecodeError)
            and "error reading a body from connection" not in _causes(exc))


class Wire(Protocol):
    async def post(self, body: bytes, headers: Mapping[str, str] | None, timeout: float,
                   limit: int = MAX_ANSWER_BYTES) -> Answer:
        """The answer, at most `limit` bytes; raises WireError (past it: `too_large`), or
        TimeoutError when the transport's own timer fires."""
        ...

    async def aclose(self) -> None: ...


class HttpxWire:
    """Calls through an httpx client (the in-process simulator, tests' mock transports)."""

    def __init__(self, url: str, client: httpx.AsyncClient, connect_timeout_s: float) -> None:
        self._url = url
        self._client = client
        self._connect_timeout_s = connect_timeout_s

    async def post(self, body: bytes, headers: Mapping[str, str] | None, timeout: float,
                   limit: int = MAX_ANSWER_BYTES) -> Answer:
        timeouts = httpx.Timeout(timeout, connect=min(self._connect_timeout_s, timeout))
        try:
            response = await self._client.post(self._url, content=body, headers=headers,
                                               timeout=timeouts)
        except httpx.TimeoutException as exc:
            raise TimeoutError(str(exc)) from exc
        except httpx.DecodingError as exc:
            raise WireError(f"{type(exc).__name__}: {exc}", undecodable=True) from exc
        except httpx.RequestError as exc:
            raise WireError(f"{type(exc).__name__}: {exc}") from exc
        if len(response.content) > limit:  # in process: read already, refused alike
            raise too_large(limit)
        return Answer(response.status_code, response.headers, response.content)

    async def aclose(self) -> None:
        """Nothing: the client is its owner's (GatewayClient streams through it too)."""
