"""One MCP client session over a server's transport (stdio or streamable HTTP), opened on an
exit stack that the caller's task leaves (anyio wants the SDK's context managers entered and
left in one task)."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack

import httpx2
from mcp import ClientSession, StdioServerParameters
from mcp.client.session import MessageHandlerFnT
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from app.tools.config import ServerConfig

# a stdio server may spend many seconds importing before it answers (the Python SDK alone
# takes seconds of CPU): starting is not bounded by the tool-call timeout
START_TIMEOUT_S = 120.0


async def open_session(stack: AsyncExitStack, cfg: ServerConfig,
                       on_message: MessageHandlerFnT) -> ClientSession:
    """An initialized session with the server of `cfg`, closed when `stack` is."""
    if cfg.command is not None:
        params = StdioServerParameters(command=cfg.command, args=cfg.args,
                                       env=cfg.env or None, cwd=cfg.cwd)
        read, write = await stack.enter_async_context(stdio_client(params))
    else:
        assert cfg.url is not None
        # one connection per call in flight (+ the server's event stream): the SDK's
        # default pool of 100 breaks the whole session when more calls wait on it
        slots = cfg.max_concurrency + 2
        http = await stack.enter_async_context(httpx2.AsyncClient(
            headers=cfg.headers or None, timeout=httpx2.Timeout(30.0, read=300.0),
            limits=httpx2.Limits(max_connections=slots, max_keepalive_connections=slots)))
        read, write = await stack.enter_async_context(
            streamable_http_client(cfg.url, http_client=http))
    session = await stack.enter_async_context(
        ClientSession(read, write, message_handler=on_message))
    await asyncio.wait_for(session.initialize(), max(cfg.timeout_s, START_TIMEOUT_S))
    return session


def describe(exc: BaseException) -> str:
    """One line for a failure, unwrapping the exception groups of anyio task groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:300]
