"""Pure ASGI middleware: request body limit, HEAD served as GET, HTTP metrics by route
template, and the last resort for unhandled exceptions."""

from __future__ import annotations

import functools
import ipaddress
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app import metrics
from app.errors import error_body, is_openai_path, openai_error_body

access_log = logging.getLogger("swarm_api.access")


async def _send_error(send: Send, status: int, code: str, message: str,
                      details: object = None, *, path: str = "",
                      headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    # the OpenAI-compatible routes answer in OpenAI's error shape (docs/OPENAI.md)
    answer = (openai_error_body(status, message, code) if is_openai_path(path)
              else error_body(code, message, details))
    body = json.dumps(answer).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()), *headers]})
    await send({"type": "http.response.body", "body": body})


async def _send_413(send: Send, limit: int, path: str) -> None:
    await _send_error(send, 413, "payload_too_large", f"request body over {limit} bytes",
                      {"limit": limit}, path=path)


@functools.lru_cache(maxsize=1024)  # asked per request: parsing the address was ~2 % of a POST
def is_loopback(host: str) -> bool:
    """localhost, 127.0.0.0/8, ::1 (and ::ffff:127.0.0.1)."""
    if host == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def host_name(header: str) -> str | None:
    """The name or address a Host header names: lowercased, its port, an IPv6 literal's
    brackets and a trailing dot dropped; None when it is malformed (a port not digits)."""
    value = header.strip().lower()
    if value.startswith("["):  # [v6] or [v6]:port
        name, sep, port = value[1:].partition("]")
        if not sep or (port and not (port[0] == ":" and port[1:].isdigit())):
            return None
        return name
    if value.count(":") == 1:  # name:port (an address with more colons is a bare IPv6)
        value, _, port = value.partition(":")
        if not port.isdigit():
            return None
    return value.rstrip(".")


def _host_header(scope: Scope) -> str | None:
    for name, value in scope["headers"]:
        if name == b"host":
            return bytes(value).decode("latin-1")
    return None


class LoopbackOnly:
    """The open-bind guard of the app itself, whatever server runs it: an API without
    SWARM_API_KEYS (and without SWARM_ALLOW_OPEN) answers only loopback clients, and only
    requests addressed to a loopback name or address, the address they reached (the bound
    host) or a name of `hosts` (SWARM_ALLOWED_HOSTS): a web page whose name an attacker
    rebinds to 127.0.0.1 sends its own name as Host (SPEC §17). 403 otherwise; the probes and
    metrics stay reachable."""

    OPEN_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})

    def __init__(self, app: ASGIApp, hosts: frozenset[str] = frozenset()) -> None:
        self.app = app
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        if client and not is_loopback(str(client[0])):
            await _send_error(send, 403, "forbidden",
                              "this API has no SWARM_API_KEYS: it serves loopback clients "
                              "only (set SWARM_API_KEYS, or SWARM_ALLOW_OPEN=1)",
                              path=scope["path"])
            return
        header = _host_header(scope)
        if header is not None and not self._addressed_here(header, scope):
            await _send_error(send, 403, "forbidden",
                              "this API has no SWARM_API_KEYS: it answers requests addressed "
                              "to loopback only, not to this Host (list the name in "
                              "SWARM_ALLOWED_HOSTS, or set SWARM_API_KEYS)",
                              {"host": header[:255]}, path=scope["path"])
            return
        await self.app(scope, receive, send)

    def _addressed_here(self, header: str, scope: Scope) -> bool:
        name = host_name(header)
        if name is None:
            return False
        if is_loopback(name) or name in self.hosts:
            return True
        server = scope.get("server")
        return server is not None and name == str(server[0]).lower().strip("[]")


def _declared(scope: Scope) -> tuple[int, bytes, bytes | None]:
    """The request's Content-Length (0 when absent or unreadable), Content-Encoding and
    Content-Type (None when absent)."""
    length, encoding, media = 0, b"", None
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                length = int(value)
            except ValueError:
                length = 0
        elif name == b"content-encoding":
            encoding = value.strip().lower()
        elif name == b"content-type":
            media = value
    return length, encoding, media


def is_json_type(content_type: str) -> bool:
    """application/json or application/*+json, parameters aside (what FastAPI reads as JSON)."""
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json"))


async def _send_415(send: Send, encoding: bytes, path: str) -> None:
    # RFC 7694: the codings the server takes, in Accept-Encoding. A compressed body would
    # otherwise read as "not valid JSON", and decompressing one defeats the body limit.
    coding = encoding.decode("latin-1")
    await _send_error(send, 415, "unsupported_media_type",
                      f"request bodies are not accepted with Content-Encoding {coding!r}: "
                      f"send the body uncompressed", {"content_encoding": coding},
                      path=path, headers=((b"accept-encoding", b"identity"),))


