"""How a buffered gateway call travels: aiohttp on the network, or an httpx transport handed in.

aiohttp is the network path because of what one call costs: its C parser and plain asyncio
streams spend a fraction of the CPU httpx over httpcore does, sharded pools or not, and that
CPU bounds the engine (docs/decisions/0006-gateway-client-on-aiohttp.md).
The httpx path serves the in-process simulator (ASGITransport) and tests' MockTransports.
"""

from __future__ import annotations

import asyncio
import ssl
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

import aiohttp
import httpx
import pydantic_core

from app.gateway import request_writer


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


async def _read(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """The body, at most `limit` bytes of it decoded (a declared length over it is refused
    before a byte is read)."""
    length = response.content_length
    if length is not None and length > limit:
        raise too_large(limit)
    if length is not None and "Content-Encoding" not in response.headers:
        return await response.read()  # the common case: bounded by its length
    body = bytearray()
    async for piece in response.content.iter_chunked(256 * 1024):
        body += piece
        if len(body) > limit:
            raise too_large(limit)
    return bytes(body)


def _env_proxy(url: str) -> str | None:
    """The proxy the environment names for `url` (HTTP(S)_PROXY, NO_PROXY), as httpx honours
    it; read once, not per call."""
    parts = urlsplit(url)
    if urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    return urllib.request.getproxies().get(parts.scheme)


class AiohttpWire:
    """One aiohttp session (one connection pool), opened at the first call."""

    def __init__(self, url: str, headers: Mapping[str, str], *, limit: int,
                 keepalive_s: float, connect_timeout_s: float,
                 ssl_context: Callable[[], ssl.SSLContext]) -> None:
        self._url = url
        self._headers = dict(headers)
        self._limit = limit
        self._keepalive_s = keepalive_s
        self._connect_timeout_s = connect_timeout_s
        self._ssl = ssl_context
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        # a session binds to the running loop, so it is made inside one, at the first call; its
        # requests' bytes leave in their step
        request_writer.install(asyncio.get_running_loop())
        connector = aiohttp.TCPConnector(limit=self._limit, keepalive_timeout=self._keepalive_s,
                                         ssl=self._ssl())
        self._session = aiohttp.ClientSession(
            connector=connector, headers=self._headers, proxy=_env_proxy(self._url),
            # the attempt's whole deadline is the caller's asyncio.timeout; this bounds connecting
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self._connect_timeout_s))
        return self._session

    async def post(self, body: bytes, headers: Mapping[str, str] | None, timeout: float,
                   limit: int = MAX_ANSWER_BYTES) -> Answer:
        """One POST; the caller's asyncio.timeout bounds it as a whole (`timeout` is unused)."""
        session = self._session or self._open()
        try:
            # a redirect is the gateway's answer, not an address to send the caller's body and
            # our key to (a 3xx fails as client_error, as on the streaming path)
            async with session.post(self._url, data=body, headers=headers,
                                    allow_redirects=False) as response:
                return Answer(response.status, response.headers, await _read(response, limit))
        except TimeoutError:
            raise  # aiohttp's own timer (connecting) ran out: a timeout, not a broken connection
        except aiohttp.ClientError as exc:
            undecodable = "content-encoding" in str(exc).lower()
            raise WireError(f"{type(exc).__name__}: {exc}", undecodable=undecodable) from exc

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()


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
