"""OpenTelemetry traces in the GenAI semantic conventions (SPEC §12): one trace per swarm.

Configured only by the standard OTEL_* variables. Unconfigured, every helper here is a
constant-time no-op (no span objects, no context switches), so tracing costs nothing when off.
The trace of a swarm hangs off the W3C `traceparent` stored with the swarm at creation (the
caller's, continued), so the process that takes a swarm over after a crash continues it.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

log = logging.getLogger(__name__)

CAPTURE_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
PROVIDER_NAME = "openai"  # the gateway speaks the OpenAI protocol, whichever model is behind it
_PROPAGATOR = TraceContextTextMapPropagator()


class _State:
    tracer: trace.Tracer | None = None
    provider: TracerProvider | None = None
    capture: bool = False


def enabled() -> bool:
    return _State.tracer is not None


def wanted(env: Mapping[str, str] = os.environ) -> bool:
    """Whether the standard variables ask for traces (an OTLP endpoint or a traces exporter)."""
    if env.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter != "none"
    return bool(env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
                or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def _exporters(env: Mapping[str, str]) -> list[SpanExporter]:
    names = [n.strip().lower() for n in env.get("OTEL_TRACES_EXPORTER", "otlp").split(",")]
    out: list[SpanExporter] = []
    for name in names:
        if name == "console":
            out.append(ConsoleSpanExporter())
        elif name == "otlp":
            protocol = (env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                        or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf").lower()
            if protocol == "grpc":
                from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                    OTLPSpanExporter as GrpcExporter,
                )
                out.append(GrpcExporter())
            else:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                    OTLPSpanExporter as HttpExporter,
                )
                out.append(HttpExporter())
        elif name != "none":
            raise ValueError(f"OTEL_TRACES_EXPORTER: unknown exporter {name!r} "
                             "(otlp, console or none)")
    return out


def configure(processors: Sequence[SpanProcessor] | None = None,
              env: Mapping[str, str] = os.environ) -> bool:
    """Start tracing when the environment asks for it (or with the given processors, for
    tests); returns whether this call started it (a second call changes nothing)."""
    if _State.tracer is not None:
        return False
    if processors is None:
        if not wanted(env):
            return False
        processors = [BatchSpanProcessor(e) for e in _exporters(env)]
    if env.get("OTEL_SERVICE_NAME") is None and "service.name" not in env.get(
            "OTEL_RESOURCE_ATTRIBUTES", ""):
        resource = Resource.create({"service.name": "swarm-api"})
    else:
        resource = Resource.create()
    provider = TracerProvider(resource=resource)
    for p in processors:
        provider.add_span_processor(p)
    _State.provider = provider
    _State.tracer = provider.get_tracer("swarm-api")
    _State.capture = env.get(CAPTURE_ENV, "").lower() == "true"
    log.info("tracing on (%d span processors)", len(processors))
    return True


def shutdown() -> None:
    """Flush and stop (at process exit); tracing is off afterwards."""
    provider, _State.provider, _State.tracer = _State.provider, None, None
    if provider is not None:
        provider.shutdown()


# ---- context -------------------------------------------------------------------------------


def new_traceparent() -> str:
    """A fresh W3C traceparent (sampled), for a swarm created without one."""
    return f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"


def valid_traceparent(value: str | None) -> str | None:
    """`value` when it is a well-formed, non-zero W3C traceparent, else None."""
    if not value:
        return None
    ctx = _PROPAGATOR.extract({"traceparent": value})
    span_ctx = trace.get_current_span(ctx).get_span_context()
    return value.strip().lower() if span_ctx.is_valid else None


def _traceparent_of(span: Span) -> str:
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, trace.set_span_in_context(span))
    return carrier["traceparent"]


def swarm_created(incoming: str | None, key_id: str | None = None) -> str:
    """The traceparent to store with a new swarm: a `create_swarm` span's (a child of the
    caller's `traceparent`; it marks the creation, and every process that runs the swarm
    continues from it; it names the caller's key by its id, never the key), or without
    tracing the caller's own, or a new one."""
    parent = valid_traceparent(incoming)
    if _State.tracer is None:
        return parent or new_traceparent()
    ctx = _PROPAGATOR.extract({"traceparent": parent}) if parent else None
    attributes = {"swarm_api.key_id": key_id} if key_id is not None else None
    with _State.tracer.start_as_current_span("create_swarm", context=ctx, kind=SpanKind.SERVER,
                                             attributes=attributes) as span:
        return _traceparent_of(span)


