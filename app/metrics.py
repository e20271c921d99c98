"""Every Prometheus collector of SPEC §5, in one place, initialised to zero at import.

Several processes (uvicorn --workers, or many API replicas on one host) share their figures
through prometheus-client's multiprocess mode: set PROMETHEUS_MULTIPROC_DIR to an empty
directory before the processes start (it is read when this module is imported) and wipe it on
every deploy. Counters and histograms then add up across processes, dead ones included, which
is right for totals. Gauges say how to merge: in-progress / in-flight gauges use `livesum` (the
sum over live processes) and the price-table info `livemax`; "live" relies on the files of a
dead pid being removed (`prometheus_client.multiprocess.mark_process_dead`), which gunicorn's
child_exit hook does and plain uvicorn does not, so after a worker crash its last gauge values
linger until the directory is wiped. One process per container (docker-compose) needs none of it.
"""

from __future__ import annotations

import os
import threading
from decimal import Decimal
from typing import TypeVar
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
    start_http_server,
)

from app.pricing import BUILTIN_MODELS, PriceTable
from app.states import (
    ANSWERED,
    FAILED_ATTEMPT,
    AttemptOutcome,
    SubtaskKind,
    SubtaskStatus,
    SwarmStatus,
    ToolCallStatus,
)

# LLM work: 5 ms up to 10 minutes
LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0,
    120.0, 300.0, 600.0,
)
COST_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                25.0, 50.0, 100.0)

SWARM_TERMINAL = tuple(s.value for s in SwarmStatus if s.terminal)
SUBTASK_KINDS = tuple(k.value for k in SubtaskKind)
SUBTASK_TERMINAL = tuple(s.value for s in SubtaskStatus if s.terminal)
# unknown: the answer was lost (a crash, a cancel)
OUTCOMES = tuple(o.value for o in (*ANSWERED, AttemptOutcome.unknown))
RETRY_REASONS = tuple(o.value for o in FAILED_ATTEMPT)
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
spend_unresolved = Counter("swarm_spend_unresolved_usd_total",
                           "USD recorded at reservations: attempts whose answer was lost",
                           ["model"])
runs_in_progress = Gauge("swarm_runs_in_progress", "Swarms being driven by this process",
                         multiprocess_mode="livesum")
subtasks_in_flight = Gauge("swarm_subtasks_in_flight", "Gateway calls in flight", ["model"],
                           multiprocess_mode="livesum")
gateway_retries = Counter("swarm_gateway_retries_total", "Attempts that are retried",
                          ["model", "reason"])
finish_reasons = Counter("swarm_finish_reason_total", "finish_reason of answers",
                         ["model", "finish_reason"])
# SPEC §15: a model passed over for the next of its list, by both models
model_fallbacks = Counter("swarm_model_fallbacks_total",
                          "Calls moved to the next model of their list", ["from_model", "to_model"])
# pairs grow as the square of the models: shown from the start only for a table this small
FALLBACK_PAIRS_MAX_MODELS = 16
budget_denials = Counter("swarm_budget_denials_total", "Calls refused by a budget", ["scope"])
structured_outputs = Counter("swarm_structured_outputs_total",
                             "Answers of subtasks with an output schema, by how they ended",
                             ["status"])
run_cost = Histogram("swarm_run_cost_usd", "Cost per swarm", ["status"], buckets=COST_BUCKETS)
queue_wait = Histogram("swarm_subtask_queue_wait_seconds", "Subtask ready -> started",
                       ["kind"], buckets=LATENCY_BUCKETS)
price_table_info = Gauge("swarm_price_table_info",
                         "The model price table in force (value 1; version as on /readyz)",
                         ["version"], multiprocess_mode="livemax")
subtasks_reused = Counter("swarm_subtasks_reused_total",
                          "Subtasks copied as succeeded into a retry (no gateway call)", ["kind"])
# SPEC §8: requests refused by a tenant's quota, by the key that refused them (no tenant label)
QUOTA_LIMITS = ("requests_per_minute", "max_active_swarms", "max_agents", "max_budget_usd",
                "daily_budget_usd", "max_streams", "max_inflight_calls")
