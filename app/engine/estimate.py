"""What a swarm would do and cost before it runs (SPEC §14): pure figures from a plan, the
price table, the tenant's ledger history and the caps' room. No IO.

Per call: `max` is the reservation the engine makes for it (the prompt's byte bound and
`max_tokens` at the model's prices, `estimate_prompt_tokens` / `worst_case`, as the run
computes them); `expected` and `p90` take the completion tokens per call of the tenant's
recent calls of the same model and subtask kind, or `max_tokens` without history, and the
prompt's own text at ~4 bytes a token plus the expected outputs it carries.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from app.db.history import Bucket, Caps, History
from app.engine import dag
from app.engine.context import (
    MESSAGE_OVERHEAD_TOKENS,
    estimate_prompt_tokens,
    estimate_request_tokens,
)
from app.pricing import PriceTable, usd_str
from app.states import SubtaskKind

# a token of English text averages about four bytes (the simulator counts the same way);
# used for expected figures only, never for a bound
TEXT_BYTES_PER_TOKEN = 4
# an output not yet written is bounded at its max_tokens at this many bytes a token: the one
# assumption in `max` (a prompt that carries other agents' outputs cannot be known earlier)
OUTPUT_BYTES_PER_TOKEN = 4
# the 90th percentile of a normal distribution, in standard deviations above the mean
Z90 = 1.2816


@dataclass(frozen=True, slots=True)
class PlannedCall:
    """One subtask of the plan: its messages as the run sends them, the outputs it carries
    (`inputs`) left out of them, and the room the engine fits those outputs into."""

    name: str
    kind: SubtaskKind
    model: str
    max_tokens: int
    messages: list[dict[str, Any]]
    inputs: tuple[str, ...] = ()
    room_chars: int = 0
    tools: list[dict[str, Any]] = field(default_factory=list)  # OpenAI tool definitions
    max_turns: int = 1


@dataclass(frozen=True, slots=True)
class Plan:
    """The swarm as it would run: its calls (workers, then system subtasks), the agents as a
    request posts them, and the limits the figures depend on."""

    calls: list[PlannedCall]
    agents: list[dict[str, Any]]
    deps: dict[str, list[str]]  # the agents' DAG
    concurrency: int
    tool_result_bytes: int = 16384


@dataclass(frozen=True, slots=True)
class Figures:
    """One call's (or the swarm's) figures."""

    calls: float = 0.0
    calls_max: int = 0
    tokens: float = 0.0
    tokens_max: int = 0
    cost: Decimal = Decimal(0)
    cost_p90: Decimal = Decimal(0)
    cost_max: Decimal = Decimal(0)
    largest: Decimal = Decimal(0)  # its largest single reservation

    def __add__(self, other: Figures) -> Figures:
        return Figures(self.calls + other.calls, self.calls_max + other.calls_max,
                       self.tokens + other.tokens, self.tokens_max + other.tokens_max,
                       self.cost + other.cost, self.cost_p90 + other.cost_p90,
                       self.cost_max + other.cost_max, max(self.largest, other.largest))


@dataclass(frozen=True, slots=True)
class Estimate:
    agents: list[dict[str, Any]]
    width: int
    depth: int
    total: Figures
    reservation: Decimal
    fits: dict[str, bool]
    samples: int
    since: datetime | None
    planning_cost: Decimal | None = None

    def view(self) -> dict[str, Any]:
        """The answer of `POST /swarms/estimate` (money as exact decimal strings)."""
        t = self.total
        out: dict[str, Any] = {
            "plan": {"agents": self.agents}, "width": self.width, "depth": self.depth,
            "calls": {"expected": round(t.calls, 1), "max": t.calls_max},
            "tokens": {"expected": math.ceil(t.tokens), "max": t.tokens_max},
            "cost_usd": {"expected": usd_str(t.cost), "p90": usd_str(t.cost_p90),
                         "max": usd_str(t.cost_max)},
            "reservation_usd": usd_str(self.reservation), "fits": self.fits,
            "basis": {"samples": self.samples,
                      "since": None if self.since is None else self.since.isoformat()},
        }
        if self.planning_cost is not None:
            out["planning_cost_usd"] = usd_str(self.planning_cost)
        return out


def text_tokens(messages: Sequence[Mapping[str, Any]]) -> int:
    """Expected prompt tokens of messages' own text (not a bound)."""
    size = estimate_prompt_tokens(messages) - MESSAGE_OVERHEAD_TOKENS * (len(messages) + 1)
    return math.ceil(size / TEXT_BYTES_PER_TOKEN) + 4 * len(messages)


@dataclass(frozen=True, slots=True)
class _Completion:
    expected: float
    p90: float


