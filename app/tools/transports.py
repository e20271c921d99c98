"""One MCP client session over a server's transport (stdio, or streamable HTTP on aiohttp:
app/tools/http_transport.py), opened on an exit stack that the caller's task leaves (anyio wants
the SDK's context managers entered and left in one task)."""

from __future__ import annotations

from contextlib import AsyncExitStack

import mcp_types as types
from mcp import ClientSession, StdioServerParameters
from mcp.client.session import MessageHandlerFnT
from mcp.client.stdio import stdio_client

from app.aio import wait_for
from app.tools.config import ServerConfig
from app.tools.http_transport import streamable_http

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
        # one connection per call in flight (+ the server's event stream, the notices)
        read, write = await stack.enter_async_context(
            streamable_http(cfg.url, cfg.headers, cfg.max_concurrency + 2))
    session = await stack.enter_async_context(
        ClientSession(read, write, message_handler=on_message))
    await wait_for(session.initialize(), max(cfg.timeout_s, START_TIMEOUT_S))
    return session


async def call_tool(session: ClientSession,
                    request: types.CallToolRequest) -> types.CallToolResult:
    """`tools/call` (the request `check_sendable` built) as `ClientSession.call_tool` sends it,
    without its per-call check of the result's structured content against the tool's output
    schema (listing the tools first on a session that has not): the model reads a result's
    text, the structured content only as text when there is none, so the check costs every
    call and protects nothing here."""
    return await session.send_request(request, types.CallToolResult)


def describe(exc: BaseException) -> str:
    """One line for a failure, unwrapping the exception groups of anyio task groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:300]
