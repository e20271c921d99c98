"""The process's logging (SPEC §17): one configuration for serve, worker, migrate and the
simulator, uvicorn's loggers included; `json` (one object a line) or `text`.

A line carries the swarm, tenant and trace it is about when the code that logs it runs for
one: `bind` sets them in the current context (a swarm's runner task and the tasks it starts,
an API request), and the formatters read them. Named `logs`, not `logging`: a module of that
name would shadow the standard library's for every `import logging` beside it.
"""

from __future__ import annotations

import json
import logging
import logging.config
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import Context, ContextVar
from typing import Any, TextIO

FORMATS = ("json", "text")
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
CONTEXT_FIELDS = ("swarm_id", "tenant", "trace_id", "key_id")

_swarm_id: ContextVar[str | None] = ContextVar("log_swarm_id", default=None)
_tenant: ContextVar[str | None] = ContextVar("log_tenant", default=None)
_trace_id: ContextVar[str | None] = ContextVar("log_trace_id", default=None)
# the id of the request's API key (never the key: app/keys.py)
_key_id: ContextVar[str | None] = ContextVar("log_key_id", default=None)
_VARS = {"swarm_id": _swarm_id, "tenant": _tenant, "trace_id": _trace_id, "key_id": _key_id}

# what every LogRecord has: the rest of its attributes are a call's `extra` fields; uvicorn's
# `color_message` repeats the message with terminal colours
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message", "asctime", "taskName", "color_message"}


# one encoder for every line (json.dumps with options builds one a call); a Decimal, a
# datetime or an enum in a line's fields is written as its str()
_encode = json.JSONEncoder(default=str, ensure_ascii=False).encode


def trace_id_of(traceparent: str | None) -> str | None:
    """The trace id of a W3C traceparent (`00-<trace id>-<span id>-<flags>`)."""
    if not traceparent:
        return None
    parts = traceparent.split("-")
    return parts[1] if len(parts) == 4 else None


def bind(*, swarm_id: str | None = None, tenant: str | None = None,
         traceparent: str | None = None, key_id: str | None = None) -> None:
    """Name the swarm, tenant and trace of what runs in the current context from now on (the
    ones given; the others stay). A task's context is its own: a runner binds its swarm in its
    task, and the subtask tasks it starts inherit it."""
    if swarm_id is not None:
        _swarm_id.set(swarm_id)
    if tenant is not None:
        _tenant.set(tenant)
    if key_id is not None:
        _key_id.set(key_id)
    if (trace_id := trace_id_of(traceparent)) is not None:
        _trace_id.set(trace_id)


def detached() -> Context:
    """A context naming nothing, for a task that outlives the swarm or request that starts
    it (a shared refresher): `asyncio.create_task(..., context=logs.detached())`."""
    return Context()


@contextmanager
def bound(*, swarm_id: str | None = None, tenant: str | None = None,
          traceparent: str | None = None) -> Iterator[None]:
    """`bind` for the block only."""
    tokens = [(_VARS[name], _VARS[name].get()) for name in CONTEXT_FIELDS]
    bind(swarm_id=swarm_id, tenant=tenant, traceparent=traceparent)
    try:
        yield
    finally:
        for var, value in tokens:
            var.set(value)


def fields(record: logging.LogRecord) -> dict[str, Any]:
    """A record's context (the call's own `extra` wins over the bound one) and extra fields."""
    out: dict[str, Any] = {}
    for name, var in _VARS.items():
        value = record.__dict__.get(name) or var.get()
        if value is not None:
            out[name] = value
    for key, value in record.__dict__.items():
        if key not in _STANDARD and key not in out:
            out[key] = value
    return out


class JsonFormatter(logging.Formatter):
    """One JSON object a record: time (UTC, ISO 8601), level, logger, message, the context
    and extra fields, and a traceback as `exc_info` (in the object, never a line of its own)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(record.created))}"
                    f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        line.update(fields(record))
        if record.exc_info:
            line["exc_info"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack_info"] = self.formatStack(record.stack_info)
        return _encode(line)


class TextFormatter(logging.Formatter):
    """`<time> <level> <logger> <message>`, then the context and extra fields as key=value."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        text = super().formatMessage(record)
        extra = fields(record)
        if extra:
            text += " " + " ".join(f"{k}={v}" for k, v in extra.items())
        return text


