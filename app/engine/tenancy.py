"""What the engine enforces per tenant (SPEC §8): the tenant's daily cap, shared through the
database like the global one, and its gateway calls in flight in this process."""

from __future__ import annotations

import asyncio
import functools
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from decimal import Decimal
from typing import Any

from app import logs
from app.aio import run_to_end, woken
from app.db import batches, tenant_cap
from app.db.changes import TenantSettle
from app.db.retry import in_transaction
from app.db.session import SessionFactory
from app.db.spend import DailyCheck
from app.engine.budget import BudgetExceeded, Reservation, SharedCap
from app.tenants import TenantTable

log = logging.getLogger(__name__)


@dataclass(eq=False)
class _Op:
    """One reservation or settlement waiting for the next batch."""

    future: asyncio.Future[DailyCheck | None]
    amount: Decimal = Decimal(0)
    settle: tenant_cap.Settle | None = None


class TenantDailyCap:
    """One tenant's `daily_budget_usd` across every process: DailyCap's mechanism (a worst
    case reserved under the tenant's day row lock before each call, settled to the real cost
    after; a call that does not fit waits while any reservation of the tenant's day is live
    and is refused when none is; reservations expire one lease after a crash), with the
    operations of concurrent calls gathered into one transaction (a group commit), because
    every tenant has a cap by default and a transaction per call would bound throughput. A
    swarm's call settles in the engine's group commit instead, in the statement that writes
    its ledger row (`settle_with_row`): the spend and the row commit together or not at all.
    """

    def __init__(self, sessions: SessionFactory, tenant: str, limit: Decimal, owner: str, *,
                 lease_s: float = 15.0, poll_s: tuple[float, float] = (0.05, 0.2)) -> None:
        self.sessions = sessions
        self.tenant = tenant
        self.limit = limit
        self.owner = owner
        self.lease_s = lease_s
        self.poll_s = poll_s
        self._held: dict[Reservation, tuple[str, date]] = {}
        # settled in a write of the group commit whose outcome is not known yet, by id
        self._riding: dict[str, Reservation] = {}
        self._queue: list[_Op] = []
        self._wake = asyncio.Event()
        self._settled = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def reserve(self, amount: Decimal) -> Reservation:
        """Hold `amount` for today, waiting while calls in flight may free money."""
        while True:
            check = await self._submit(_Op(self._future(), amount=amount))
            assert check is not None
            if check.reservation_id is not None:
                return self.held(check.reservation_id, check.day, amount)
            if check.live == 0:
                raise BudgetExceeded("tenant", amount, max(check.left, Decimal(0)))
            # our own settlements wake us at once; other processes' are seen by polling
            settled = self._settled
            await woken(settled, random.uniform(*self.poll_s))

    def ask(self, rows: list[dict[str, Any]]) -> tenant_cap.CapAsk:
        """A reservation of each written-ahead ledger row's worst case (`reserved_usd`, by its
        key) for another statement to make in this cap's name (a swarm's creation): `held`
        takes them on."""
        return tenant_cap.CapAsk(self.tenant, self.limit, self.owner, self.lease_s,
                             tuple(row["reserved_usd"] for row in rows),
                             tuple(row["idempotency_key"] for row in rows))

    def held(self, reservation_id: str, day: date, amount: Decimal) -> Reservation:
        """A reservation made for `amount` (by `reserve`, or in another statement from `ask`),
        held (refreshed, settled) as this cap's own."""
        reservation = Reservation(amount)
        self._held[reservation] = (reservation_id, day)
        self._start()
        return reservation

    async def settle(self, reservation: Reservation, actual: Decimal) -> None:
        """Drop the reservation and add the real cost to the day it was reserved on."""
        entry = self._held.pop(reservation, None)
        if reservation.settled or entry is None:
            return
        reservation.settled = True
        await self._settle_alone(tenant_cap.Settle(entry[0], entry[1], actual))

    async def settle_with_row(self, reservation: Reservation, actual: Decimal,
                              rides: Callable[[TenantSettle], None]) -> None:
        """`settle` in the group commit that writes the call's ledger row: the settlement is
        handed to `rides` for that write (`SwarmJournal.with_row`), with no wait and no round
        trip of its own. The reservation stays held, and refreshed, until the commit's
        outcome is told (`settled`)."""
        entry = self._held.get(reservation)
        if reservation.settled or entry is None:
            return
        reservation.settled = True
        self._riding[entry[0]] = reservation
        rides(TenantSettle(self.tenant, entry[0], entry[1], actual))

    def settled(self, reservation_id: str) -> None:
        """The write that carried a settlement was stored (the reservation is gone, its cost
        spent), or never will be (its swarm's lease lost: the reservation then holds its
        worst case for the rest of its day, as a dead owner's does, which is what the next
        owner bills the attempt's row at): not held any more either way."""
        reservation = self._riding.pop(reservation_id, None)
        if reservation is not None:
            self._held.pop(reservation, None)
        self._settled.set()
        self._settled = asyncio.Event()

    async def settle_unwritten(self, ts: TenantSettle) -> None:
        """A settlement handed to `rides` whose row no write took (its call's result was
        dropped): made in the cap's own batch, so none is left held."""
        reservation = self._riding.pop(ts.reservation_id, None)
        if reservation is None:
            return
        self._held.pop(reservation, None)
        await self._settle_alone(tenant_cap.Settle(ts.reservation_id, ts.day, ts.actual))

    async def _settle_alone(self, settle: tenant_cap.Settle) -> None:
        # to its end: money already spent reaches the table before a cancelled caller goes on
        await run_to_end(self._submit(_Op(self._future(), settle=settle)))
        self._settled.set()
        self._settled = asyncio.Event()

    def held_ids(self) -> list[str]:
        return [rid for rid, _ in self._held.values()]

    async def close(self) -> None:
        """Stop the batcher and the refresher (reservations still held expire after a lease)."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        queued, self._queue = self._queue, []
        _fail(queued, RuntimeError("tenant cap closed"))

    def _future(self) -> asyncio.Future[DailyCheck | None]:
        return asyncio.get_running_loop().create_future()

    def _start(self) -> None:
        if not self._tasks:
            # started by the first swarm or request that needs them, they serve every other
            self._tasks = [asyncio.create_task(self._batches(), name="tenant-cap-batches",
                                               context=logs.detached()),
                           asyncio.create_task(self._refresh_loop(), name="tenant-cap-refresh",
                                               context=logs.detached())]

    async def _submit(self, op: _Op) -> DailyCheck | None:
        self._start()
        self._queue.append(op)
        self._wake.set()
        return await op.future

    async def _batches(self) -> None:
        """One transaction at a time; whatever queued meanwhile goes into the next one."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch, self._queue = self._queue, []
            if not batch:
                continue
            reserves = [op for op in batch if op.settle is None]
            settles = [op.settle for op in batch if op.settle is not None]
            try:
                checks = await self._apply([op.amount for op in reserves], settles)
            except BaseException as exc:  # each caller sees the failure (as with DailyCap)
                # stopped (close) mid-batch too: a settlement waits for its op to end
                # (run_to_end), so none may be left waiting on a batcher that is gone
                _fail(batch, exc if isinstance(exc, Exception)
                      else RuntimeError("tenant cap closed"))
                if not isinstance(exc, Exception):
                    raise
                continue
            for op, check in zip(reserves, checks, strict=True):
                if not op.future.done():
                    op.future.set_result(check)
                elif check.reservation_id is not None:  # its caller was cancelled meanwhile
                    self._release(check)
            for op in batch:
                if not op.future.done():
                    op.future.set_result(None)

    def _release(self, check: DailyCheck) -> None:
        """Free a reservation granted to nobody (its caller gone): in the next batch."""
        fut = self._future()
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())  # nobody awaits it
        self._queue.append(_Op(fut, settle=tenant_cap.Settle(check.reservation_id or "",
                                                             check.day, Decimal(0))))
        self._wake.set()

    async def _apply(self, reserves: list[Decimal], settles: list[tenant_cap.Settle]
                     ) -> list[DailyCheck]:
        """One batch, retried while the database is unavailable (a retry of a batch whose
        answer was lost settles nothing twice)."""
        return await batches.apply_tenant_ops(self.sessions, self.tenant, self.limit, reserves,
                                              settles, self.owner, self.lease_s)

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self.lease_s / 3)
            ids = self.held_ids()
            if not ids:
                continue
            try:
                await in_transaction(self.sessions, functools.partial(
                    tenant_cap.refresh_tenant, reservation_ids=ids, lease_s=self.lease_s),
                    retry_for_s=self.lease_s)
            except Exception:
                log.exception("tenant cap %s: refreshing %d reservations failed", self.tenant,
                              len(ids))


