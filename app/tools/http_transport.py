"""The streamable-HTTP transport of an MCP client session, on aiohttp (docs/decisions/
0023-mcp-http-transport-on-aiohttp.md).

The SDK's `ClientSession` keeps the protocol (initialize and version negotiation, ids,
cancellation, result types and their validation); this module carries its messages as the
streamable-HTTP transport of the handshake revisions says: each message one POST (`Accept`
JSON and SSE), the server's `Mcp-Session-Id` from `initialize` and the negotiated
`MCP-Protocol-Version` on every later request, a request's answer in its POST's JSON body or
SSE stream, the server's own messages on a GET stream opened after `initialized` (a 405 means
it has none), a DELETE ending the session. What it drops next to the SDK's transport is
httpx's per-request machinery and a task group per message, where a tool call spent most of
its client CPU. A request whose POST fails gets an error answer of its own (the other calls in
flight go on) and the session's message handler hears of the failure (the owner pings now).
"""

from __future__ import annotations

import asyncio
import logging
import math
import urllib.request
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager, suppress
from functools import partial
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.shared.message import ClientMessageMetadata, SessionMessage
from mcp_types import (
    CONNECTION_CLOSED,
    INTERNAL_ERROR,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    ErrorData,
    JSONRPCError,
    JSONRPCMessage,
    JSONRPCNotification,
    JSONRPCRequest,
    JSONRPCResponse,
    RequestId,
    jsonrpc_message_adapter,
)
from pydantic import ValidationError

log = logging.getLogger(__name__)

SESSION_ID = "mcp-session-id"
PROTOCOL_VERSION = "mcp-protocol-version"
LAST_EVENT_ID = "last-event-id"
MAX_SSE_LINE = 1 << 20  # the SDK's bound on one SSE event
GET_RETRIES = 2
GET_RETRY_S = 1.0
CLOSE_TIMEOUT_S = 5.0
KEEPALIVE_S = 4.0

Inbox = MemoryObjectSendStream[SessionMessage | Exception]


def _error(request_id: RequestId, code: int, message: str) -> SessionMessage:
    return SessionMessage(JSONRPCError(jsonrpc="2.0", id=request_id,
                                       error=ErrorData(code=code, message=message)))


async def sse_data(response: aiohttp.ClientResponse) -> AsyncIterator[tuple[str, str | None]]:
    """(data, id) of each `message` event of an SSE body; comments and empty events skipped."""
    data: list[str] = []
    event, event_id = "message", None
    while line := await response.content.readline(max_line_length=MAX_SSE_LINE):
        text = line.decode().rstrip("\r\n")
        if not text:
            if data and event == "message":
                yield "\n".join(data), event_id
            event, data = "message", []
            continue
        field, _, value = text.partition(":")
        value = value.removeprefix(" ")
        if field == "data":
            data.append(value)
        elif field == "event":
            event = value
        elif field == "id":
            event_id = value


