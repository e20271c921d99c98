"""The simulator as an ASGI app: auth, faults drawn per attempt, latency that a disconnecting
client cuts short, the answer (or its stream), and the counters of `/v1/_stats`."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
from collections.abc import AsyncIterator
from email.utils import formatdate
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send
from uvicorn.config import LOGGING_CONFIG

from app.simulator.config import SimulatorConfig, SimulatorStats, bounded_put
from app.simulator.directives import Directives, parse_directives, parse_request, refuse_format
from app.simulator.responses import (
    JSON,
    chat_completion,
    completion_body,
    dumps,
    error,
    stream_events,
    unit,
)

log = logging.getLogger(__name__)
MODELS = ("kimi-k2.5", "deepseek-v3.2", "gpt-4.1", "claude-sonnet-4.5", "gemini-2.5-flash")
_WATCH_DISCONNECT_S = 1.0  # waits this long or longer also watch for a client disconnect
CHAT_PATH = "/v1/chat/completions"
_JSON_TYPE = (b"content-type", JSON.encode())
_HTML_502 = b"<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>"


async def _body(receive: Receive) -> bytes:
    """The request's body, as Starlette's `Request.body` reads it."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def _wait(receive: Receive, seconds: float, arrived: float) -> bool:
    """Sleep until `seconds` after `arrived` (the loop's clock); long waits end early (False)
    when the client disconnects, as a real server would."""
    left = seconds - (asyncio.get_running_loop().time() - arrived)
    if seconds < _WATCH_DISCONNECT_S:
        await asyncio.sleep(max(left, 0.0))
        return True

    async def disconnected() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    try:
        done, _ = await asyncio.wait({watcher}, timeout=max(left, 0.0))
        return not done
    finally:
        watcher.cancel()


