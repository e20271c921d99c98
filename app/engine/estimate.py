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

from app.db.history import Caps, History
from app.engine.context import (
    MESSAGE_OVERHEAD_TOKENS,
    estimate_prompt_tokens,
    estimate_request_tokens,
)
from app.pricing import ModelPrice, PriceTable, usd_str
from app.states import SubtaskKind

# a token of English text averages about four bytes (the simulator counts the same way);
# used for expected figures only, never for a bound
TEXT_BYTES_PER_TOKEN = 4
# an output not yet written is bounded at its max_tokens at this many bytes a token: the one
# assumption in `max` (a prompt that carries other agents' outputs cannot be known earlier)
OUTPUT_BYTES_PER_TOKEN = 4
# the 90th percentile of a normal distribution, in standard deviations above the mean
Z90 = 1.2816


@dataclass(slots=True)  # not frozen: a frozen one's __init__ costs ~1 us a field per call
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
    maybe: bool = False  # made only in some runs (a vote's synthesizer): in `max` alone
    schema_bound: int = 0  # what an output schema sent as response_format adds to the bound


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
    """The swarm's figures."""

    calls: float = 0.0
    calls_max: int = 0
    tokens: float = 0.0
    tokens_max: int = 0
    cost: Decimal = Decimal(0)
    cost_p90: Decimal = Decimal(0)
    cost_max: Decimal = Decimal(0)
    largest: Decimal = Decimal(0)  # the largest single reservation


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


def text_tokens(bound: int, messages: int) -> int:
    """Expected prompt tokens of messages' own text, from their byte bound
    (`estimate_prompt_tokens`) and their count: not a bound."""
    size = bound - MESSAGE_OVERHEAD_TOKENS * (messages + 1)
    return math.ceil(size / TEXT_BYTES_PER_TOKEN) + 4 * messages


def levels(deps: Mapping[str, Sequence[str]]) -> dict[str, int]:
    """Each node's layer: 1 + the deepest of its dependencies (the graph is acyclic)."""
    if not any(deps.values()):  # a fan-out: one layer
        return dict.fromkeys(deps, 1)
    level: dict[str, int] = {}
    for root, first in deps.items():
        if not first:  # most nodes of a wide plan: no walk
            level[root] = 1
            continue
        stack = [root]
        while stack:
            node = stack[-1]
            if node in level:
                stack.pop()
                continue
            waiting = [d for d in deps.get(node, ()) if d not in level]
            if waiting:
                stack.extend(waiting)
                continue
            stack.pop()
            level[node] = 1 + max((level[d] for d in deps.get(node, ())), default=0)
    return level


def width_of(deps: Mapping[str, Sequence[str]]) -> int:
    """The most agents that can run at once: the largest layer by dependency depth."""
    return _widest(levels(deps))


def _widest(layers: Mapping[str, int]) -> int:
    counts: dict[int, int] = {}
    for lv in layers.values():
        counts[lv] = counts.get(lv, 0) + 1
    return max(counts.values(), default=0)


def _spread(total: int, squares: int, n: int) -> tuple[float, float]:
    """Mean and standard deviation from sums."""
    mean = total / n
    return mean, math.sqrt(max(squares / n - mean * mean, 0.0))


@dataclass
class _Totals:
    """The running sums of `estimate`: tokens by model (priced once at the end), bounds."""

    tokens: dict[str, list[float]] = field(default_factory=dict)  # expected p, c; p90 p, c
    calls: float = 0.0
    calls_max: int = 0
    tokens_max: int = 0
    cost_max: Decimal = Decimal(0)
    worst: list[Decimal] = field(default_factory=list)  # each call's largest reservation
    # reservations by (model, prompt bound, max_tokens): a wide plan's calls repeat a few
    priced: dict[tuple[str, int, int], Decimal] = field(default_factory=dict)

    def worst_case(self, price: ModelPrice, prompt: int, top: int) -> Decimal:
        key = (price.name, prompt, top)
        got = self.priced.get(key)
        if got is None:
            got = self.priced[key] = price.worst_case(prompt, top)
        return got


@dataclass(frozen=True, slots=True)
class _Rates:
    """What history says of one kind of call: completion tokens and turns, expected and p90
    (without history: every answer at its max_tokens, a tool agent at every turn)."""

    comp: float
    comp_p90: float
    turns: float
    turns_p90: float
    turn_prompt: float | None  # a tool agent's recent prompt per turn (None: none known)

    @classmethod
    def of(cls, call: PlannedCall, history: History) -> _Rates:
        bucket = history.of(call.model, call.kind, bool(call.tools))
        top = call.max_tokens
        if bucket is None:
            turns = float(call.max_turns if call.tools else 1)
            return cls(float(top), float(top), turns, turns, None)
        mean, sd = _spread(bucket.completion_tokens, bucket.completion_squares, bucket.calls)
        if not (call.tools and bucket.subtasks):
            return cls(min(mean, top), min(mean + Z90 * sd, top), 1.0, 1.0, None)
        t_mean, t_sd = _spread(bucket.calls, bucket.turns_squares, bucket.subtasks)
        return cls(min(mean, top), min(mean + Z90 * sd, top), min(t_mean, call.max_turns),
                   min(t_mean + Z90 * t_sd, call.max_turns), bucket.prompt_tokens / bucket.calls)