def _fail(ops: list[_Op], exc: Exception) -> None:
    for op in ops:
        if not op.future.done():
            op.future.set_exception(exc)


class BothCaps:
    """The global cap, then the tenant's: a call runs only when both hold its worst case
    (a refusal by the second frees the first's hold at once)."""

    def __init__(self, first: SharedCap, second: SharedCap) -> None:
        self.first = first
        self.second = second
        self._pairs: dict[Reservation, tuple[Reservation, Reservation]] = {}

    async def reserve(self, amount: Decimal) -> Reservation:
        a = await self.first.reserve(amount)
        try:
            b = await self.second.reserve(amount)
        except BaseException:
            await run_to_end(self.first.settle(a, Decimal(0)))
            raise
        both = Reservation(amount)
        self._pairs[both] = (a, b)
        return both

    def held_ids(self) -> list[str]:
        return [*self.first.held_ids(), *self.second.held_ids()]

    async def settle(self, reservation: Reservation, actual: Decimal) -> None:
        pair = self._pairs.pop(reservation, None)
        if pair is None or reservation.settled:
            return
        reservation.settled = True
        # to its end, as DailyCap.settle: spend already made reaches both tables
        await run_to_end(self._settle_both(pair, actual))

    async def _settle_both(self, pair: tuple[Reservation, Reservation], actual: Decimal) -> None:
        try:
            await self.first.settle(pair[0], actual)
        finally:
            await self.second.settle(pair[1], actual)

    async def settle_with_row(self, reservation: Reservation, actual: Decimal,
                              rides: Callable[[TenantSettle], None]) -> None:
        """The tenant's settlement rides the ledger row's commit (handed over first, with no
        wait); the global cap's is its own transaction, run to its end."""
        pair = self._pairs.pop(reservation, None)
        if pair is None or reservation.settled:
            return
        reservation.settled = True
        try:
            await self.second.settle_with_row(pair[1], actual, rides)
        finally:
            await run_to_end(self.first.settle(pair[0], actual))


