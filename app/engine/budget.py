"""Hard spending caps: reserve the worst case before a call, settle to the real cost after."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Protocol


class BudgetExceeded(Exception):
    """A call's worst case does not fit and no call in flight can free anything."""

    def __init__(self, scope: str, needed: Decimal, left: Decimal) -> None:
        super().__init__(f"{scope} budget: call needs up to {needed} USD, {left} USD left")
        self.scope = scope
        self.needed = needed
        self.left = left


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
        while self.limit is not None and amount > self.left():
            if self._open == 0:
                raise BudgetExceeded("swarm", amount, self.left())
            await self._changed.wait()
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
