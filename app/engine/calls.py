"""One logical gateway call of a subtask: reserve and write ahead before each attempt, settle
after it."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from decimal import Decimal

from app import metrics, tracing
from app.aio import run_to_end
from app.db.changes import TenantSettle
from app.db.tables import Subtask
from app.engine.attempts import AttemptRows, AttemptState
from app.engine.budget import Reservation, SharedCap, billable_usage
from app.engine.owned_swarm import LedgerRow, OwnedSwarm
from app.gateway.chat import AttemptRecord, Usage
from app.states import AttemptOutcome

_A = AttemptOutcome


def idempotency_key(swarm_id: str, name: str, call_no: int) -> str:
    """`<swarm id>:<subtask name>:<n>`: the same across retries and takeovers of one call."""
    return f"{swarm_id}:{name}:{call_no}"


@dataclass
class CallMeter:
    """Budget reservations, write-ahead ledger rows, totals and metrics for one logical call.

    `before`/`after` are the gateway client's attempt hooks. Before an attempt is sent its
    ledger row is committed as `in_flight` with the reserved worst case (group-committed with
    the other writes of the tick), so money a gateway may bill is never in no row: if this
    process dies before the answer is committed, the next owner settles the row as `unknown`
    at that worst case. `after` settles the same row to the real usage; `release` settles an
    attempt abandoned mid-call as `unknown` and frees whatever else is held. Rows of the
    successful attempt are kept in `ok_rows` so the caller commits them with the result.

    Each attempt's row follows the ledger's state machine (`states.ATTEMPT_TRANSITIONS`):
    `_state` holds the outcome of the latest attempt's row (`attempts.AttemptState`); a move
    it does not allow raises InvalidTransition.
    """

    owned: OwnedSwarm
    sub: Subtask
    worst: Decimal
    key: str
    label: str
    prompt_bound: int  # the prompt-token bound the worst case was priced on
    model: str  # where its attempts go, priced and recorded at it (a fallback has its own meter)
    ok_rows: list[LedgerRow] = field(default_factory=list)
    _held: list[Reservation] = field(default_factory=list)
    _held_daily: list[Reservation] = field(default_factory=list)
    _state: AttemptState = field(default_factory=AttemptState)  # the latest attempt's
    _sent: bool = False  # the attempt `in_flight` is on the wire (else written ahead only)
    _rows: AttemptRows = field(init=False)

    def __post_init__(self) -> None:
        swarm = self.owned.swarm
        self._rows = AttemptRows(swarm.id, swarm.tenant, self.sub.name, self.model, self.key,
                                 self.worst)

    @property
    def _ahead(self) -> bool:
        """The attempt's row is written ahead (or being written), the attempt not yet sent."""
        return self._state.in_flight and not self._sent

    @property
    def _open(self) -> bool:
        """An attempt is on the wire: its row is written ahead, unsettled."""
        return self._state.in_flight and self._sent

    @property
    def _daily(self) -> SharedCap | None:
        return self.owned.ctx.cap_for(self.owned.swarm.tenant)

    async def prepare(self) -> None:
        """Write the first attempt's row ahead now, before the caller waits for its slots
        (its `before(1)` then has nothing left to do): the commit overlaps the calls in
        flight instead of idling a slot. Until it is sent, `release` settles it `cancelled`;
        a crash meanwhile bills it `unknown` at its reservation, like any written-ahead
        attempt whose outcome is lost. Nothing to do for a row written with the swarm's
        creation (`reserve_ahead`)."""
        if self._ahead:
            return
        await self._write_ahead()

    def reserve_ahead(self, cap_asked: bool = False) -> LedgerRow | None:
        """The first attempt opened in the caller's turn, when that needs no wait (no shared
        cap to ask, unless the caller asks it: `cap_asked`; room in the swarm's budget): its
        row, which the caller writes before the call is sent (until then `release` cancels it
        like any row ahead). None: nothing was done."""
        if self._daily is not None and not cap_asked:
            return None
        reservation = self.owned.budget.reserve_now(self.worst)
        if reservation is None:
            return None
        return self._open_attempt(reservation)

    def hold_daily(self, reservation: Reservation) -> None:
        """The shared cap's reservation the caller of `reserve_ahead(cap_asked=True)` made."""
        self._held_daily.append(reservation)

    def withdraw_ahead(self) -> None:
        """`reserve_ahead`'s row was never written (the shared cap refused it): its budget
        reservation is given back, and the call is prepared again at its turn."""
        self._state.withdraw()
        for r in self._held:
            self.owned.budget.settle(r, Decimal(0))
        self._held.clear()

    def prepare_now(self) -> asyncio.Future[None] | None:
        """`prepare` in the caller's turn, when it needs no wait (`reserve_ahead`): the row is
        queued before the caller's next write, and the future resolves once it is durable.
        None: nothing was done (call `prepare`)."""
        row = self.reserve_ahead()
        return None if row is None else self.owned.journal.submit(ledger=[row])

    async def before(self, attempt: int) -> None:
        if self._ahead:  # prepared: durable already
            self._sent = True
            return
        if attempt > 1 and self._state.outcome is not None:
            metrics.child(metrics.gateway_retries, self.label, self._state.outcome).inc()
        await self._write_ahead()
        self._sent = True

    async def _write_ahead(self) -> None:
        asked = time.monotonic()
        reservation = await self.owned.budget.reserve(self.worst)
        if (waited := time.monotonic() - asked) > 0.001:
            tracing.event("budget_wait", seconds=round(waited, 6), reserved_usd=str(self.worst))
        if self._daily is not None:
            try:
                self._held_daily.append(await self._daily.reserve(self.worst))
            except BaseException:
                self.owned.budget.settle(reservation, Decimal(0))
                raise
        row = self._open_attempt(reservation)
        try:
            await self.owned.journal.commit(ledger=[row])  # durable before a byte is sent
        except BaseException:
            # not sent: if the row was (or will be) written anyway, it settles as cancelled
            self._cancel_ahead()
            await self.release()
            raise

    async def after(self, rec: AttemptRecord) -> None:
        u = billable_usage(rec, self.prompt_bound, self.sub.max_tokens, self.label)
        cost = self.owned.ctx.prices[self.model].cost(u.prompt_tokens, u.completion_tokens,
                                                       u.cached_tokens)
        at_bound = not rec.usage_reported  # billed its bounds, not a usage reported
        self._state.settle(rec.outcome)
        # the tenant cap's settlement rides the commit of the row billed below, in its
        # statement (no wait, no round trip: `TenantDailyCap.settle_with_row`)
        riding: list[TenantSettle] = []
        if self._daily is not None and self._held_daily:
            # a global cap's is awaited first: once the swarm's totals include this cost, no
            # other commit may run before its ledger row is queued, or totals and ledger differ
            # (run to its end even when cancelled: see DailyCap.settle)
            try:
                await self._daily.settle_with_row(self._held_daily.pop(), cost, riding.append)
            except BaseException:
                # cancelled while the (shielded) settlement runs on: the answer was billed, so
                # its row is written anyway, or the daily table would hold money no row has
                row = self._bill(rec.outcome, rec.status_code, u, cost, rec.latency_s, at_bound)
                self._ride(row, riding)
                self.owned.journal.commit_soon([self.sub], ledger=[row])
                raise
        row = self._bill(rec.outcome, rec.status_code, u, cost, rec.latency_s, at_bound)
        self._ride(row, riding)
        if rec.outcome == _A.ok:
            self.ok_rows.append(row)
        else:
            self.owned.journal.commit_soon([self.sub], ledger=[row])

    async def release(self) -> None:
        """Free what an abandoned call still holds; an attempt cut off after it was sent may
        have been billed, so it is recorded as `unknown` at its reservation."""
        if self._ahead:  # written ahead, never sent
            self._cancel_ahead()
        cut_off = self._open
        if cut_off:
            self._state.settle(_A.unknown)
        try:
            if self._daily is not None and self._held_daily:
                # attempts are sequential: at most one daily reservation is held, the open
                # one's; settled to its end even while being cancelled, and before the row
                # (as in `after`): no commit may hold the row while the daily table lacks it
                held, self._held_daily = self._held_daily, []
                await run_to_end(_settle_all(self._daily, held,
                                             self.worst if cut_off else Decimal(0)))
        finally:
            if cut_off:
                self.owned.journal.commit_soon([self.sub], ledger=[self._bill(
                    _A.unknown, None, Usage(self.prompt_bound, self.sub.max_tokens), self.worst,
                    0.0, at_bound=True)])
            for r in self._held:
                self.owned.budget.settle(r, Decimal(0))
            self._held.clear()

    def _ride(self, row: LedgerRow, riding: list[TenantSettle]) -> None:
        if riding:  # before the row is queued: its first write takes them
            self.owned.journal.with_row(row, riding)

    def _cancel_ahead(self) -> None:
        """Settle the row written ahead for an attempt never sent: `cancelled`, no cost and
        no gateway call in any count — nor in the subtask's `attempts` (no attempt follows
        in this process: the call is abandoned; a takeover numbers from the ledger, where
        the row keeps its number)."""
        self._state.settle(_A.cancelled)
        self.owned.journal.commit_soon(
            ledger=[self._row(_A.cancelled, None, Usage(), Decimal(0), 0.0)])
        self.sub.attempts -= 1

    def _open_attempt(self, reservation: Reservation) -> LedgerRow:
        """Hold the next attempt's reservation and number it: its row to write ahead, in
        flight at its bounds."""
        self._held.append(reservation)
        self.sub.attempts += 1
        self._state.open()
        self._sent = False
        return self._row(_A.in_flight, None, Usage(self.prompt_bound, self.sub.max_tokens),
                         Decimal(0), 0.0, at_bound=True)

    def _row(self, outcome: AttemptOutcome, status: int | None, u: Usage, cost: Decimal,
             latency_s: float, at_bound: bool = False) -> LedgerRow:
        # attempts of one subtask are sequential: sub.attempts numbers the open one
        return self._rows.row(self.sub.attempts, outcome, status, u, cost, latency_s, at_bound)

    def _bill(self, outcome: AttemptOutcome, status: int | None, u: Usage, cost: Decimal,
              latency_s: float, at_bound: bool) -> LedgerRow:
        """Settle the swarm budget, add to subtask and swarm totals, and make the settled
        ledger row (synchronous: nothing can commit between the totals and the row's
        queueing). `at_bound`: the cost is an upper bound (`unresolved_usd`)."""
        owned, sub = self.owned, self.sub
        row = self._row(outcome, status, u, cost, latency_s, at_bound)
        if self._held:
            owned.budget.settle(self._held.pop(), cost)
        else:
            owned.budget.record(cost)
        sub.prompt_tokens += u.prompt_tokens
        sub.completion_tokens += u.completion_tokens
        sub.cost_usd += cost
        swarm = owned.swarm
        swarm.prompt_tokens += u.prompt_tokens
        swarm.completion_tokens += u.completion_tokens
        swarm.gateway_calls += 1
        if at_bound:
            swarm.unresolved_usd += cost
        metrics.count_attempt(self.label, outcome, u.prompt_tokens, u.completion_tokens,
                              float(cost), latency_s, at_bound)
        return row


async def _settle_all(cap: SharedCap, held: list[Reservation], lost: Decimal) -> None:
    for reservation in held:
        await cap.settle(reservation, lost)
        lost = Decimal(0)
