"""Hard spending caps: reserve the worst case before a call, settle to the real cost after."""

from __future__ import annotations

import asyncio
import functools
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import date
from decimal import Decimal
from typing import Protocol, TypeVar

from sqlalchemy.ext.asyncio import AsyncSession

from app import logs
from app.aio import run_to_end, woken
from app.db import spend
from app.db.changes import TenantSettle
from app.db.retry import in_transaction
from app.db.session import SessionFactory
from app.gateway.chat import AttemptRecord, Usage

log = logging.getLogger(__name__)
T = TypeVar("T")
_warned: set[tuple[str, str]] = set()  # (model, kind): a gateway's habit is logged once


def billable_usage(rec: AttemptRecord, prompt_bound: int, max_tokens: int, model: str) -> Usage:
    """What an attempt is billed: the usage the gateway reported, never above the two bounds
    its reservation was priced on (the prompt's bytes, a token being at least one; the
    request's max_tokens). A conforming gateway cannot bill more; one that says it did (a bug,
    a hostile answer, counts no column holds) would take a swarm past its budget and a tenant
    past its daily cap — so the cap stays hard, and the operator is told."""
    usage = rec.usage
    if rec.cut_short and not rec.usage_reported:
        usage = Usage(usage.prompt_tokens, max_tokens, usage.cached_tokens)
    usage = usage.within(prompt_bound, max_tokens)
    kind = "unreported" if not rec.usage_reported else "over" if usage != rec.usage else ""
    if kind and (model, kind) not in _warned:
        _warned.add((model, kind))
        if kind == "unreported":
            log.warning("gateway answered %s with no usable usage: billed its upper bound "
                        "(%d prompt, %d completion tokens); later ones are not logged",
                        model, usage.prompt_tokens, usage.completion_tokens)
        else:
            log.warning("gateway reported %d prompt and %d completion tokens for %s, above the "
                        "request's bounds (%d prompt, max_tokens %d): billed the bounds; later "
                        "ones are not logged", rec.usage.prompt_tokens,
                        rec.usage.completion_tokens, model, prompt_bound, max_tokens)
    return usage


class BudgetExceeded(Exception):
    """A call's worst case does not fit and no call in flight can free anything."""

    def __init__(self, scope: str, needed: Decimal, left: Decimal) -> None:
        self.scope = scope
        self.needed = needed
        self.left = left
        super().__init__(f"{scope} budget: call needs up to {needed} USD, {left} USD left"
                         if self.disclosed_left is not None else f"the service's daily budget "
                         f"cannot cover this call (it needs up to {needed} USD)")

    @property
    def disclosed_left(self) -> Decimal | None:
        """What is left, as a refusal may say it: not for the global daily cap, which is
        every tenant's (its remainder would tell one tenant what the others spent today)."""
        return None if self.scope == "daily" else self.left


@dataclass(eq=False)
class Reservation:
    amount: Decimal
    settled: bool = False


@dataclass
class SwarmBudget:
    """One swarm's money: spent (settled) + reserved (in flight) never exceeds the limit.

    The runner owns the swarm while it holds the lease, so this in-memory ledger is the
    authority for the swarm; every settlement is also written to the database ledger.
    """

    limit: Decimal | None
    spent: Decimal = Decimal(0)
    reserved: Decimal = Decimal(0)
    _open: int = 0
    # replaced on every settlement; waiters re-check after it is set (single event loop, so
    # the check and the wait happen without a yield in between)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    def left(self) -> Decimal:
        if self.limit is None:
            return Decimal("Infinity")
        return self.limit - self.spent - self.reserved

    async def reserve(self, amount: Decimal) -> Reservation:
        """Hold `amount`; wait while other calls may free money; raise when none can."""
        while (held := self.reserve_now(amount)) is None:
            if self._open == 0:
                raise BudgetExceeded("swarm", amount, self.left())
            await self._changed.wait()
        return held

    def reserve_now(self, amount: Decimal) -> Reservation | None:
        """Hold `amount` if it fits now (None: it does not)."""
        if self.limit is not None and amount > self.left():
            return None
        self.reserved += amount
        self._open += 1
        return Reservation(amount)

    def settle(self, reservation: Reservation, actual: Decimal) -> None:
        """Replace a reservation by what the call really cost (0 when it was never sent)."""
        if reservation.settled:
            return
        reservation.settled = True
        self.reserved -= reservation.amount
        self._open -= 1
        self.spent += actual
        self._changed.set()
        self._changed = asyncio.Event()

    def record(self, actual: Decimal) -> None:
        """Spend that had no reservation (settled by an earlier process before a takeover)."""
        self.spent += actual


class SharedCap(Protocol):
    """A cap shared beyond one swarm (the daily budget across processes): the same reserve /
    settle contract as SwarmBudget, but every operation is atomic in the database."""

    async def reserve(self, amount: Decimal) -> Reservation:
        """Hold `amount` or raise BudgetExceeded("daily") when it cannot fit."""
        ...

    async def settle(self, reservation: Reservation, actual: Decimal) -> None:
        """Replace the reservation by the real cost (0 when the call was never sent)."""
        ...

    async def settle_with_row(self, reservation: Reservation, actual: Decimal,
                              rides: Callable[[TenantSettle], None]) -> None:
        """`settle` for a call whose settled ledger row is about to be written: a settlement
        that can commit with that row (a tenant cap's) is handed to `rides`, before any wait,
        for the write that carries the row; the others are made here."""
        ...

    def held_ids(self) -> list[str]:
        """The ids of the reservations this cap holds (reserved, not settled yet)."""
        ...


