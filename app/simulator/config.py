"""The simulator's configuration (latency, fault rates, auth; `SWARM_SIM_*`) and the counters
it exposes at `GET /v1/_stats`."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from typing import Any

MAX_KEYS = 20_000  # bound on every per-key table, so a long benchmark cannot grow memory forever


@dataclass
class SimulatorConfig:
    """Latency, fault rates and auth of the simulator; faults are fractions of all requests."""

    latency_ms: float = 200.0
    latency_jitter_ms: float = 0.0
    rate_429: float = 0.0
    rate_500: float = 0.0
    rate_502_html: float = 0.0
    rate_timeout: float = 0.0
    rate_truncated: float = 0.0
    rate_length: float = 0.0
    retry_after_s: float = 1.0
    timeout_s: float = 120.0
    api_key: str | None = None
    seed: int = 0
    # `[[sim when=<flag> ...]]` blocks apply only while their flag is here (a fault a test can
    # switch off between two runs of the same prompts); SWARM_SIM_FLAGS=a,b
    flags: set[str] = field(default_factory=set)
    # `[[sim exit=N]]` ends the simulator's process with code N mid-call (the in-process
    # simulator's is the worker's: a poison swarm); off, the directive is a 400
    exit_allowed: bool = False

    def __post_init__(self) -> None:
        rates = self.fault_rates()
        if any(not 0.0 <= r <= 1.0 for _, r in rates) or sum(r for _, r in rates) > 1.0:
            raise ValueError("simulator fault rates must be in [0, 1] and sum to at most 1")

    def fault_rates(self) -> tuple[tuple[str, float], ...]:
        """(fault kind, rate) in the fixed order the deterministic draw walks them."""
        return (("429", self.rate_429), ("500", self.rate_500), ("html502", self.rate_502_html),
                ("timeout", self.rate_timeout), ("truncated", self.rate_truncated),
                ("length", self.rate_length))

    @classmethod
    def from_env(cls) -> SimulatorConfig:
        """Read SWARM_SIM_<FIELD> variables (e.g. SWARM_SIM_RATE_429=0.1)."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = os.environ.get(f"SWARM_SIM_{f.name.upper()}")
            if raw is None:
                continue
            if f.name == "api_key":
                values[f.name] = raw or None
            elif f.name == "exit_allowed":
                values[f.name] = raw.strip().lower() in ("1", "true", "yes", "on")
            elif f.name == "flags":
                values[f.name] = {x.strip() for x in raw.split(",") if x.strip()}
            else:
                values[f.name] = int(raw) if f.name == "seed" else float(raw)
        return cls(**values)


@dataclass
class SimulatorStats:
    """Counters exposed at GET /v1/_stats; tests assert on them."""

    calls: int = 0
    ok: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    by_key: dict[str, dict[str, Any]] = field(default_factory=dict)
    max_in_flight_by_swarm: dict[str, int] = field(default_factory=dict)
    by_model: dict[str, int] = field(default_factory=dict)
    swarm_in_flight: dict[str, int] = field(default_factory=dict)
    plan_calls: dict[str, int] = field(default_factory=dict)
    # what a real gateway would bill: swarm -> model -> [prompt, completion, cached tokens,
    # answers] over every complete 200 answer sent (whether or not its client was still there)
    answered: dict[str, dict[str, list[int]]] = field(default_factory=dict)

    def reset(self) -> None:
        """Forget everything except the requests still in flight."""
        self.calls = self.ok = 0
        self.max_in_flight = self.in_flight
        for table in (self.by_key, self.max_in_flight_by_swarm, self.by_model, self.plan_calls,
                      self.answered):
            table.clear()

    def bill(self, swarm: str | None, model: str, usage: tuple[int, int, int]) -> None:
        per_model = self.answered.get(swarm or "")
        if per_model is None:
            per_model = bounded_put(self.answered, swarm or "", {})
        tally = per_model.setdefault(model, [0, 0, 0, 0])
        for i, n in enumerate((*usage, 1)):
            tally[i] += n

    def record(self, key: str, model: str, messages: list[Any], received_at: float) -> int:
        """Count one attempt of a logical call and return its attempt number (1-based).
        `received_at` (Unix time, when its handler began): the fan-out's anatomy compares it
        with the caller's start to see how long a request took to reach the gateway."""
        entry = self.by_key.get(key)
        if entry is None:
            entry = bounded_put(self.by_key, key, {"calls": 0, "ok": 0, "last_messages": None,
                                                   "received_at": None})
        entry["calls"] += 1
        entry["last_messages"] = messages
        entry["received_at"] = received_at
        self.by_model[model] = self.by_model.get(model, 0) + 1
        return int(entry["calls"])

    def as_json(self) -> dict[str, Any]:
        """The public counters (without the internal bookkeeping tables)."""
        return {"calls": self.calls, "ok": self.ok, "in_flight": self.in_flight,
                "max_in_flight": self.max_in_flight, "by_key": self.by_key,
                "max_in_flight_by_swarm": self.max_in_flight_by_swarm, "by_model": self.by_model,
                "answered": self.answered}


def bounded_put(table: dict[str, Any], key: str, value: Any) -> Any:
    """`table[key] = value`, dropping the oldest key when the table is full (MAX_KEYS)."""
    if key not in table and len(table) >= MAX_KEYS:
        del table[next(iter(table))]  # dicts keep insertion order: drop the oldest
    table[key] = value
    return value