def lean_records() -> None:
    """Records without what no formatter here writes: the thread's and process's names and
    ids (a `threading.current_thread()`, an `os.getpid()` and the multiprocessing module's
    current process a record). A line's content is the formatters' fields (time, level,
    logger, message, the context and `extra` fields, `exc_info`, `stack_info`), none of those;
    three records a created swarm (docs/decisions/0037-creation-cpu.md). Process-wide, as the
    logging module's switches are (the Logging HOWTO's "Optimization" section). The caller's
    file and line stay: without them (`logging._srcfile`) a `stack_info=True` is dropped."""
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    if sys.version_info >= (3, 12):  # the current task's name: no formatter here writes it
        logging.logAsyncioTasks = False


def formatter_of(fmt: str) -> logging.Formatter:
    """The configuration's formatter (dictConfig calls it in every process that applies the
    configuration, each of uvicorn's included), in a process whose records are lean."""
    lean_records()
    return JsonFormatter() if fmt == "json" else TextFormatter()


def resolve_format(fmt: str | None, stream: TextIO | None = None) -> str:
    """SWARM_LOG_FORMAT, or (unset) `text` when the log goes to a terminal, else `json`."""
    if fmt:
        return fmt
    stream = stream or sys.stderr
    try:
        return "text" if stream.isatty() else "json"
    except (AttributeError, ValueError):  # a closed or replaced stream
        return "json"


def config(fmt: str | None = None, level: str = "INFO") -> dict[str, Any]:
    """The dictConfig of a process (uvicorn applies it in each process it starts): every
    logger, uvicorn's included, writes through one stderr handler in `fmt`. httpx logs a line
    per gateway call, httpx2 (the MCP SDK's client) the same, alembic one per plugin it sets
    up on every start, SQLAlchemy's pool (the engine's FairQueuePool logs under app.db.pool)
    two per connection lost: noise below WARNING. uvicorn's own access log stays off (the
    service's has the duration: SWARM_ACCESS_LOG). `DEBUG` is the service's own loggers' and
    uvicorn's: other libraries stay at INFO, their debug lines carry what a line must not
    (aiosqlite's the statements' parameters, the MCP SDK's the tool messages)."""
    formatter = {"()": formatter_of, "fmt": resolve_format(fmt)}
    quiet = {"level": "WARNING"}
    via_root = {"handlers": [], "propagate": True}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"swarm": formatter},
        "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "swarm",
                                "stream": "ext://sys.stderr"}},
        "root": {"level": "INFO" if level == "DEBUG" else level, "handlers": ["stderr"]},
        "loggers": {"httpx": quiet, "httpx2": quiet, "alembic.runtime.plugins": quiet,
                    "app.db.pool": quiet, "app": {"level": level},
                    "swarm_api": {"level": level},
                    "uvicorn": {**via_root, "level": level},
                    "uvicorn.error": {**via_root, "level": level},
                    "uvicorn.access": {**via_root, "level": "WARNING"}},
    }


def configure(fmt: str | None = None, level: str = "INFO") -> dict[str, Any]:
    """Configure this process's logging; returns the configuration (uvicorn's `log_config`,
    which it applies again in each process it starts)."""
    conf = config(fmt, level)
    logging.config.dictConfig(conf)
    return conf


def is_json() -> bool:
    """Whether the root logger writes JSON (the process configured in `json`)."""
    return any(isinstance(h.formatter, JsonFormatter) for h in logging.getLogger().handlers)


def say(message: str, *, error: bool = True) -> None:
    """A line for the operator from the command line (a refused start, `database at head`):
    in `json` a log record like any other; in `text` the line itself, on stderr (`error`) or
    stdout, without a time or level in front."""
    if is_json():
        logging.getLogger("swarm_api").log(logging.ERROR if error else logging.INFO, message)
    else:
        print(message, file=sys.stderr if error else sys.stdout)