async def _send_415_type(send: Send, media: bytes | None, path: str) -> None:
    # a body of another type (a form, text, none named: curl -d sends a form) was validated
    # as bytes and refused as "not a valid dictionary": say what is wrong instead
    named = None if media is None else media.decode("latin-1")
    await _send_error(send, 415, "unsupported_media_type",
                      f"request bodies must be JSON: send Content-Type: application/json "
                      f"(got {'none' if named is None else repr(named)})",
                      {"content_type": named}, path=path,
                      headers=((b"accept-post", b"application/json"),))


class BodyLimit:
    """Answer 413 for bodies over `limit` bytes, by Content-Length or while streaming, and
    415 for a body in a content coding (the API reads identity bodies only) or of a type
    that is not JSON. Only for the methods whose routes read a body: a GET's or HEAD's is
    never read (nor refused), so those routes answer neither status (the OpenAPI document
    says so). An empty body is not refused for its type (a cancel sends none)."""

    METHODS = frozenset({"POST", "PUT", "PATCH"})

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in self.METHODS:
            await self.app(scope, receive, send)
            return
        length, encoding, media = _declared(scope)
        if length > self.limit:
            await _send_413(send, self.limit, scope["path"])
            return
        # Read the whole body first (it is at most `limit` bytes): a limit hit while the app
        # reads would surface as the framework's 400 "error parsing the body", not a 413.
        chunks: list[bytes] = []
        seen = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away before sending its body
            chunk = message.get("body", b"")
            seen += len(chunk)
            if seen > self.limit:
                await _send_413(send, self.limit, scope["path"])
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        if seen and encoding not in (b"", b"identity"):
            await _send_415(send, encoding, scope["path"])
            return
        if seen and (media is None or not is_json_type(media.decode("latin-1"))):
            await _send_415_type(send, media, scope["path"])
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()  # after the body: http.disconnect
            replayed = True
            return {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        await self.app(scope, replay, send)


# the one GET route whose answer does not end by itself: HEAD there is refused (405)
_STREAM = re.compile(r"^/swarms/[^/]+/events/?$")


def head_served(path: str) -> bool:
    """Whether HEAD is answered as GET on this path (where GET is)."""
    return _STREAM.match(path) is None


class HeadAsGet:
    """HEAD on every GET route (RFC 9110 §9.3.2: what GET would answer, headers only; uptime
    monitors and `curl -I` send it), but the event stream, which would never end: FastAPI's
    routes serve GET alone. The app sees GET; the body is dropped here (uvicorn drops it
    too); the metrics, outside, still count a HEAD, under the route that answered."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD" or not head_served(
                scope["path"]):
            await self.app(scope, receive, send)
            return
        inner = {**scope, "method": "GET"}

        async def headers_only(message: Message) -> None:
            if message["type"] == "http.response.body":
                if message.get("more_body", False):
                    return
                message = {"type": "http.response.body", "body": b""}
            await send(message)

        try:
            await self.app(inner, receive, headers_only)
        finally:
            if "route" in inner:  # what the router matched, for HttpMetrics' label
                scope["route"] = inner["route"]


class HttpMetrics:
    """`swarm_http_request_duration_seconds{method, route, status}`, route as its template."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            metrics.child(metrics.http_duration, scope["method"], template, str(status)).observe(
                time.perf_counter() - start)


class AccessLog:
    """SWARM_ACCESS_LOG: a line per request once it is answered (a stream once it ends):
    method, path (no query string), status, duration, client; the tenant once its key was
    read. Only installed when asked for: it costs a log record per request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            ms = round((time.perf_counter() - start) * 1000, 1)
            client = scope.get("client")
            access_log.info("%s %s %d %.1f ms", scope["method"], scope["path"], status, ms,
                            extra={"method": scope["method"], "path": scope["path"],
                                   "http_status": status, "duration_ms": ms,
                                   "client": client[0] if client else None})


class CatchAll:
    """Answers an exception no handler took with `render(exc)` (which logs it) — once.
    Starlette's own last resort answers and then re-raises to the server, which logs the same
    traceback a second time. A response already started (an event stream) just ends."""

    def __init__(self, app: ASGIApp, render: Callable[[Exception], Awaitable[Response]]) -> None:
        self.app = app
        self.render = render

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking)
        except Exception as exc:
            response = await self.render(exc)
            if not started:
                await response(scope, receive, send)
