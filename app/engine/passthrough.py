"""A caller's chat completion sent to the gateway as it is (the OpenAI facade without
`agent_swarm`), metered like any call of a swarm: the worst case reserved on the daily caps
before each attempt and settled to the real cost after it, one ledger row per attempt (swarm
and subtask NULL), and the gateway metrics."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal
from typing import Any

from app import metrics
from app.aio import run_to_end
from app.db import passthrough as ledger
from app.db.retry import in_transaction
from app.db.session import SessionFactory
from app.db.types import utcnow
from app.engine.attempts import AttemptRows, AttemptState
from app.engine.budget import Reservation, SharedCap, billable_usage
from app.engine.context import MESSAGE_OVERHEAD_TOKENS, TOOLS_OVERHEAD_TOKENS
from app.gateway.chat import AttemptRecord, Usage
from app.pricing import ModelPrice
from app.states import AttemptOutcome

# the longest a streamed attempt may last, events or not: with SWARM_FACADE_TIMEOUT_S between
# events alone, a gateway that kept sending would hold its row and reservation for ever
MAX_STREAM_S = 3600.0
# a row still `in_flight` this long after it was written lost its process: longer than any
# live attempt lasts (a plain one is bounded by SWARM_FACADE_TIMEOUT_S, at most 3,600 s; a
# stream by MAX_STREAM_S), so another process's start never settles a call still answering
STALE_AFTER_S = 2 * MAX_STREAM_S


def prompt_bound(body: Mapping[str, Any], context_window: int) -> int:
    """An upper bound of the prompt's tokens: the UTF-8 bytes of the whole request — its
    messages, tool definitions and whatever else the gateway may tokenize (a token is at least
    one byte) — plus the overheads the engine reserves for its calls (per message, and for
    offered tools). A part that is not text (an image, audio, a file: by URL, id or inline) is
    billed on what it holds, not its bytes — a tiny image costs hundreds of tokens — so a
    request with one is bounded by the model's whole context window on top."""
    text = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    messages = body.get("messages")
    messages = messages if isinstance(messages, list) else []
    tools = TOOLS_OVERHEAD_TOKENS if body.get("tools") else 0
    media = context_window if any(_has_media(m) for m in messages) else 0
    return (len(text.encode("utf-8", "replace")) + MESSAGE_OVERHEAD_TOKENS * (len(messages) + 1)
            + tools + media)


def _has_media(message: object) -> bool:
    content = message.get("content") if isinstance(message, dict) else None
    return isinstance(content, list) and any(
        not (isinstance(part, dict) and part.get("type") == "text") for part in content)


def call_key() -> str:
    """The passthrough call's Idempotency-Key (and ledger key): unique per request."""
    return f"chatcmpl-{uuid.uuid4().hex}"


