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
from app.api.openai_slots import CLIENT_GONE, CallSlots, ClientGone, stream_slot, unless_gone
from app.config import Settings
from app.engine.budget import BudgetExceeded, SharedCap
from app.engine.passthrough import MAX_STREAM_S, PassthroughMeter, prompt_bound
from app.errors import RequestInvalid
from app.gateway import streaming
from app.gateway.client import GatewayClient
from app.gateway.errors import GatewayError, GatewayRejected
from app.gateway.eventstream import DONE
from app.openai_schemas import ChatCompletionCreate
from app.states import AttemptOutcome

MAX_ATTEMPTS = 3
MAX_CHOICES = 128  # OpenAI's bound on `n`


def _dumps(value: Any, *, finite: bool = False) -> bytes:
    """`value` as JSON bytes, whatever it holds: a lone surrogate (which UTF-8 cannot
    encode) travels as its JSON escape (`\\ud800`), as the client or the gateway sent it.
    `finite`: a NaN or Infinity (which JSON has not, and Python's parser takes) becomes null —
    for what the caller receives, whose parser may refuse them."""
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"),
                          allow_nan=not finite).encode()
    except ValueError:  # UnicodeEncodeError included
        return json.dumps(_finite(value) if finite else value, separators=(",", ":")).encode()


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def over_budget(exc: BudgetExceeded) -> JSONResponse:
    metrics.budget_denials.labels("daily").inc()
    shown = exc.disclosed_left
    left = "" if shown is None else f", {shown} USD are left today"
    return openai_error(429, f"the daily budget cannot cover this call: it needs up to "
                             f"{exc.needed} USD{left}",
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
    if exc.outcome == AttemptOutcome.rate_limited:
        last = exc.attempts[-1] if exc.attempts else None
        hint = last.retry_after_s if last is not None else None
        wait = max(math.ceil(hint), 1) if hint is not None else 1
        return openai_error(429, str(exc), "rate_limited", headers={"Retry-After": str(wait)})
    return openai_error(503, str(exc), "gateway_unavailable", headers={"Retry-After": "1"})


def _without_usage(data: str) -> str | None:
    """An event of a stream whose caller did not ask for usage (we always ask the gateway for
    it, to bill): the usage-only chunk dropped, usage removed from any other. An event that
    does not parse, or nests too deep to encode again, goes as it came."""
    try:
        chunk = json.loads(data)
        if not isinstance(chunk, dict) or "usage" not in chunk:
            return data
        if not chunk.get("choices"):
            return None
        chunk.pop("usage")
        return _dumps(chunk, finite=True).decode()
    except (ValueError, RecursionError):
        return data


class Passthrough:
    """One forwarded request."""

    def __init__(self, request: Request, req: ChatCompletionCreate, tenant: str,
                 raw: dict[str, Any]) -> None:
        settings: Settings = request.app.state.settings
        if not isinstance(req.model, str):
            raise RequestInvalid("a model list runs swarms only (agent_swarm): a request sent "
                                 "to the gateway names one model", details={"field": "model"})
        if req.model not in settings.prices:
            raise RequestInvalid(
                f"model {req.model!r} has no price; priced models: "
                f"{', '.join(settings.prices.names())}",
                code="unknown_model", details={"field": "model", "model": req.model})
        self.req = req
        self.request = request
        self.tenant = tenant
        self.slots = CallSlots(request, tenant)  # max_inflight_calls, SWARM_MAX_INFLIGHT
        self.gateway: GatewayClient = request.app.state.gateway
        self.timeout_s = settings.facade_timeout_s
        self.body = {k: v for k, v in raw.items() if k != "agent_swarm"}
        price = settings.prices[req.model]
        choices = raw.get("n")
        if choices is None:
            choices = 1
        elif type(choices) is not int or not 1 <= choices <= MAX_CHOICES:
            raise RequestInvalid(f"n: must be an integer from 1 to {MAX_CHOICES}",
                                 details={"field": "n"})
        # the most it can be billed: every choice at the larger of the two output limits (a
        # gateway may honour either), each unset: the context window
        out = max(req.max_completion_tokens or 0, req.max_tokens or 0) or price.context_window
        out *= choices
        # the global cap and the tenant's (SPEC §8), as one: both must hold the worst case
        gates = request.app.state.tenant_gates
        cap = request.app.state.daily if gates is None else gates.cap(tenant)
        caps: list[SharedCap] = [cap] if cap is not None else []
        bound = prompt_bound(self.body, price.context_window)
        self.meter = PassthroughMeter(
            request.app.state.sessions, price, caps, tenant, price.worst_case(bound, out),
            prompt_bound=bound, max_tokens=out, lease_s=settings.lease_seconds)

    async def complete(self) -> Response:
        try:
            await self.slots.take(self.request)
        except ClientGone:
            return Response(status_code=CLIENT_GONE)
        try:  # the slots are held while the gateway answers, its caller there or not
            result = await self.gateway.forward(
                _dumps(self.body), idempotency_key=self.meter.key, max_attempts=MAX_ATTEMPTS,
                timeout_s=self.timeout_s, before_attempt=self.meter.before,
                after_attempt=self.meter.after)
        except BudgetExceeded as exc:
            return over_budget(exc)
        except GatewayError as exc:
            return gateway_failed(exc)
        finally:
            self.slots.release()
            await self.meter.release()
        self.meter.finished(result.finish_reason)
        try:
            answer = _dumps(result.body, finite=True)
        except RecursionError:  # parsed at the parser's depth limit, deeper than we encode
            return openai_error(502, "the gateway's answer nests too deep to relay (it was "
                                     "billed)", "invalid_response")
        return Response(answer, media_type="application/json")

    async def stream(self) -> Response:
        options = self.body.get("stream_options")
        self.body["stream_options"] = {**(options if isinstance(options, dict) else {}),
                                       "include_usage": True}
        wants_usage = self.req.stream_options is not None and \
            self.req.stream_options.include_usage
        # one of the tenant's max_streams (429 at once), then the call's slots (waited for)
        held = stream_slot(self.request, self.tenant)
        stack = AsyncExitStack()

        async def close() -> None:  # idempotent: the relay's end or the response's background
            try:
                await stack.aclose()
                await self.meter.release()
            finally:
                self.slots.release()
                held.release()

        try:
            await self.slots.take(self.request)
            # a caller that leaves before the first event ends the call (billed as a stream
            # left early), as one leaving later does: its slots are not held for nobody
            stream = await unless_gone(self.request, stack.enter_async_context(
                streaming.stream(self.gateway, _dumps(self.body), idempotency_key=self.meter.key,
                                 max_attempts=MAX_ATTEMPTS, timeout_s=self.timeout_s,
                                 before_attempt=self.meter.before,
                                 after_attempt=self.meter.after, max_s=MAX_STREAM_S)))
        except ClientGone:
            await close()
            return Response(status_code=CLIENT_GONE)
        except BudgetExceeded as exc:
            await close()
            return over_budget(exc)
        except GatewayError as exc:
            await close()
            return gateway_failed(exc)
        except BaseException:
            await close()
            raise

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