quota_denials = Counter("swarm_quota_denials_total", "Requests refused by a tenant quota",
                        ["limit"])
http_duration = Histogram("swarm_http_request_duration_seconds", "HTTP requests served",
                          ["method", "route", "status"], buckets=LATENCY_BUCKETS)
# SPEC §5: a swarm claimed from another owner, by how that owner let go of it
TAKEOVER_REASONS = ("lease_expired", "released")
takeovers = Counter("swarm_takeovers_total", "Swarms taken over from another owner",
                    ["reason"])
# SPEC §16: swarms whose content was erased, by why (a DELETE, the retention sweep)
ERASE_REASONS = ("request", "retention")
erased_swarms = Counter("swarm_erased_swarms_total", "Swarms whose content was erased",
                        ["reason"])
# SPEC §14: how each swarm that named an approval rule went on
APPROVAL_OUTCOMES = ("approved", "rejected", "timed_out", "auto")
approvals = Counter("swarm_approvals_total", "Approval decisions on swarms", ["outcome"])
# Measured from the database when /metrics is asked (`set_queue_oldest_age`): every API
# process sees the same queue, and the process just scraped has the freshest figure, so the
# merge across processes keeps the most recent value (a `max` would keep a process's old,
# larger age after the queue drained, until that process happened to be scraped again).
queue_oldest_age = Gauge("swarm_queue_oldest_age_seconds",
                         "Age of the oldest queued swarm (0: none queued), read at scrape",
                         multiprocess_mode="mostrecent")


def _init_labels() -> None:
    """Expose every known series from the start, at zero."""
    for s in SWARM_TERMINAL:
        runs_total.labels(s)
        run_duration.labels(s)
        run_cost.labels(s)
    for k in SUBTASK_KINDS:
        queue_wait.labels(k)
        subtasks_reused.labels(k)
    _init_models(MODEL_LABELS)
    for scope in ("swarm", "daily"):
        budget_denials.labels(scope)
    for status in ("valid", "repaired", "invalid"):
        structured_outputs.labels(status)
    for limit in QUOTA_LIMITS:
        quota_denials.labels(limit)
    for reason in TAKEOVER_REASONS:
        takeovers.labels(reason)
    for reason in ERASE_REASONS:
        erased_swarms.labels(reason)
    for outcome in APPROVAL_OUTCOMES:
        approvals.labels(outcome)


def _init_models(models: tuple[str, ...] | list[str]) -> None:
    if len(models) <= FALLBACK_PAIRS_MAX_MODELS:
        for a in models:
            for b in models:
                if a != b:
                    model_fallbacks.labels(a, b)
    for m in models:
        subtasks_in_flight.labels(m)
        spend_total.labels(m)
        spend_unresolved.labels(m)
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


_init_labels()


def set_price_table(table: PriceTable) -> None:
    """At startup: publish the table's version and expose its models' series at zero (a
    models file may name models beyond the built-in ones; the table bounds the labels)."""
    if not _multiprocess():  # one process, maybe several tables over its life (tests)
        price_table_info.clear()  # not implemented by prometheus-client across processes
    price_table_info.labels(table.version).set(1)
    _init_models(table.names())


# SWARM_DAILY_BUDGET_USD as a series, for alerts on the spend rate against it; absent (not 0)
# while no cap is set, so `rate(spend) / cap` has no series rather than a division by zero
_daily_budget: Gauge | None = None


def set_daily_budget(cap: Decimal | None) -> None:
    """At startup: publish the global daily cap (or withdraw it)."""
    global _daily_budget
    if cap is None:
        if _daily_budget is not None and not _multiprocess():  # one process, many apps (tests)
            REGISTRY.unregister(_daily_budget)
            _daily_budget = None
        return
    if _daily_budget is None:
        _daily_budget = Gauge("swarm_daily_budget_usd", "SWARM_DAILY_BUDGET_USD in force",
                              multiprocess_mode="livemax")
    _daily_budget.set(float(cap))


def set_queue_oldest_age(seconds: float) -> None:
    queue_oldest_age.set(seconds)


