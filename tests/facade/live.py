"""The app under a real uvicorn server in the test's event loop (an ephemeral port), for
clients that must talk HTTP to it, such as the OpenAI SDK (which brings its own HTTP stack)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import uvicorn
from starlette.types import ASGIApp

from app.aio import wait_for


@asynccontextmanager
async def serving(app: ASGIApp) -> AsyncIterator[str]:
    """Run `app` (its lifespan included) until the block ends; yields its base URL."""
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                            lifespan="on", access_log=False)
    server = uvicorn.Server(config)
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign,assignment]
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if task.done():
                task.result()  # raises the startup error
                raise AssertionError("uvicorn stopped during startup")
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await wait_for(task, 30)
