"""What happened to one swarm, queued for the group commit (`StateWriter`): its state changes,
ledger rows and events as one `SwarmWrite` per write, fenced by the lease epoch; a wave's starts
batched into one write; the last result held for the end's commit."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from app.db.base import column_values
from app.db.changes import SwarmWrite, TenantSettle
from app.db.columns import SUBTASK_STATE_COLUMNS, SWARM_STATE_COLUMNS
from app.db.create import insert_row
from app.db.tables import Subtask, Swarm
from app.db.types import utcnow
from app.engine.budget import SwarmBudget
from app.engine.finish import event_row
from app.engine.owned_swarm import EngineContext, EventRow, LedgerRow, ToolRows, WebhookRow
from app.engine.writer import WriteRejected, retrieve_exception
from app.states import UNANSWERED, AttemptOutcome, Event

# the runner's log: a refused held result is a line of the swarm's run
log = logging.getLogger("app.engine.runner")


class SwarmJournal:
    """One swarm's writes while this process holds its lease (the runner's, by composition)."""

    def __init__(self, ctx: EngineContext, swarm: Swarm, epoch: int,
                 budget: SwarmBudget) -> None:
        self.ctx = ctx
        self.swarm = swarm
        self.epoch = epoch
        self.budget = budget
        # the swarm's last result (synthesizer's or last worker's), written with its end
        self._with_end: tuple[list[Subtask], list[LedgerRow], list[EventRow]] = ([], [], [])
        # subtasks started since the last write, and their events (`started`)
        self._starting: tuple[list[Subtask], list[EventRow]] = ([], [])
        # tenant cap settlements waiting for the write of the ledger row they settle, by the
        # row's (idempotency_key, attempt) (`with_row`)
        self._settles: dict[tuple[str, int], list[TenantSettle]] = {}

    def event(self, event: Event) -> EventRow:
        return event_row(self.swarm, event, utcnow())

    def write(self, subs: Sequence[Subtask], ledger: Sequence[LedgerRow],
               events: Sequence[EventRow], new: Sequence[Subtask],
               webhook: WebhookRow | None = None, tools: ToolRows | None = None,
               linger: bool = False, meanwhile: Callable[[], None] | None = None
               ) -> asyncio.Future[None]:
        if self._starting[0]:  # they come first: their events' numbers are lower
            (starting, begun), self._starting = self._starting, ([], [])
            subs = [*(sub for sub in starting if sub not in subs), *subs]
            events = [*begun, *events]
        s = self.swarm
        s.spent_usd, s.reserved_usd = self.budget.spent, self.budget.reserved
        if any(row["outcome"] not in UNANSWERED for row in ledger):
            s.settled_epoch = self.epoch  # progress: the next takeover is not fruitless
        settles = ([ts for row in ledger if row["outcome"] != AttemptOutcome.in_flight
                    for ts in self._settles.pop((row["idempotency_key"], row["attempt"]), ())]
                   if self._settles else [])
        return self.ctx.writer.submit(SwarmWrite(
            s.id, self.epoch, column_values(s, SWARM_STATE_COLUMNS),
            [{"name_": sub.name, "position_": sub.position,
              **column_values(sub, SUBTASK_STATE_COLUMNS)} for sub in subs],
            list(ledger), list(events), [insert_row(n) for n in new], webhook,
            *(tools or ([], [])), settles), linger=linger, meanwhile=meanwhile)

    def with_row(self, row: LedgerRow, settles: Sequence[TenantSettle]) -> None:
        """Tenant cap settlements of the call `row` records (`SharedCap.settle_with_row`):
        they go with the first write that carries the row, into its commit."""
        if settles:
            self._settles.setdefault((row["idempotency_key"], row["attempt"]), []).extend(
                settles)

    def unwritten(self) -> list[TenantSettle]:
        """The settlements whose rows no write took (taken: the caller makes them)."""
        left, self._settles = self._settles, {}
        return [ts for each in left.values() for ts in each]

    async def commit(self, subs: Sequence[Subtask] = (), ledger: Sequence[LedgerRow] = (),
                     events: Sequence[EventRow] = (), new: Sequence[Subtask] = (),
                     webhook: WebhookRow | None = None, tools: ToolRows | None = None,
                     meanwhile: Callable[[], None] | None = None) -> None:
        """Write and wait until durable (raises LeaseLost when fenced out); `meanwhile`: CPU
        work done while its statement runs (`StateWriter.submit`)."""
        await self.write(subs, ledger, events, new, webhook, tools, meanwhile=meanwhile)

    def submit(self, ledger: Sequence[LedgerRow]) -> asyncio.Future[None]:
        """Queue ledger rows now; the future resolves once they are durable."""
        return self.write((), ledger, (), ())

    def queue(self, subs: Sequence[Subtask], events: Sequence[EventRow]) -> asyncio.Future[None]:
        """Queue a write now for the next commit; the future resolves once it is durable."""
        return self.write(subs, (), events, ())

    def commit_soon(self, subs: Sequence[Subtask] = (), ledger: Sequence[LedgerRow] = (),
                    events: Sequence[EventRow] = (), tools: ToolRows | None = None) -> None:
        """Queue a write nobody waits for (a later awaited write of this swarm commits after it);
        without money in it, it may wait for the next awaited write (writer.LINGER_S)."""
        self.write(subs, ledger, events, (), tools=tools, linger=not ledger and not tools
                    ).add_done_callback(retrieve_exception)

    def started(self, sub: Subtask, event: EventRow) -> None:
        """A subtask's start (its event numbered), written with this swarm's next write: at
        the latest one loop turn later (`commit_soon`). The tasks of a wave all run in that
        turn, so their starts make one write after their sends, not a write each before
        them (~50 us of the CPU before each of a 100-agent fan-out's sends)."""
        subs, events = self._starting
        batched = self.ctx.settings.latency_devices
        if not subs and batched:
            asyncio.get_running_loop().call_soon(self._write_starts)
        subs.append(sub)
        events.append(event)
        if not batched:  # a write of its own, queued before the send
            self.commit_soon()

    def _write_starts(self) -> None:
        if self._starting[0]:  # not taken by a write meanwhile
            self.commit_soon()

    def write_with_end(self, subs: Sequence[Subtask], ledger: Sequence[LedgerRow],
                       events: Sequence[EventRow]) -> None:
        """Hold a write for the swarm's end commit: its last result (the synthesizer's, or
        the last worker's without one), after which nothing else of the swarm is written
        (its events' numbers come before the end's) and the end follows at once. A drain
        writes it alone."""
        held = self._with_end
        held[0].extend(subs)
        held[1].extend(ledger)
        held[2].extend(events)

    def take_held(self) -> tuple[list[Subtask], list[LedgerRow], list[EventRow]]:
        held, self._with_end = self._with_end, ([], [], [])
        return held

    async def write_held(self) -> None:
        subs, ledger, events = self.take_held()
        if subs or ledger or events:
            try:
                await self.commit(subs, ledger, events)
            except WriteRejected:  # its money is stored; the next owner runs it again
                log.warning("swarm %s: a result held for the end was refused", self.swarm.id)
