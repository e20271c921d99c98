"""Admission of requests by the caller's tenant quotas (SPEC §8), as route dependencies.

- `RateLimitDep`: one token of the tenant's bucket (shared by every replica through the
  database) and a tenant whose daily cap is spent is refused; for routes that call the gateway
  (the facade: a passthrough call, or `agent_swarm`, whose insert then counts
  `max_active_swarms` through `counting_in()`).
- `AdmissionInInsertDep`: the same plus `max_active_swarms`, run by the route inside its
  insert's transaction (`check_in`, a per-tenant lock held to the commit so concurrent
  creations cannot all count before any inserts), first in the transaction, as every
  creation's lock order: `POST /swarms` and `POST /swarms/{id}/retry` are one transaction
  each (on PostgreSQL `POST /swarms` checks in its one statement: `tenant_admit`, first
  too). Its `swarm(body)` then applies the
  body's quotas (`max_agents`, `max_budget_usd`, `default_budget_usd`).
- `WaitSlotDep` / `StreamSlotDep`: a `max_streams` slot for `?wait=` and SSE readers.

They run before the route stores anything, in one transaction of their own (or, with
`check_in`, in the route's insert transaction): a refusal rolls back the token it took, so a
refused request leaves no trace but the metric.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from datetime import datetime
from decimal import Decimal
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.ext.asyncio import AsyncSession

from app import metrics
from app.api.deps import SessionDep, SettingsDep, TenantDep
from app.db import quotas, tenant_cap
from app.db.dialect import dialect_of, engine_of
from app.errors import RequestInvalid, TooManyRequests
from app.schemas import SwarmCreate
from app.tenants import TenantLimits

ACTIVE_RETRY_S = 5  # a swarm of the tenant has to finish: seconds, not milliseconds
AGENTS_RETRY_S = 60  # only a raised limit admits it
STREAMS_RETRY_S = 1


def _refuse(limit: str, message: str, retry_after_s: float, code: str = "quota_exceeded",
            **details: object) -> TooManyRequests:
    metrics.quota_denials.labels(limit).inc()
    return TooManyRequests(message, limit=limit, retry_after_s=retry_after_s, code=code,
                           **details)


@dataclass(frozen=True, slots=True)
class Admission:
    """A request let in: the tenant, its limits, and the checks that need the body."""

    tenant: str
    limits: TenantLimits
    max_agents: int  # SWARM_MAX_AGENTS
    checked: bool = True  # the dependency took the token (else the route's `check_in` does)
    count_only: bool = False  # `check_in` counts the active swarms only (the token is taken)

    def counting_in(self) -> Admission:
        """This admission (RateLimitDep's: the bucket and the daily cap checked) for a route
        that turns out to create a swarm (the facade's `agent_swarm`): its `check_in` counts
        `max_active_swarms` in the insert's transaction, and takes no second token."""
        return replace(self, checked=False, count_only=True)

    @property
    def checks_in(self) -> bool:
        """Whether `check_in` has anything to check (else the insert needs no transaction
        around it)."""
        if self.checked:
            return False
        if self.count_only:
            return self.limits.max_active_swarms is not None
        return not _nothing_to_check(self.limits, count_swarms=True)

    async def check_in(self, session: AsyncSession) -> None:
        """The bucket, `max_active_swarms` and the daily cap inside the caller's transaction,
        before it inserts its swarm: a refusal rolls the transaction back with the token, and
        the bucket's row lock (or the tenant's count lock) is held from here to the commit.
        First, because it is every creation's lock order (`tenant_admit` in the creation's
        statement takes it before the rows too; two orders deadlocked). Only the count for a
        `counting_in()` admission; nothing when the dependency already admitted the request."""
        if not self.checks_in:
            return
        if self.count_only:
            await _count_in(session, self.tenant, self.limits)
        else:
            await _checks(session, self.tenant, self.limits, count_swarms=True)

    @property
    def in_statement(self) -> bool:
        """Whether the creation's one statement can run `check_in`'s checks (PostgreSQL's
        `tenant_admit`, `statement_checks`): all of them but a `counting_in()` count, which
        locks what the facade's own token took."""
        return not (self.count_only and self.checks_in)

    def statement_checks(self) -> quotas.Admit | None:
        """`check_in`'s checks for the creation's statement (None: nothing to check)."""
        if not self.checks_in:
            return None
        assert not self.count_only
        return _admit_of(self.tenant, self.limits, count_swarms=True)

    def refusal(self, refused: quotas.Refused) -> TooManyRequests:
        """The 429 `check_in` would have raised for what the statement refused."""
        return _refusal(refused, self.limits)

    def check_budget(self, budget: Decimal | str | None) -> None:
        """422 for a `limits.budget_usd` above the tenant's `max_budget_usd`."""
        top = self.limits.max_budget_usd
        if budget is not None and top is not None and Decimal(budget) > top:
            metrics.quota_denials.labels("max_budget_usd").inc()
            raise RequestInvalid(
                f"limits.budget_usd {budget} is above this tenant's maximum of {top} USD",
                code="budget_too_large",
                details={"field": "limits.budget_usd", "limit": "max_budget_usd",
                         "max": str(top)})

    def swarm(self, body: SwarmCreate) -> SwarmCreate:
        """The body within the tenant's quotas: agents (429), budget (422); a swarm that
        names no budget gets `default_budget_usd`."""
        agents_limit = self.limits.agents_limit(self.max_agents)
        if self.limits.max_agents is not None and agents_limit < self.max_agents:
            planned = body.agents is None
            asked = (len(body.agents) if body.agents is not None
                     else body.orchestrator.max_subtasks)
            if asked > agents_limit and (not planned or
                                         "max_subtasks" in body.orchestrator.model_fields_set):
                field = "orchestrator.max_subtasks" if planned else "agents"
                raise _refuse("max_agents", f"{asked} subtasks; this tenant may run at most "
                              f"{agents_limit} in one swarm", AGENTS_RETRY_S,
                              field=field, max=agents_limit, count=asked)
            if planned and asked > agents_limit:  # the default plan size, within the quota
                body = body.model_copy(update={"orchestrator": body.orchestrator.model_copy(
                    update={"max_subtasks": agents_limit})})
        budget = body.limits.budget_usd
        self.check_budget(budget)
        if budget is None and self.limits.default_budget_usd is not None:
            limits = body.limits.model_copy(
                update={"budget_usd": self.limits.default_budget_usd})
            body = body.model_copy(update={"limits": limits})
        return body


def _admit_of(tenant: str, limits: TenantLimits, count_swarms: bool) -> quotas.Admit:
    """`_checks`' checks as `tenant_admit`'s arguments (PostgreSQL)."""
    return quotas.Admit(tenant, limits.bucket_size, limits.refill_per_s,
                        limits.max_active_swarms if count_swarms else None,
                        limits.daily_budget_usd)


def _refusal(refused: quotas.Refused, limits: TenantLimits) -> TooManyRequests:
    """The 429 `_checks` raises, for what `tenant_admit` refused."""
    if refused.limit == "requests_per_minute":
        return _refuse_rate(refused.wait_s, limits)
    if refused.limit == "max_active_swarms":
        return _refuse_active(refused.active, limits)
    return _refuse_daily(refused.spent, refused.now, limits)


def _refuse_rate(wait_s: float, limits: TenantLimits) -> TooManyRequests:
    assert limits.bucket_size is not None
    return _refuse("requests_per_minute", f"over {limits.requests_per_minute:g} requests per "
                   "minute", wait_s, code="rate_limited",
                   requests_per_minute=limits.requests_per_minute, burst=int(limits.bucket_size))


def _refuse_active(active: int, limits: TenantLimits) -> TooManyRequests:
    return _refuse("max_active_swarms",
                   f"{active} swarms active; the limit is {limits.max_active_swarms}",
                   ACTIVE_RETRY_S, max=limits.max_active_swarms, count=active)


def _refuse_daily(spent: Decimal, now: datetime, limits: TenantLimits) -> TooManyRequests:
    cap = limits.daily_budget_usd
    return _refuse("daily_budget_usd", f"today's budget of {cap} USD is spent",
                   tenant_cap.seconds_to_midnight(now), max=str(cap), spent=str(spent))


def _check_active(active: int, limits: TenantLimits) -> None:
    assert limits.max_active_swarms is not None
    if active >= limits.max_active_swarms:
        raise _refuse_active(active, limits)


def _nothing_to_check(limits: TenantLimits, count_swarms: bool) -> bool:
    return (limits.refill_per_s is None and limits.daily_budget_usd is None
            and not (count_swarms and limits.max_active_swarms is not None))


async def _checks(session: AsyncSession, tenant: str, limits: TenantLimits,
                  count_swarms: bool) -> None:
    """The bucket, the active swarms and the daily cap, in the caller's transaction."""
    lock = limits.admission_lock(counts=count_swarms)
    if lock == "bucket":
        size, rate = limits.bucket_size, limits.refill_per_s
        assert size is not None and rate is not None
        # first: the row lock serialises this tenant's admissions across replicas
        wait = await quotas.take_token(session, tenant, size, rate)
        if wait is not None:
            raise _refuse_rate(wait, limits)
    count = count_swarms and limits.max_active_swarms is not None
    cap = limits.daily_budget_usd
    if not (count or cap is not None):
        return
    if lock == "count":  # no bucket row locked: the count's own lock
        await quotas.lock_active(session, tenant, bucket=False)
    # after the token (or the lock): it makes this read see the swarms its last holder
    # inserted (a read in the token's statement would have the snapshot before the wait)
    state = await quotas.tenant_now(session, tenant, count=count, spent=cap is not None)
    if count:
        _check_active(state.active, limits)
    if cap is not None and state.spent >= cap:
        raise _refuse_daily(state.spent, state.now, limits)


async def _count_in(session: AsyncSession, tenant: str, limits: TenantLimits) -> None:
    """`max_active_swarms` alone in the caller's transaction, before it inserts its swarm, for
    a request whose token was taken in a transaction of its own: the lock `_checks` holds
    for the count (the bucket's row when the tenant has a bucket) is taken here."""
    await quotas.lock_active(session, tenant, bucket=limits.admission_lock() == "bucket")
    state = await quotas.tenant_now(session, tenant, count=True, spent=False)
    _check_active(state.active, limits)


async def _admit(session: AsyncSession, tenant: str, limits: TenantLimits,
                 count_swarms: bool) -> None:
    if _nothing_to_check(limits, count_swarms):
        return  # nothing to check: no transaction either
    if dialect_of(session).admits_in_the_insert:  # tenant_admit alone: one round trip, no ORM
        try:
            await quotas.admit_alone(engine_of(session),
                                     _admit_of(tenant, limits, count_swarms))
        except quotas.Refused as refused:
            raise _refusal(refused, limits) from None
        return
    async with session.begin():
        await _checks(session, tenant, limits, count_swarms)


async def rate_limit(session: SessionDep, tenant: TenantDep,
                     settings: SettingsDep) -> Admission:
    """The bucket and the daily cap (429); nothing else."""
    limits = settings.tenant_limits(tenant)
    await _admit(session, tenant, limits, count_swarms=False)
    return Admission(tenant, limits, settings.max_agents)


# ---- readers: ?wait= and event streams ------------------------------------------------------


class StreamSlots:
    """Open SSE streams and ?wait= requests per tenant in this process (`max_streams`): each
    holds a connection and a task here for up to minutes."""

    def __init__(self) -> None:
        self.open: dict[str, int] = {}

    def take(self, tenant: str, limit: int | None) -> Slot:
        held = self.open.get(tenant, 0)
        if limit is not None and held >= limit:
            raise _refuse("max_streams", f"{held} streams open; the limit is {limit}",
                          STREAMS_RETRY_S, max=limit)
        self.open[tenant] = held + 1
        return Slot(self, tenant)


class Slot:
    """One held stream slot; `release()` is idempotent (the stream's end and the response's
    end may both call it)."""

    def __init__(self, slots: StreamSlots, tenant: str) -> None:
        self._slots = slots
        self._tenant = tenant
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            left = self._slots.open.get(self._tenant, 1) - 1
            if left > 0:
                self._slots.open[self._tenant] = left
            else:
                self._slots.open.pop(self._tenant, None)


def stream_slots(request: Request) -> StreamSlots:
    slots: StreamSlots = request.app.state.stream_slots
    return slots


def _waits(request: Request) -> bool:
    """Whether `?wait=` asks to hold the request (a malformed value is the route's 422)."""
    try:
        value = float(request.query_params.get("wait") or 0)
    except ValueError:
        return False
    return math.isfinite(value) and value > 0


async def wait_slot(request: Request, tenant: TenantDep,
                    settings: SettingsDep) -> AsyncIterator[None]:
    """A stream slot for as long as a `?wait=` request is held (none without `wait`)."""
    if not _waits(request):
        yield
        return
    slot = stream_slots(request).take(tenant, settings.tenant_limits(tenant).max_streams)
    try:
        yield
    finally:
        slot.release()


@dataclass(frozen=True, slots=True)
class StreamGate:
    """Takes a tenant's stream slot once the route knows it will stream (after its checks)."""

    slots: StreamSlots
    tenant: str
    limit: int | None

    def take(self) -> Slot:
        return self.slots.take(self.tenant, self.limit)


async def stream_gate(request: Request, tenant: TenantDep,
                      settings: SettingsDep) -> StreamGate:
    return StreamGate(stream_slots(request), tenant, settings.tenant_limits(tenant).max_streams)


async def admit_in_insert(tenant: TenantDep, settings: SettingsDep) -> Admission:
    """For a route that runs `Admission.check_in` in its own insert's transaction: nothing
    here (no transaction of its own; a replayed Idempotency-Key never gets that far)."""
    return Admission(tenant, settings.tenant_limits(tenant), settings.max_agents,
                     checked=False)


AdmissionInInsertDep = Annotated[Admission, Depends(admit_in_insert)]
RateLimitDep = Annotated[Admission, Depends(rate_limit)]
WaitSlotDep = Annotated[None, Depends(wait_slot)]
StreamGateDep = Annotated[StreamGate, Depends(stream_gate)]