class _Simulator:
    """`POST /v1/chat/completions` as a plain ASGI app: a gateway stand-in answers a whole
    fan-out wave on one core, so routing, a Request object and middleware per call would be
    CPU in every benchmark's wall that a real gateway spends on other machines (decision
    0029)."""

    def __init__(self, config: SimulatorConfig) -> None:
        self.config = config
        self.stats = SimulatorStats()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        arrived = asyncio.get_running_loop().time()
        received_at = time.time()
        auth = idem = None
        for name, value in scope["headers"]:
            if name == b"authorization" and auth is None:
                auth = value.decode("latin-1")
            elif name == b"idempotency-key" and idem is None:
                idem = value.decode("latin-1")
        stats = self.stats
        swarm = idem.split(":", 1)[0] if idem else None
        stats.calls += 1
        stats.in_flight += 1
        stats.max_in_flight = max(stats.max_in_flight, stats.in_flight)
        if swarm is not None:
            now = stats.swarm_in_flight[swarm] = stats.swarm_in_flight.get(swarm, 0) + 1
            if now > stats.max_in_flight_by_swarm.get(swarm, 0):
                stats.max_in_flight_by_swarm.pop(swarm, None)  # re-insert: keeps eviction LRU-ish
                bounded_put(stats.max_in_flight_by_swarm, swarm, now)
        try:
            response = await self._answer(receive, auth, idem, swarm, received_at, arrived)
        finally:  # out of flight once answered: a stream's sending is not counted
            stats.in_flight -= 1
            if swarm is not None:
                left = stats.swarm_in_flight.pop(swarm, 1) - 1
                if left > 0:
                    stats.swarm_in_flight[swarm] = left
        if isinstance(response, bytes):  # a complete answer: the common case, sent bare
            await send({"type": "http.response.start", "status": 200, "headers": [
                (b"content-length", b"%d" % len(response)), _JSON_TYPE]})
            await send({"type": "http.response.body", "body": response})
        else:
            await response(scope, receive, send)

    async def _answer(self, receive: Receive, auth: str | None, idem: str | None,
                      swarm: str | None, received_at: float, arrived: float
                      ) -> Response | bytes:
        """The answer: a complete chat.completion's bytes, or any other response."""
        cfg = self.config
        if cfg.api_key is not None and auth != f"Bearer {cfg.api_key}":
            return error(401, "invalid or missing API key")
        raw = await _body(receive)
        try:
            req = parse_request(raw)
            d = parse_directives(req.texts, cfg.flags)
            _allowed(d, cfg)
            refuse_format(req, d)
        except ValueError as exc:
            return error(400, str(exc))
        key = idem or hashlib.blake2b(raw, digest_size=16).hexdigest()
        attempt = self.stats.record(key, req.model, req.messages, received_at)
        fault = "503" if d.is_down(req.model) else self._fault(d, key, attempt)
        # the wait runs from the request's arrival: the simulator's own reading of it is
        # inside the latency asked for, not added to it
        if not await _wait(receive, self._latency(d, fault, key, attempt), arrived):
            return Response(status_code=499)  # nobody is listening any more
        _exit_if_asked(d, key)
        if fault == "html502":
            headers = self._retry_headers("502", d)
            return Response(_HTML_502, status_code=502, headers=headers, media_type="text/html")
        if fault is not None and fault.isdigit():
            return error(int(fault), f"simulated {fault} error", self._retry_headers(fault, d),
                         poison=bool(d.poison))
        completion = chat_completion(req, d, key, attempt, fault == "length",
                                     lambda: self._bad_plan(d, swarm))
        if req.stream:
            events = stream_events(completion, req.include_usage)
            if fault == "truncated":  # the stream breaks off: no finish, no usage, no [DONE]
                events = events[: max(1, len(events) // 3)]
            else:
                self._count_ok(key, swarm, completion)
            if d.stream_ms:
                return StreamingResponse(self._paced(events, d.stream_ms / 1000, key),
                                         media_type="text/event-stream")
            return StreamingResponse(iter(events), media_type="text/event-stream")
        body = completion_body(completion)
        if fault == "truncated":
            return Response(body[: len(body) // 2], media_type=JSON)
        self._count_ok(key, swarm, completion)
        return body

    def _latency(self, d: Directives, fault: str | None, key: str, attempt: int) -> float:
        """Seconds from the request's arrival to its answer."""
        cfg = self.config
        if fault == "timeout":
            return d.hang_s if d.hang_s is not None else cfg.timeout_s
        if d.latency_ms is not None:
            return d.latency_ms / 1000
        jitter = 0.0
        if cfg.latency_jitter_ms:  # the draw costs a hash: none when there is nothing to draw
            jitter = cfg.latency_jitter_ms * (2 * unit(cfg.seed, key, attempt, "jitter") - 1)
        return max(0.0, cfg.latency_ms + jitter) / 1000

    async def _paced(self, events: list[bytes], over_s: float, key: str
                     ) -> AsyncIterator[bytes]:
        """The events spread over `over_s` as a model generates them; the Unix time the
        first piece of text went out is kept as the call's `first_piece_at`."""
        gap = over_s / max(len(events) - 1, 1)
        for i, event in enumerate(events):
            if i:
                await asyncio.sleep(gap)
            if i == 1 and key in self.stats.by_key:
                self.stats.by_key[key]["first_piece_at"] = time.time()
            yield event

    def _count_ok(self, key: str, swarm: str | None, completion: dict[str, Any]) -> None:
        self.stats.ok += 1
        u = completion["usage"]
        cached = u["prompt_tokens_details"]["cached_tokens"]
        self.stats.bill(swarm, completion["model"],
                        (u["prompt_tokens"], u["completion_tokens"], cached))
        if key in self.stats.by_key:  # it may have been evicted while this call waited
            self.stats.by_key[key]["ok"] += 1

    def _fault(self, d: Directives, key: str, attempt: int) -> str | None:
        if d.fail is not None and (d.times is None or attempt <= d.times):
            return d.fail
        rates = self.config.fault_rates()  # read per request: tests may change the config live
        if not any(rate for _, rate in rates):
            return None
        draw = unit(self.config.seed, key, attempt, "fault")
        for kind, rate in rates:
            if draw < rate:
                return kind
            draw -= rate
        return None

    def _retry_headers(self, status: str, d: Directives) -> dict[str, str]:
        headers: dict[str, str] = {}
        if status == "429":
            headers["Retry-After"] = f"{self.config.retry_after_s:g}"
        if d.retry_after is not None:
            headers["Retry-After"] = d.retry_after
        if d.retry_after_date:
            headers["Retry-After"] = formatdate(time.time() + 2, usegmt=True)
        if d.retry_after_ms is not None:
            headers["retry-after-ms"] = d.retry_after_ms
        return headers

    def _bad_plan(self, d: Directives, swarm: str | None) -> str | None:
        """The flaw for this planning call: `plan_times` counts per swarm (or per simulator)."""
        if d.plan is None:
            return None
        scope = f"{swarm or ''}|{d.plan}"
        n = self.stats.plan_calls.get(scope, 0) + 1
        bounded_put(self.stats.plan_calls, scope, n)
        return d.plan if d.plan_times is None or n <= d.plan_times else None

    async def stats_endpoint(self, request: Request) -> Response:
        if request.method == "POST":  # /v1/_reset
            self.stats.reset()
        return Response(dumps(self.stats.as_json()), media_type=JSON)

    async def models_endpoint(self, request: Request) -> Response:
        data = [{"id": m, "object": "model", "owned_by": "swarm-sim"} for m in MODELS]
        return Response(dumps({"object": "list", "data": data}), media_type=JSON)


def _allowed(d: Directives, cfg: SimulatorConfig) -> None:
    if d.exit is not None and not cfg.exit_allowed:
        raise ValueError("simulator directive exit is not allowed here")


def _exit_if_asked(d: Directives, key: str) -> None:
    """Mid-call, after its latency: the process (its caller's, when in-process) ends as a
    crash would, the answer never sent (a poison swarm, SWARM_SIMULATOR_EXIT_ALLOWED)."""
    if d.exit is not None:
        log.warning("simulator: exiting with code %d as %s asks", d.exit, key)
        logging.shutdown()
        os._exit(d.exit)


class SimulatorApp(Starlette):
    """The routes as Starlette serves them, with the chat route's plain path taken first."""

    def __init__(self, sim: _Simulator) -> None:
        super().__init__(routes=[
            Route(CHAT_PATH, sim, methods=["POST"]),  # a root_path or a stray method: as before
            Route("/v1/models", sim.models_endpoint, methods=["GET"]),
            Route("/v1/_stats", sim.stats_endpoint, methods=["GET"]),
            Route("/v1/_reset", sim.stats_endpoint, methods=["POST"]),
        ])
        self.chat = sim
        self.state.stats = sim.stats
        self.state.config = sim.config

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] == "http" and scope["path"] == CHAT_PATH
                and scope["method"] == "POST" and not scope.get("root_path")):
            await self.chat(scope, receive, send)
        else:
            await super().__call__(scope, receive, send)


def create_simulator(config: SimulatorConfig | None = None) -> Starlette:
    """The simulator as an ASGI app; `app.state.stats` is its SimulatorStats."""
    return SimulatorApp(_Simulator(config or SimulatorConfig()))


def run_simulator(host: str, port: int, config: SimulatorConfig | None = None,
                  log_config: dict[str, Any] | None = None) -> None:
    """Serve the simulator with uvicorn (its own process, for benchmarks and demos)."""
    # idle connections kept 75 s, as gateways behind a load balancer keep them (uvicorn's 5 s
    # raced clients that reuse a pooled connection the server is closing: httpx.ReadError)
    uvicorn.run(create_simulator(config or SimulatorConfig.from_env()), host=host, port=port,
                access_log=False, log_level="warning", timeout_keep_alive=75,
                # no proxy sits in front of a stand-in gateway: no X-Forwarded-* pass per call
                proxy_headers=False,
                log_config=LOGGING_CONFIG if log_config is None else log_config)