class TenantGates:
    """This process's per-tenant limits on the engine side: a semaphore of
    `max_inflight_calls` per tenant, and one TenantDailyCap per tenant with a daily budget
    (made on first use, kept for the process's life: tenants are few)."""

    def __init__(self, table: TenantTable, sessions: SessionFactory, owner: str,
                 lease_s: float, global_cap: SharedCap | None = None) -> None:
        self.table = table
        self.sessions = sessions
        self.owner = owner
        self.lease_s = lease_s
        self.global_cap = global_cap
        self._slots: dict[str, asyncio.Semaphore] = {}
        self._caps: dict[str, TenantDailyCap] = {}
        self._combined: dict[str, SharedCap] = {}

    def slot(self, tenant: str) -> asyncio.Semaphore | None:
        """The tenant's in-flight slot in this process (None when unlimited)."""
        limit = self.table.limits(tenant).max_inflight_calls
        if limit is None:
            return None
        sem = self._slots.get(tenant)
        if sem is None:
            sem = self._slots[tenant] = asyncio.Semaphore(limit)
        return sem

    def cap(self, tenant: str) -> SharedCap | None:
        """What a call of this tenant reserves against: the global cap and/or the tenant's."""
        if tenant in self._combined:
            return self._combined[tenant]
        limit = self.table.limits(tenant).daily_budget_usd
        own: SharedCap | None = None
        if limit is not None:
            own = self._caps[tenant] = TenantDailyCap(self.sessions, tenant, limit, self.owner,
                                                      lease_s=self.lease_s)
        combined = (own if self.global_cap is None
                    else self.global_cap if own is None
                    else BothCaps(self.global_cap, own))
        if combined is not None:
            self._combined[tenant] = combined
        return combined

    def held_ids(self) -> list[str]:
        """The reservations every tenant cap of this process holds."""
        return [rid for cap in self._caps.values() for rid in cap.held_ids()]

    def settled(self, settles: list[TenantSettle], stored: bool) -> None:
        """The group commit's word on settlements a write carried (`StateWriter`'s
        `on_settled`): stored with it, or never."""
        if not stored:
            log.warning("%d tenant cap settlements not stored with their swarm's write (its "
                        "lease lost): their reservations hold their worst case today",
                        len(settles))
        for ts in settles:
            if (cap := self._caps.get(ts.tenant)) is not None:
                cap.settled(ts.reservation_id)

    async def settle_unwritten(self, settles: list[TenantSettle]) -> None:
        """Settlements whose rows no write took, each in its cap's own batch."""
        for ts in settles:
            if (cap := self._caps.get(ts.tenant)) is not None:
                await cap.settle_unwritten(ts)

    async def close(self) -> None:
        """Stop refreshing every tenant cap's reservations."""
        await asyncio.gather(*(c.close() for c in self._caps.values()))


