"""Every Prometheus collector of SPEC §5, in one place, initialised to zero at import."""

from __future__ import annotations

import os

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

from app.gateway.pricing import BUILTIN_MODELS

# LLM work: 5 ms up to 10 minutes
LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0,
    120.0, 300.0, 600.0,
)
COST_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                25.0, 50.0, 100.0)

SWARM_TERMINAL = ("succeeded", "failed", "cancelled")
SUBTASK_KINDS = ("planner", "worker", "compressor", "synthesizer")
SUBTASK_TERMINAL = ("succeeded", "failed", "skipped", "cancelled")
OUTCOMES = ("ok", "rate_limited", "server_error", "timeout", "invalid_response", "client_error",
            "connection_error")
RETRY_REASONS = ("rate_limited", "server_error", "timeout", "invalid_response", "client_error",
                 "connection_error")
FINISH_REASONS = ("stop", "length", "content_filter", "other")
MODEL_LABELS = (*BUILTIN_MODELS, "other")

runs_total = Counter("swarm_runs_total", "Swarms that reached a terminal status", ["status"])
run_duration = Histogram("swarm_run_duration_seconds", "Swarm wall time, start to terminal",
                         ["status"], buckets=LATENCY_BUCKETS)
subtask_duration = Histogram("swarm_subtask_duration_seconds", "Subtask latency",
                             ["kind", "model", "status"], buckets=LATENCY_BUCKETS)
gateway_duration = Histogram("swarm_gateway_request_duration_seconds",
                             "One gateway attempt", ["model", "outcome"], buckets=LATENCY_BUCKETS)
gateway_requests = Counter("swarm_gateway_requests_total", "Gateway attempts",
                           ["model", "outcome"])
tokens_total = Counter("swarm_tokens_total", "Tokens reported by the gateway", ["model", "type"])
spend_total = Counter("swarm_spend_usd_total", "USD recorded in the ledger", ["model"])
runs_in_progress = Gauge("swarm_runs_in_progress", "Swarms being driven by this process",
                         multiprocess_mode="livesum")
subtasks_in_flight = Gauge("swarm_subtasks_in_flight", "Gateway calls in flight", ["model"],
                           multiprocess_mode="livesum")
gateway_retries = Counter("swarm_gateway_retries_total", "Attempts that are retried",
                          ["model", "reason"])
finish_reasons = Counter("swarm_finish_reason_total", "finish_reason of answers",
                         ["model", "finish_reason"])
budget_denials = Counter("swarm_budget_denials_total", "Calls refused by a budget", ["scope"])
run_cost = Histogram("swarm_run_cost_usd", "Cost per swarm", ["status"], buckets=COST_BUCKETS)
queue_wait = Histogram("swarm_subtask_queue_wait_seconds", "Subtask ready -> started",
                       ["kind"], buckets=LATENCY_BUCKETS)
http_duration = Histogram("swarm_http_request_duration_seconds", "HTTP requests served",
                          ["method", "route", "status"], buckets=LATENCY_BUCKETS)


def _init_labels() -> None:
    """Expose every known series from the start, at zero."""
    for s in SWARM_TERMINAL:
        runs_total.labels(s)
        run_duration.labels(s)
        run_cost.labels(s)
    for k in SUBTASK_KINDS:
        queue_wait.labels(k)
    for m in MODEL_LABELS:
        subtasks_in_flight.labels(m)
        spend_total.labels(m)
        for t in ("prompt", "completion"):
            tokens_total.labels(m, t)
        for o in OUTCOMES:
            gateway_requests.labels(m, o)
            gateway_duration.labels(m, o)
        for r in RETRY_REASONS:
            gateway_retries.labels(m, r)
        for f in FINISH_REASONS:
            finish_reasons.labels(m, f)
        for k in SUBTASK_KINDS:
            for s in SUBTASK_TERMINAL:
                subtask_duration.labels(k, m, s)
    for scope in ("swarm", "daily"):
        budget_denials.labels(scope)


_init_labels()


def finish_label(reason: str | None) -> str:
    return reason if reason in ("stop", "length", "content_filter") else "other"


def render() -> tuple[bytes, str]:
    """The exposition text: merged across processes in multiprocess mode."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(), CONTENT_TYPE_LATEST
