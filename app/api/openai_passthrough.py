"""Requests without `agent_swarm`: sent to the gateway as they are (streamed too) and metered
like a swarm's calls — daily caps reserved before each attempt, ledger rows, metrics."""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from typing import Any

from fastapi import Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.background import BackgroundTask

from app import metrics
from app.api.openai_errors import openai_error, seconds_to_midnight
from app.config import Settings
from app.engine.budget import BudgetExceeded, SharedCap
from app.engine.passthrough import PassthroughMeter, prompt_bound
from app.errors import RequestInvalid
from app.gateway import streaming
from app.gateway.client import GatewayClient, GatewayError, GatewayRejected
from app.gateway.streaming import DONE
from app.openai_schemas import ChatCompletionCreate

MAX_ATTEMPTS = 3


def _dumps(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def over_budget(exc: BudgetExceeded) -> JSONResponse:
    metrics.budget_denials.labels("daily").inc()
    return openai_error(429, f"the daily budget cannot cover this call: it needs up to "
                             f"{exc.needed} USD, {exc.left} USD are left today",
                        "quota_exceeded", headers={"Retry-After": str(seconds_to_midnight())})


def gateway_failed(exc: GatewayError) -> JSONResponse:
    """The gateway's refusal or unavailability, after our retries, as the caller's error."""
    if isinstance(exc, GatewayRejected):
        status = exc.status_code or 400
        if status in (401, 403):  # our credentials, not the caller's request
            return openai_error(502, "the gateway refused this service's credentials",
                                "gateway_rejected")
        return openai_error(status if status in (400, 404, 413, 422) else 400, str(exc),
                            "gateway_rejected")
    if exc.outcome == "rate_limited":
        last = exc.attempts[-1] if exc.attempts else None
        hint = last.retry_after_s if last is not None else None
        wait = max(math.ceil(hint), 1) if hint is not None else 1
        return openai_error(429, str(exc), "rate_limited", headers={"Retry-After": str(wait)})
    return openai_error(503, str(exc), "gateway_unavailable", headers={"Retry-After": "1"})


def _without_usage(data: str) -> str | None:
    """An event of a stream whose caller did not ask for usage (we always ask the gateway for
    it, to bill): the usage-only chunk dropped, usage removed from any other."""
    try:
        chunk = json.loads(data)
    except ValueError:
        return data
    if not isinstance(chunk, dict) or "usage" not in chunk:
        return data
    if not chunk.get("choices"):
        return None
    chunk.pop("usage")
    return _dumps(chunk).decode()


class Passthrough:
    """One forwarded request."""

    def __init__(self, request: Request, req: ChatCompletionCreate, tenant: str,
                 raw: dict[str, Any]) -> None:
        settings: Settings = request.app.state.settings
        if req.model not in settings.prices:
            raise RequestInvalid(
                f"model {req.model!r} has no price; priced models: "
                f"{', '.join(settings.prices.names())}",
                code="unknown_model", details={"field": "model", "model": req.model})
        self.req = req
        self.gateway: GatewayClient = request.app.state.gateway
        self.timeout_s = settings.facade_timeout_s
        self.body = {k: v for k, v in raw.items() if k != "agent_swarm"}
        price = settings.prices[req.model]
        out = req.max_completion_tokens or req.max_tokens or price.context_window
        # the global cap and the tenant's (SPEC §8), as one: both must hold the worst case
        gates = request.app.state.tenant_gates
        cap = request.app.state.daily if gates is None else gates.cap(tenant)
        caps: list[SharedCap] = [cap] if cap is not None else []
        bound = prompt_bound(self.body)
        self.meter = PassthroughMeter(
            request.app.state.sessions, price, caps, tenant, price.worst_case(bound, out),
            prompt_bound=bound, max_tokens=out, lease_s=settings.lease_seconds)

    async def complete(self) -> Response:
        try:
            result = await self.gateway.forward(
                _dumps(self.body), idempotency_key=self.meter.key, max_attempts=MAX_ATTEMPTS,
                timeout_s=self.timeout_s, before_attempt=self.meter.before,
                after_attempt=self.meter.after)
        except BudgetExceeded as exc:
            return over_budget(exc)
        except GatewayError as exc:
            return gateway_failed(exc)
        finally:
            await self.meter.release()
        self.meter.finished(result.finish_reason)
        return JSONResponse(result.body)

    async def stream(self) -> Response:
        options = self.body.get("stream_options")
        self.body["stream_options"] = {**(options if isinstance(options, dict) else {}),
                                       "include_usage": True}
        wants_usage = self.req.stream_options is not None and \
            self.req.stream_options.include_usage
        stack = AsyncExitStack()
        try:
            stream = await stack.enter_async_context(streaming.stream(
                self.gateway, _dumps(self.body), idempotency_key=self.meter.key,
                max_attempts=MAX_ATTEMPTS, timeout_s=self.timeout_s,
                before_attempt=self.meter.before, after_attempt=self.meter.after))
        except BudgetExceeded as exc:
            await self.meter.release()
            return over_budget(exc)
        except GatewayError as exc:
            await self.meter.release()
            return gateway_failed(exc)

        async def close() -> None:  # idempotent: the relay's end or the response's background
            await stack.aclose()
            await self.meter.release()

        async def relay() -> AsyncIterator[bytes]:
            done = False
            try:
                async for data in stream:
                    if data == DONE:  # held back until the call is billed (below)
                        done = True
                        continue
                    event = data if wants_usage else _without_usage(data)
                    if event is not None:
                        yield b"data: " + event.encode() + b"\n\n"
            except GatewayError as exc:
                yield b"data: " + bytes(gateway_failed(exc).body) + b"\n\n"
            finally:
                await close()
            self.meter.finished(stream.finish_reason)
            if done:  # the ledger row is written: a caller that saw [DONE] sees its usage
                yield b"data: " + DONE.encode() + b"\n\n"

        return StreamingResponse(relay(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"},
                                 background=BackgroundTask(close))

