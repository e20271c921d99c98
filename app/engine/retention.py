"""The retention period (SPEC §16): which ended swarms are old enough to erase, the sweep every
process runs (one at a time across replicas, in small batches, each its own short transaction)
and the `swarm-api prune` passes over the same rules."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import re
from datetime import timedelta

from app import metrics
from app.config import Settings
from app.db import erase
from app.db.erase import Rule
from app.db.retry import log_db_failure
from app.db.session import SessionFactory

log = logging.getLogger(__name__)
_DURATION = re.compile(r"(\d{1,9})([smhd])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(value: str) -> timedelta:
    """`<n>s|m|h|d` (30d, 12h, 90m, 45s) as a timedelta; ValueError otherwise."""
    m = _DURATION.fullmatch(value.strip())
    if m is None:
        raise ValueError(f"{value!r} is not a duration: <n>s|m|h|d, such as 30d or 12h")
    return timedelta(seconds=int(m.group(1)) * _UNIT_S[m.group(2)])


def retention_rules(settings: Settings) -> list[Rule]:
    """The rules in force: each tenant of the tenants file with its `retention_days` (else
    SWARM_RETENTION_DAYS), every other tenant with the defaults' (else the global one).
    Empty: nothing is ever erased for age."""
    table = settings.tenants
    named = tuple(sorted(table.tenants))
    by_days: dict[float, list[str]] = {}
    for name in named:
        days = table.tenants[name].retention_days or settings.retention_days
        if days is not None:
            by_days.setdefault(days, []).append(name)
    rules = [Rule(timedelta(days=days), tenants=tuple(names))
             for days, names in sorted(by_days.items())]
    others = table.defaults.retention_days or settings.retention_days
    if others is not None:
        rules.append(Rule(timedelta(days=others), except_tenants=named))
    return rules


async def erase_all(sessions: SessionFactory, rules: list[Rule], batch: int, *,
                    sweep: bool) -> int:
    """Erase every swarm the rules name, `batch` a transaction, until none is left. A `sweep`
    runs only while no other process's sweep does (else it stops, for the next round) and
    leaves rows other transactions hold to a later round; `prune` waits for them."""
    total = 0
    while rules:
        async with sessions() as session, session.begin():
            if sweep and not await erase.sweep_lock(session):
                break
            n = await erase.erase_batch(session, rules, batch, skip_locked=sweep)
        if not n:
            break
        total += n
        if sweep:
            metrics.erased_swarms.labels("retention").inc(n)
        await asyncio.sleep(0)  # between batches, the loop's other work goes first
    return total


class RetentionSweep:
    """Every SWARM_RETENTION_SWEEP_S (jittered), erase the swarms past their retention."""

    def __init__(self, settings: Settings, sessions: SessionFactory) -> None:
        self.settings = settings
        self.sessions = sessions
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="retention sweep")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def run_once(self) -> int:
        """One round: every rule in force now (the tenants file may have changed)."""
        n = await erase_all(self.sessions, retention_rules(self.settings),
                            self.settings.retention_batch, sweep=True)
        if n:
            log.info("retention: %d swarms erased", n, extra={"erased": n})
        return n

    async def _loop(self) -> None:
        period = self.settings.retention_sweep_s
        while True:
            # replicas started together spread their rounds out
            await asyncio.sleep(period * (0.5 + random.random()))
            try:
                await self.run_once()
            except Exception as exc:
                log_db_failure(log, "retention sweep", exc, "the next round retries")