class _Transport:
    def __init__(self, url: str, http: aiohttp.ClientSession, inbox: Inbox,
                 tg: TaskGroup) -> None:
        self.url = url
        self.http = http
        self.inbox = inbox
        self.tg = tg
        self.session_id: str | None = None
        self.version: str | None = None
        # each request's POST is a plain asyncio task (anyio's spawn and cancel scope cost
        # more per call than the POST itself); the transport cancels them when it closes
        self.posts: dict[RequestId, asyncio.Task[None]] = {}

    def headers(self, extra: Mapping[str, str] | None) -> dict[str, str]:
        out = {"accept": "application/json, text/event-stream",
               "content-type": "application/json"}
        if self.session_id:
            out[SESSION_ID] = self.session_id
        if self.version:
            out[PROTOCOL_VERSION] = self.version
        if extra:
            out.update(extra)
        return out

    async def deliver(self, item: SessionMessage | Exception) -> None:
        with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            await self.inbox.send(item)

    async def write_loop(self, outbox: MemoryObjectReceiveStream[SessionMessage]) -> None:
        async with outbox:
            async for item in outbox:
                message = item.message
                meta = item.metadata if isinstance(item.metadata, ClientMessageMetadata) else None
                extra = meta.headers if meta is not None else None
                if isinstance(message, JSONRPCRequest) and message.method == "initialize":
                    self.version = None  # the handshake carries no version header
                elif extra and PROTOCOL_VERSION in extra:
                    self.version = extra[PROTOCOL_VERSION]
                if isinstance(message, JSONRPCRequest):
                    task = asyncio.get_running_loop().create_task(self.request(message, extra))
                    self.posts[message.id] = task
                    task.add_done_callback(partial(self.settled, message.id))
                    continue
                await self.send(message, extra)  # notifications and answers, in order
                if isinstance(message, JSONRPCNotification):
                    if message.method == "notifications/initialized":
                        self.tg.start_soon(self.listen)
                    elif message.method == "notifications/cancelled":
                        # the caller gave up: its POST's answer would find no waiter
                        request_id = (message.params or {}).get("requestId")
                        if request_id is not None and request_id in self.posts:
                            self.posts[request_id].cancel()

    async def send(self, message: JSONRPCMessage, extra: Mapping[str, str] | None) -> None:
        """POST a message that expects no answer (202; a refusal is not answered either)."""
        try:
            async with self.http.post(self.url, data=_body(message), headers=self.headers(extra),
                                      allow_redirects=False) as response:
                await response.read()
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            await self.deliver(exc)

    def settled(self, request_id: RequestId, task: asyncio.Task[None]) -> None:
        if self.posts.get(request_id) is task:  # not a successor reusing the id
            del self.posts[request_id]

    async def request(self, message: JSONRPCRequest, extra: Mapping[str, str] | None) -> None:
        try:
            if not await self.post(message, extra):
                await self.deliver(_error(message.id, CONNECTION_CLOSED,
                                          "the server's stream ended without an answer"))
        except Exception as exc:  # below the protocol: this call fails, the others go on
            await self.deliver(exc)  # first: the owner checks the connection as the call fails
            await self.deliver(_error(message.id, CONNECTION_CLOSED,
                                      f"{type(exc).__name__}: {exc}"[:300]))

    async def post(self, message: JSONRPCRequest, extra: Mapping[str, str] | None) -> bool:
        """POST a request and deliver what comes back; whether its answer came."""
        async with self.http.post(self.url, data=_body(message), headers=self.headers(extra),
                                  allow_redirects=False) as response:
            if response.status >= 300 or response.status == 202:
                await self.deliver(await self.refusal(message, response))
                return True
            if message.method == "initialize":
                self.session_id = response.headers.get(SESSION_ID) or self.session_id
            kind = response.headers.get("content-type", "").lower()
            if kind.startswith("application/json"):
                await self.deliver(self.parsed(await response.read(), message.id))
                return True
            if not kind.startswith("text/event-stream"):
                await self.deliver(_error(message.id, INVALID_REQUEST,
                                          f"Unexpected content type: {kind}"))
                return True
            async for data, _ in sse_data(response):
                if not data:
                    continue
                item = self.parsed(data.encode(), message.id)
                await self.deliver(item)
                if isinstance(item, SessionMessage) and isinstance(
                        item.message, JSONRPCResponse | JSONRPCError):
                    return True
            return False

    def parsed(self, raw: bytes, request_id: RequestId) -> SessionMessage:
        try:
            message = jsonrpc_message_adapter.validate_json(raw, by_name=False)
        except ValidationError as exc:
            return _error(request_id, PARSE_ERROR, f"Failed to parse the answer: {exc}"[:300])
        if isinstance(message, JSONRPCResponse | JSONRPCError):
            message.id = request_id  # the answer to this POST's request, whatever it echoes
        return SessionMessage(message)

    async def refusal(self, message: JSONRPCRequest,
                      response: aiohttp.ClientResponse) -> SessionMessage:
        """The error answer of a POST refused by HTTP status (the SDK transport's codes)."""
        if response.status == 202:
            return _error(message.id, INVALID_REQUEST,
                          "server answered a request with 202 Accepted")
        if 300 <= response.status < 400:
            return _error(message.id, INVALID_REQUEST, "Redirect to "
                          f"{response.headers.get('location')} not followed; use that URL as "
                          "the endpoint if it is the intended server")
        if response.headers.get("content-type", "").lower().startswith("application/json"):
            with suppress(ValidationError):
                sent = jsonrpc_message_adapter.validate_json(await response.read(),
                                                             by_name=False)
                if isinstance(sent, JSONRPCError):
                    return SessionMessage(JSONRPCError(jsonrpc="2.0", id=message.id,
                                                       error=sent.error))
        if response.status == 404:
            if self.session_id is None:
                return _error(message.id, METHOD_NOT_FOUND, "Not Found")
            return _error(message.id, INVALID_REQUEST, "Session terminated")
        return _error(message.id, INTERNAL_ERROR, "Server returned an error response")

    async def listen(self) -> None:
        """The server's own messages (notifications, its requests) on the GET stream."""
        last_id: str | None = None
        failures = 0
        while self.session_id and failures < GET_RETRIES:
            headers = self.headers(None)
            headers["accept"] = "text/event-stream"
            if last_id:
                headers[LAST_EVENT_ID] = last_id
            try:
                async with self.http.get(self.url, headers=headers,
                                         allow_redirects=False) as response:
                    if response.status != 200:
                        return  # 405: the server offers no stream
                    async for data, event_id in sse_data(response):
                        last_id = event_id or last_id
                        if data:
                            with suppress(ValidationError):
                                await self.deliver(SessionMessage(
                                    jsonrpc_message_adapter.validate_json(data, by_name=False)))
                failures = 0
            except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
                log.debug("MCP GET stream of %s failed", self.url, exc_info=True)
                failures += 1
            await anyio.sleep(GET_RETRY_S)

    async def close(self) -> None:
        posts = list(self.posts.values())
        for task in posts:
            task.cancel()
        await asyncio.gather(*posts, return_exceptions=True)
        if not self.session_id:
            return
        with anyio.move_on_after(CLOSE_TIMEOUT_S), suppress(aiohttp.ClientError, OSError):
            async with self.http.delete(self.url, headers=self.headers(None),
                                        allow_redirects=False) as response:
                await response.read()