M = TypeVar("M", Counter, Gauge, Histogram)
_children: dict[tuple[object, tuple[str, ...]], object] = {}


def child(metric: M, *values: str) -> M:
    """`metric.labels(*values)`, remembered: `labels` checks, converts, locks and looks up on
    every call (~2 µs; the engine asks ~12 times per subtask) for a child that, once made, is
    the same for the life of the process (only `price_table_info` is ever cleared: not here).
    The label sets are bounded (models by the price table, outcomes, kinds, statuses)."""
    key = (metric, values)
    found = _children.get(key)
    if found is None:
        found = _children[key] = metric.labels(*values)
    return found  # type: ignore[return-value]


def count_attempt(label: str, outcome: AttemptOutcome, prompt_tokens: int,
                  completion_tokens: int, cost: float, latency_s: float,
                  at_bound: bool) -> None:
    """A billed attempt, a swarm's or a passthrough's: a request, its latency (an `unknown`
    one has none to speak of), its tokens and spend; `at_bound` (billed its bounds, not a
    usage reported): its spend is unresolved too."""
    child(gateway_requests, label, outcome).inc()
    if outcome is not AttemptOutcome.unknown:
        child(gateway_duration, label, outcome).observe(latency_s)
    child(tokens_total, label, "prompt").inc(prompt_tokens)
    child(tokens_total, label, "completion").inc(completion_tokens)
    child(spend_total, label).inc(cost)
    if at_bound:
        child(spend_unresolved, label).inc(cost)


def count_unknown(label: str, cost: float, prompt_tokens: int, completion_tokens: int) -> None:
    """An attempt whose answer was lost, billed `unknown` at its reservation: a request, its
    spend (all of it unresolved) and its worst-case tokens."""
    count_attempt(label, AttemptOutcome.unknown, prompt_tokens, completion_tokens, cost, 0.0,
                  at_bound=True)


def finish_label(reason: str | None) -> str:
    return reason if reason in ("stop", "length", "content_filter") else "other"


def _multiprocess() -> bool:
    # prometheus-client's own variable, not a setting: the library reads it at import (which
    # kind of value store every collector uses), before any Settings exists; read it likewise
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


def _registry() -> CollectorRegistry:
    if _multiprocess():
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return registry
    return REGISTRY


def process_exiting() -> None:
    """In multiprocess mode, drop this process's live gauges (`livesum`, `livemax`) from the
    merged view: a stopped `serve --workers` process no longer counts as in flight."""
    if _multiprocess():
        multiprocess.mark_process_dead(os.getpid())  # type: ignore[no-untyped-call]


def render() -> tuple[bytes, str]:
    """The exposition text: merged across processes in multiprocess mode."""
    return generate_latest(_registry()), CONTENT_TYPE_LATEST


def serve_http(port: int, host: str) -> tuple[WSGIServer, threading.Thread]:
    """`/metrics` on its own port from a daemon thread, for processes without an API
    (`swarm-api worker`); call `.shutdown()` on the server to stop it."""
    return start_http_server(port, addr=host, registry=_registry())


# ---- tools (SPEC §9); series appear per configured server and listed tool ----------------

TOOL_OUTCOMES = tuple(o.value for o in ToolCallStatus)
tool_calls_total = Counter("swarm_tool_calls_total", "Tool calls of sub-agents",
                           ["server", "tool", "outcome"])
tool_call_duration = Histogram("swarm_tool_call_duration_seconds",
                               "One tool call, its slot wait excluded", ["server", "tool"],
                               buckets=LATENCY_BUCKETS)
tool_calls_in_flight = Gauge("swarm_tool_calls_in_flight", "Tool calls running", ["server"],
                             multiprocess_mode="livesum")


def init_tool_labels(server: str, tools: list[str]) -> None:
    """Expose a server's series at zero once its tools are known."""
    tool_calls_in_flight.labels(server)
    for t in tools:
        tool_call_duration.labels(server, t)
        for o in TOOL_OUTCOMES:
            tool_calls_total.labels(server, t, o)
