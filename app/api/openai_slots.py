"""What a facade request holds while it runs (SPEC §10).

- A passthrough call: one of its tenant's `max_inflight_calls` and one of the process's
  `SWARM_MAX_INFLIGHT` slots — the very semaphores engine calls take, in the engine's order —
  while the gateway answers (a stream: until it ends or its caller leaves). Like an engine call
  it waits for them, here at most SWARM_FACADE_TIMEOUT_S: then 429 `quota_exceeded` (the
  tenant's) or 503 `overloaded` (the process's).
- A streaming facade swarm, a waiting non-streaming one and a passthrough stream: one of the
  tenant's `max_streams`, as `/events` and `?wait=` do (refused at once: 429).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from fastapi import Request

from app import metrics
from app.aio import cancel_and_wait
from app.api.admission import Slot, stream_slots
from app.config import Settings
from app.engine.tenancy import TenantGates
from app.errors import ApiError, TooManyRequests

T = TypeVar("T")
BUSY_RETRY_S = 1
CLIENT_GONE = 499  # the answer to a caller that left while its request waited (never read)


class ClientGone(Exception):
    """The caller disconnected while its request waited: nobody reads the answer."""


class Overloaded(ApiError):
    """Every `SWARM_MAX_INFLIGHT` slot of this process stayed taken while the call waited."""

    status_code = 503
    code = "overloaded"

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(BUSY_RETRY_S)}


async def _disconnected(request: Request) -> None:
    """Returns when the client has gone (the body is read: what comes next is the end)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_gone(request: Request, work: Awaitable[T]) -> T:
    """`work`'s result, or ClientGone (`work` cancelled) when the client disconnects first."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        await cancel_and_wait(watcher)
        if not task.done():
            await cancel_and_wait(task)
    if task.cancelled():
        raise ClientGone
    return task.result()


class CallSlots:
    """A passthrough call's tenant slot and process slot; `release` is idempotent (the
    stream's end and the response's end may both call it)."""

    def __init__(self, request: Request, tenant: str) -> None:
        settings: Settings = request.app.state.settings
        gates: TenantGates | None = request.app.state.tenant_gates
        self.tenant = tenant
        self.limit = settings.tenant_limits(tenant).max_inflight_calls
        # the tenant's before the process's: a tenant at its limit holds none of the pool's
        self._tenant = None if gates is None else gates.slot(tenant)
        self._process: asyncio.Semaphore = request.app.state.inflight
        self.wait_s = settings.facade_timeout_s
        self._held: list[asyncio.Semaphore] = []

    async def take(self, request: Request) -> None:
        """Wait for both slots (at most `wait_s` in all); ClientGone when the caller leaves
        meanwhile, holding nothing."""
        try:
            await unless_gone(request, self._take_all())
        except BaseException:
            self.release()
            raise

    async def _take_all(self) -> None:
        deadline = asyncio.get_running_loop().time() + self.wait_s
        if self._tenant is not None and not await self._acquire(self._tenant, deadline):
            metrics.quota_denials.labels("max_inflight_calls").inc()
            raise TooManyRequests(
                f"{self.limit} calls of this tenant stayed in flight for {self.wait_s:g} s; "
                f"the limit is {self.limit}", limit="max_inflight_calls",
                retry_after_s=BUSY_RETRY_S, max=self.limit)
        if not await self._acquire(self._process, deadline):
            raise Overloaded(f"every gateway slot of this process (SWARM_MAX_INFLIGHT) stayed "
                             f"taken for {self.wait_s:g} s")

    async def _acquire(self, sem: asyncio.Semaphore, deadline: float) -> bool:
        try:
            async with asyncio.timeout_at(deadline):
                await sem.acquire()
        except TimeoutError:
            return False
        self._held.append(sem)  # no await since the acquire: a cancellation cannot leak it
        return True

    def release(self) -> None:
        while self._held:
            self._held.pop().release()


def stream_slot(request: Request, tenant: str) -> Slot:
    """One of the tenant's `max_streams` (429 when none is free), until `release()`."""
    settings: Settings = request.app.state.settings
    return stream_slots(request).take(tenant, settings.tenant_limits(tenant).max_streams)