def _body(message: JSONRPCMessage) -> bytes:
    return message.model_dump_json(by_alias=True, exclude_unset=True).encode()


def _proxy(url: str) -> str | None:
    """The proxy the environment names for `url`, read once (httpx reads it as well)."""
    host = urlsplit(url).hostname or ""
    return None if urllib.request.proxy_bypass(host) else \
        urllib.request.getproxies().get(urlsplit(url).scheme)


@asynccontextmanager
async def streamable_http(url: str, headers: Mapping[str, str], connections: int,
                          ) -> AsyncIterator[tuple[Any, Any]]:
    """(read, write) streams of SessionMessage for a `ClientSession` with the server at `url`;
    up to `connections` connections at once, each kept alive for the next POST."""
    inbox, read = anyio.create_memory_object_stream[SessionMessage | Exception](math.inf)
    write, outbox = anyio.create_memory_object_stream[SessionMessage](0)
    # an idle connection is dropped before the server's own idle timeout (5 s in uvicorn and
    # Node): a POST on a connection the server is closing would fail its call
    connector = aiohttp.TCPConnector(limit=connections, keepalive_timeout=KEEPALIVE_S)
    async with aiohttp.ClientSession(
            connector=connector, headers=dict(headers), proxy=_proxy(url),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=30.0, sock_read=300.0),
    ) as http, inbox, anyio.create_task_group() as tg:
        transport = _Transport(url, http, inbox, tg)
        tg.start_soon(transport.write_loop, outbox)
        try:
            yield read, write
        finally:
            await transport.close()
            tg.cancel_scope.cancel()