class DailyCap:
    """SWARM_DAILY_BUDGET_USD across every swarm and process sharing one database.

    The state lives in `daily_spend` (settled per UTC day) and `daily_reservations` (worst
    cases of calls in flight); a reservation is granted in one transaction that holds the day's
    row lock, so concurrent processes can never promise the same dollar twice. A call that does
    not fit waits (short jittered polls: the money may be freed in another process) while any
    reservation of the day is live, and is refused with BudgetExceeded("daily") when none is.
    Reservations carry an expiry this object keeps pushing forward while their calls run, so
    those of a crashed process stop counting one lease after it died.
    """

    def __init__(self, sessions: SessionFactory, limit: Decimal, owner: str, *,
                 lease_s: float = 15.0, poll_s: tuple[float, float] = (0.05, 0.2)) -> None:
        self.sessions = sessions
        self.limit = limit
        self.owner = owner
        self.lease_s = lease_s
        self.poll_s = poll_s
        self._held: dict[Reservation, tuple[str, date]] = {}
        # one database operation of this process at a time (one pooled connection, not one per
        # waiting call): they all serialise on the day's row anyway
        self._lock = asyncio.Lock()
        self._refresher: asyncio.Task[None] | None = None
        self._settled = asyncio.Event()
        self._view: tuple[float, spend.DailyCheck] | None = None  # (loop time, last look)

    async def reserve(self, amount: Decimal) -> Reservation:
        """Hold `amount` for today, waiting while calls in flight may free money."""
        self._start_refresher()
        while True:
            async with self._lock:
                check = await self._look()
                if amount <= check.left or check.live == 0:
                    # it may fit, or we are about to refuse: only the locked check decides
                    check = await self._run(lambda s: spend.try_reserve_daily(
                        s, self.limit, amount, self.owner, self.lease_s))
                    self._view = None
            if check.reservation_id is not None:
                reservation = Reservation(amount)
                self._held[reservation] = (check.reservation_id, check.day)
                return reservation
            if check.live == 0:
                raise BudgetExceeded("daily", amount, max(check.left, Decimal(0)))
            # our own settlements wake us at once; other processes' are seen by polling
            await woken(self._settled, random.uniform(*self.poll_s))

    async def _look(self) -> spend.DailyCheck:
        """What is left today, read at most once per shortest poll by this process: many calls
        waiting here cost the database one cheap read, not one each."""
        now = asyncio.get_running_loop().time()
        if self._view is not None and now - self._view[0] <= self.poll_s[0]:
            return self._view[1]
        look = await self._run(lambda s: spend.peek_daily(s, self.limit))
        self._view = (now, look)
        return look

    async def settle(self, reservation: Reservation, actual: Decimal) -> None:
        """Drop the reservation and add the real cost to the day it was reserved on."""
        entry = self._held.pop(reservation, None)
        if reservation.settled or entry is None:
            return
        reservation.settled = True
        # to its end: money already spent reaches the table before a cancelled caller goes on
        await run_to_end(self._settle(*entry, actual))

    async def settle_with_row(self, reservation: Reservation, actual: Decimal,
                              rides: Callable[[TenantSettle], None]) -> None:
        """A transaction of its own (the global cap is not folded into the group commit)."""
        await self.settle(reservation, actual)

    async def _settle(self, reservation_id: str, day: date, actual: Decimal) -> None:
        async with self._lock:
            await self._run(lambda s: spend.settle_daily(s, reservation_id, day, actual))
        # wake this process's waiters (each waits on the event it saw, so set, then replace)
        self._view = None
        self._settled.set()
        self._settled = asyncio.Event()

    def held_ids(self) -> list[str]:
        return [rid for rid, _ in self._held.values()]

    async def close(self) -> None:
        """Stop refreshing (reservations still held then expire after one lease)."""
        if self._refresher is not None:
            self._refresher.cancel()
            await asyncio.gather(self._refresher, return_exceptions=True)
            self._refresher = None

    def _start_refresher(self) -> None:
        if self._refresher is None or self._refresher.done():
            # started by the first swarm that reserves: its lines are no swarm's
            self._refresher = asyncio.create_task(self._refresh_loop(), name="daily-cap-refresh",
                                                  context=logs.detached())

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self.lease_s / 3)
            ids = self.held_ids()
            if not ids:
                continue
            try:
                await self._run(functools.partial(spend.refresh_daily, reservation_ids=ids,
                                                  lease_s=self.lease_s))
            except Exception:
                log.exception("daily cap: refreshing %d reservations failed", len(ids))

    async def _run(self, op: Callable[[AsyncSession], Awaitable[T]]) -> T:
        """One transaction, retried on connection trouble for up to a lease (by then our
        reservations would have expired anyway)."""
        return await in_transaction(self.sessions, op, retry_for_s=self.lease_s)