def _add_call(call: PlannedCall, rates: _Rates, price: ModelPrice,
              done: dict[str, tuple[float, float]], max_out: Mapping[str, int],
              tool_result_bytes: int, t: _Totals) -> None:
    top = call.max_tokens
    done[call.name] = (rates.comp, rates.comp_p90)
    if call.tools:
        bound = estimate_request_tokens(call.messages, call.tools)
    else:
        bound = estimate_prompt_tokens(call.messages)
    text = text_tokens(bound, len(call.messages)) + call.schema_bound // TEXT_BYTES_PER_TOKEN
    bound += call.schema_bound
    carried_e = carried_p = 0.0
    carried_max = 0
    for i in call.inputs:
        got = done.get(i)
        if got is not None:
            carried_e += got[0]
            carried_p += got[1]
        carried_max += max_out.get(i, 0)
    prompt, prompt_p90 = text + carried_e, text + carried_p
    if rates.turn_prompt is not None:  # a turn's prompt grows with the conversation
        prompt = prompt_p90 = max(prompt, rates.turn_prompt)
    first = bound + min(carried_max, call.room_chars)
    if call.tools:  # each further turn carries the last answer and a tool's result
        grows = top * OUTPUT_BYTES_PER_TOKEN + tool_result_bytes + 2 * MESSAGE_OVERHEAD_TOKENS
        bounds = [first + k * grows for k in range(call.max_turns)]
        worst = [t.worst_case(price, b, top) for b in bounds]
        t.cost_max += sum(worst, Decimal(0))
        t.worst.append(max(worst))
        t.calls_max += len(bounds)
        t.tokens_max += sum(bounds) + top * len(bounds)
    else:
        one = t.worst_case(price, first, top)
        t.cost_max += one
        t.worst.append(one)
        t.calls_max += 1
        t.tokens_max += first + top
    if call.maybe:
        return
    sums = t.tokens.get(call.model)
    if sums is None:
        sums = t.tokens[call.model] = [0.0, 0.0, 0.0, 0.0]
    sums[0] += prompt * rates.turns
    sums[1] += rates.comp * rates.turns
    sums[2] += prompt_p90 * rates.turns_p90
    sums[3] += rates.comp_p90 * rates.turns_p90
    t.calls += rates.turns


def estimate(plan: Plan, prices: PriceTable, history: History, caps: Caps,
             planning_cost: Decimal | None = None) -> Estimate:
    """The swarm's calls, tokens and cost (expected, p90, max), the most it holds reserved at
    once, and whether each cap has room for its worst case."""
    done: dict[str, tuple[float, float]] = {}  # each call's expected and p90 completion
    max_out = {c.name: c.max_tokens * OUTPUT_BYTES_PER_TOKEN for c in plan.calls}
    layer = levels({c.name: c.inputs for c in plan.calls})
    t = _Totals()
    known: dict[tuple[str, SubtaskKind, int, int, bool], _Rates] = {}
    priced = {c.model: prices[c.model] for c in plan.calls}
    for call in sorted(plan.calls, key=lambda c: layer[c.name]):  # inputs first
        key = (call.model, call.kind, call.max_tokens, call.max_turns, bool(call.tools))
        rates = known.get(key)
        if rates is None:
            rates = known[key] = _Rates.of(call, history)
        _add_call(call, rates, priced[call.model], done, max_out, plan.tool_result_bytes, t)
    cost = cost_p90 = Decimal(0)
    tokens = 0.0
    for model, (p, c, pp, cp) in t.tokens.items():
        cost += prices[model].cost(math.ceil(p), math.ceil(c))
        cost_p90 += prices[model].cost(math.ceil(pp), math.ceil(cp))
        tokens += p + c
    total = Figures(t.calls, t.calls_max, tokens, t.tokens_max, cost, cost_p90, t.cost_max,
                    max(t.worst, default=Decimal(0)))
    # at most `concurrency` calls hold a reservation at once: the largest ones, at worst
    reservation = sum(sorted(t.worst, reverse=True)[:plan.concurrency], Decimal(0))
    fits = {name: left is None or total.cost_max <= left for name, left in (
        ("budget", caps.budget), ("tenant_daily", caps.tenant_daily), ("daily", caps.daily))}
    layers = levels(plan.deps)
    return Estimate(plan.agents, _widest(layers), max(layers.values(), default=0), total,
                    reservation, fits, history.samples, history.since, planning_cost)