@dataclass
class PassthroughMeter:
    """Reservations, write-ahead ledger rows and metrics for one forwarded request (all its
    attempts), as CallMeter does for a swarm's calls.

    `before`/`after` are the gateway client's attempt hooks. Before an attempt is sent its row
    is committed `in_flight` at the reserved worst case, so money a gateway may bill is never in
    no row; `after` settles it to the real usage; `release` settles an attempt cut off mid-call
    (a cancelled request) as `unknown` at its reservation and frees what is still held. A row
    left `in_flight` by a process that died is settled `unknown` by `settle_stale` later.

    Each attempt's row follows the ledger's state machine (`states.ATTEMPT_TRANSITIONS`), as
    CallMeter's do: a move it does not allow (an answer to no attempt open, a second answer
    to one) raises InvalidTransition.
    """

    sessions: SessionFactory
    price: ModelPrice
    caps: Sequence[SharedCap]
    tenant: str
    worst: Decimal
    prompt_bound: int
    max_tokens: int
    key: str = field(default_factory=call_key)
    lease_s: float = 15.0
    _held: list[tuple[SharedCap, Reservation]] = field(default_factory=list)
    _state: AttemptState = field(default_factory=AttemptState)  # the latest attempt's
    _number: int = 0  # the latest attempt's
    _rows: AttemptRows = field(init=False)

    def __post_init__(self) -> None:
        self._rows = AttemptRows(None, self.tenant, None, self.price.name, self.key, self.worst)

    @property
    def label(self) -> str:
        return self.price.name

    async def before(self, attempt: int) -> None:
        if attempt > 1 and self._state.outcome is not None:
            metrics.child(metrics.gateway_retries, self.label, self._state.outcome).inc()
        held: list[tuple[SharedCap, Reservation]] = []
        try:
            for cap in self.caps:
                held.append((cap, await cap.reserve(self.worst)))
            self._held = held
            await self._write(self._rows.row(attempt, AttemptOutcome.in_flight, None, Usage(
                self.prompt_bound, self.max_tokens), Decimal(0), 0.0,
                at_bound=True))  # durable, then sent
        except BaseException:
            self._held = []
            await run_to_end(_settle_all(held, Decimal(0)))
            raise
        self._state.open()
        self._number = attempt

    async def after(self, rec: AttemptRecord) -> None:
        u = billable_usage(rec, self.prompt_bound, self.max_tokens, self.label)
        cost = self.price.cost(u.prompt_tokens, u.completion_tokens, u.cached_tokens)
        self._state.settle(rec.outcome)
        held, self._held = self._held, []
        await run_to_end(_settle_all(held, cost))
        at_bound = not rec.usage_reported  # billed its bounds (a stream cut short too)
        await self._write(self._rows.row(self._number, rec.outcome, rec.status_code, u, cost,
                                         rec.latency_s, at_bound))
        metrics.count_attempt(self.label, rec.outcome, u.prompt_tokens, u.completion_tokens,
                              float(cost), rec.latency_s, at_bound)

    def finished(self, finish_reason: str) -> None:
        """Count the answer's finish reason (as the engine does for its calls)."""
        metrics.child(metrics.finish_reasons, self.label, metrics.finish_label(finish_reason)).inc()

    async def release(self) -> None:
        """Free what an abandoned request holds; an attempt cut off after it was sent may have
        been billed: `unknown` at its reservation."""
        held, self._held = self._held, []
        lost = Decimal(0)
        if self._state.in_flight:  # cut off on the wire
            self._state.settle(AttemptOutcome.unknown)
            lost = self.worst
            await self._write(self._rows.row(self._number, AttemptOutcome.unknown, None, Usage(
                self.prompt_bound, self.max_tokens), lost, 0.0, at_bound=True))
            metrics.count_unknown(self.label, float(lost), self.prompt_bound, self.max_tokens)
        await run_to_end(_settle_all(held, lost))

    async def _write(self, row: dict[str, Any]) -> None:
        # to its end: money that may be spent reaches the ledger even when the request is
        # cancelled
        await run_to_end(in_transaction(
            self.sessions, lambda s: ledger.write_call(s, row), retry_for_s=self.lease_s))


async def _settle_all(held: Sequence[tuple[SharedCap, Reservation]], actual: Decimal) -> None:
    for cap, reservation in held:
        await cap.settle(reservation, actual)


async def settle_stale(sessions: SessionFactory, horizon_s: float = STALE_AFTER_S) -> int:
    """Settle `unknown` the passthrough attempts written ahead more than `horizon_s` ago that
    no process settled (it died): they count at their reservation from then on, in the
    ledger and the metrics (as `release` counts one cut off; the daily caps hold them
    already: a reservation outlives its dead owner). How many."""
    before = utcnow() - timedelta(seconds=horizon_s)
    stale = await in_transaction(sessions, lambda s: ledger.settle_stale(s, before),
                                 retry_for_s=15.0)
    for a in stale:  # the row's model is the meter's label (its price's name)
        metrics.count_unknown(a.model, float(a.reserved_usd), a.prompt_tokens,
                              a.completion_tokens)
    return len(stale)