def _completion(call: PlannedCall, history: History) -> tuple[_Completion, Bucket | None]:
    bucket = history.of(call.model, call.kind, bool(call.tools))
    if bucket is None:  # no history: every answer at its max_tokens
        return _Completion(call.max_tokens, call.max_tokens), None
    mean = bucket.completion_tokens / bucket.calls
    spread = math.sqrt(max(bucket.completion_squares / bucket.calls - mean * mean, 0.0))
    return _Completion(min(mean, call.max_tokens),
                       min(mean + Z90 * spread, call.max_tokens)), bucket


def _turns(call: PlannedCall, bucket: Bucket | None) -> tuple[float, float]:
    """Expected and p90 turns of a tool agent (without history: all of them)."""
    if not call.tools:
        return 1.0, 1.0
    if bucket is None or bucket.subtasks == 0:
        return float(call.max_turns), float(call.max_turns)
    mean = bucket.calls / bucket.subtasks
    spread = math.sqrt(max(bucket.turns_squares / bucket.subtasks - mean * mean, 0.0))
    return min(mean, call.max_turns), min(mean + Z90 * spread, call.max_turns)


def _bounds(call: PlannedCall, carried: int, tool_result_bytes: int) -> list[int]:
    """The prompt bound the engine reserves on, per turn (one for a call without tools)."""
    if not call.tools:
        return [estimate_prompt_tokens(call.messages) + carried]
    first = estimate_request_tokens(call.messages, call.tools) + carried
    # each further turn carries the last answer and a tool's result
    grows = call.max_tokens * OUTPUT_BYTES_PER_TOKEN + tool_result_bytes \
        + 2 * MESSAGE_OVERHEAD_TOKENS
    return [first + k * grows for k in range(call.max_turns)]


def _call_figures(call: PlannedCall, prices: PriceTable, history: History,
                  done: Mapping[str, _Completion], max_out: Mapping[str, int],
                  tool_result_bytes: int) -> tuple[Figures, _Completion]:
    price = prices[call.model]
    own, bucket = _completion(call, history)
    turns, turns_p90 = _turns(call, bucket)
    text = text_tokens(call.messages)
    prompt = text + sum(done[i].expected for i in call.inputs if i in done)
    prompt_p90 = text + sum(done[i].p90 for i in call.inputs if i in done)
    if call.tools and bucket is not None:  # a turn's prompt grows with the conversation
        prompt = prompt_p90 = max(prompt, bucket.prompt_tokens / bucket.calls)
    carried = min(sum(max_out.get(i, 0) for i in call.inputs), call.room_chars)
    bounds = _bounds(call, carried, tool_result_bytes)
    worst = [price.worst_case(b, call.max_tokens) for b in bounds]
    expected = price.cost(math.ceil(prompt), math.ceil(own.expected))
    p90 = price.cost(math.ceil(prompt_p90), math.ceil(own.p90))
    return Figures(
        calls=turns, calls_max=len(bounds), tokens=(prompt + own.expected) * turns,
        tokens_max=sum(bounds) + call.max_tokens * len(bounds),
        cost=expected * Decimal(str(turns)), cost_p90=p90 * Decimal(str(turns_p90)),
        cost_max=sum(worst, Decimal(0)), largest=max(worst)), own


def width_of(deps: Mapping[str, Sequence[str]]) -> int:
    """The most agents that can run at once: the largest layer by dependency depth."""
    level: dict[str, int] = {}
    for name in dag.topological_order(deps, deps):
        level[name] = 1 + max((level[d] for d in deps[name]), default=0)
    counts: dict[int, int] = {}
    for lv in level.values():
        counts[lv] = counts.get(lv, 0) + 1
    return max(counts.values(), default=0)


def estimate(plan: Plan, prices: PriceTable, history: History, caps: Caps,
             planning_cost: Decimal | None = None) -> Estimate:
    """The swarm's calls, tokens and cost (expected, p90, max), the most it holds reserved at
    once, and whether each cap has room for its worst case."""
    done: dict[str, _Completion] = {}
    max_out = {c.name: c.max_tokens * OUTPUT_BYTES_PER_TOKEN for c in plan.calls}
    by_name = {c.name: c for c in plan.calls}
    order = dag.topological_order({c.name: list(c.inputs) for c in plan.calls},
                                  [c.name for c in plan.calls])
    total = Figures()
    largest: list[Decimal] = []
    for name in order:
        figures, done[name] = _call_figures(by_name[name], prices, history, done, max_out,
                                            plan.tool_result_bytes)
        total += figures
        largest.append(figures.largest)
    # at most `concurrency` calls hold a reservation at once: the largest ones, at worst
    reservation = sum(sorted(largest, reverse=True)[:plan.concurrency], Decimal(0))
    fits = {name: left is None or total.cost_max <= left for name, left in (
        ("budget", caps.budget), ("tenant_daily", caps.tenant_daily), ("daily", caps.daily))}
    return Estimate(plan.agents, width_of(plan.deps), dag.depth(plan.deps), total,
                    reservation, fits, history.samples, history.since, planning_cost)