@contextmanager
def _span(name: str, parent: otel_context.Context | None, kind: SpanKind,
          attributes: dict[str, Any]) -> Iterator[Span]:
    assert _State.tracer is not None
    with _State.tracer.start_as_current_span(name, context=parent, kind=kind,
                                             attributes=attributes) as span:
        yield span


def swarm_span(swarm_id: str, traceparent: str | None) -> Any:
    """This process's run of a swarm (`invoke_agent swarm`), a child of the stored context;
    the subtask tasks created inside it inherit it."""
    if _State.tracer is None:
        return nullcontext()
    parent = _PROPAGATOR.extract({"traceparent": traceparent}) if traceparent else None
    return _span("invoke_agent swarm", parent, SpanKind.INTERNAL, {
        "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "swarm",
        "gen_ai.agent.id": swarm_id, "gen_ai.conversation.id": swarm_id})


def agent_span(name: str, kind: str, model: str, swarm_id: str) -> Any:
    """One subtask (planner, worker, compressor, synthesizer): `invoke_agent <name>`."""
    if _State.tracer is None:
        return nullcontext()
    return _span(f"invoke_agent {name}", None, SpanKind.INTERNAL, {
        "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": name,
        "gen_ai.request.model": model, "swarm.subtask.kind": kind,
        "gen_ai.conversation.id": swarm_id})


def chat_span(model: str, server: str, messages: Sequence[Mapping[str, Any]],
              max_tokens: int, temperature: float | None) -> Any:
    """One gateway attempt: `chat <model>` (a CLIENT span; retries are its siblings)."""
    if _State.tracer is None:
        return nullcontext()
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": PROVIDER_NAME,
        "gen_ai.request.model": model, "gen_ai.request.max_tokens": max_tokens,
        "server.address": server}
    if temperature is not None:
        attrs["gen_ai.request.temperature"] = temperature
    if _State.capture:
        attrs["gen_ai.input.messages"] = json.dumps(list(messages), ensure_ascii=False)
    return _span(f"chat {model}", None, SpanKind.CLIENT, attrs)


def tool_span(server: str, tool: str, call_id: str) -> Any:
    """One tool call: `execute_tool <tool>`."""
    if _State.tracer is None:
        return nullcontext()
    return _span(f"execute_tool {tool}", None, SpanKind.INTERNAL, {
        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool,
        "gen_ai.tool.call.id": call_id, "mcp.server.name": server})


def inject(headers: dict[str, str] | None) -> dict[str, str] | None:
    """`headers` plus the current span's traceparent (the same dict when tracing is off)."""
    if _State.tracer is None:
        return headers
    out = dict(headers or {})
    _PROPAGATOR.inject(out)
    return out


def record_chat(*, error: str | None, status_code: int | None, input_tokens: int,
                output_tokens: int, finish_reason: str | None = None,
                output: str | None = None) -> None:
    """Attributes of the current `chat` span once its attempt is known (`error`: a failed
    attempt's outcome)."""
    if _State.tracer is None:
        return
    span = trace.get_current_span()
    span.set_attribute("gen_ai.usage.input_tokens", input_tokens)
    span.set_attribute("gen_ai.usage.output_tokens", output_tokens)
    if status_code is not None:
        span.set_attribute("http.response.status_code", status_code)
    if finish_reason:
        span.set_attribute("gen_ai.response.finish_reasons", [finish_reason])
    if error is not None:
        span.set_attribute("error.type", error)
        span.set_status(Status(StatusCode.ERROR, error))
    elif output is not None and _State.capture:
        span.set_attribute("gen_ai.output.messages", json.dumps(
            [{"role": "assistant", "content": output, "finish_reason": finish_reason}],
            ensure_ascii=False))


def record_error(error_type: str, message: str | None = None) -> None:
    """Mark the current span failed (a subtask that failed, a tool that errored)."""
    if _State.tracer is None:
        return
    span = trace.get_current_span()
    span.set_attribute("error.type", error_type)
    span.set_status(Status(StatusCode.ERROR, message or error_type))


def attribute(key: str, value: str | int | float | bool) -> None:
    """One attribute on the current span."""
    if _State.tracer is not None:
        trace.get_current_span().set_attribute(key, value)


def event(name: str, **attributes: Any) -> None:
    """An event on the current span (a budget wait, a queue wait)."""
    if _State.tracer is not None:
        trace.get_current_span().add_event(name, attributes)
