"""Passthrough attempts are written ahead like a swarm's: `in_flight` before they are sent
(not yet spend), settled by their answer, `unknown` at their reservation when the answer is
lost — cut off by a cancelled request, or left by a process that died."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import select

from app.db import spend
from app.db.session import SessionFactory, make_db_engine, make_session_factory
from app.db.tables import DailySpend, GatewayCall
from app.engine.budget import BudgetExceeded, DailyCap
from app.engine.context import TOOLS_OVERHEAD_TOKENS
from app.engine.passthrough import PassthroughMeter, prompt_bound, settle_stale
from app.gateway.chat import AttemptRecord, Usage
from app.pricing import BUILTIN_MODELS

PRICE = BUILTIN_MODELS["deepseek-v3.2"]
WORST = PRICE.worst_case(100, 50)
METRICS = [("swarm_gateway_requests_total", {"model": PRICE.name, "outcome": "unknown"}),
           ("swarm_spend_usd_total", {"model": PRICE.name}),
           ("swarm_spend_unresolved_usd_total", {"model": PRICE.name})]


@pytest.fixture
async def sessions(database_url: str) -> AsyncIterator[SessionFactory]:
    engine = make_db_engine(database_url)
    yield make_session_factory(engine)
    await engine.dispose()


def meter(sessions: SessionFactory) -> PassthroughMeter:
    return PassthroughMeter(sessions, PRICE, [], "t1", WORST, prompt_bound=100, max_tokens=50)


async def rows(sessions: SessionFactory) -> list[Any]:
    async with sessions() as s:
        q = select(GatewayCall.outcome, GatewayCall.cost_usd, GatewayCall.prompt_tokens,
                   GatewayCall.completion_tokens, GatewayCall.swarm_id).order_by(GatewayCall.id)
        return list((await s.execute(q)).all())


async def billed(sessions: SessionFactory) -> tuple[Decimal, Decimal, int]:
    async with sessions() as s:
        report = await spend.usage(s, "t1", None, None, "model")
    return (sum((r.cost_usd for r in report), Decimal(0)),
            sum((r.unresolved_usd for r in report), Decimal(0)),
            sum(r.gateway_calls for r in report))


async def test_written_ahead_then_settled_by_the_answer(sessions: SessionFactory) -> None:
    m = meter(sessions)
    await m.before(1)
    assert await rows(sessions) == [("in_flight", 0, 100, 50, None)]
    assert await billed(sessions) == (0, 0, 0)  # written ahead is not spend yet
    await m.after(AttemptRecord(1, 200, "ok", Usage(40, 10), 0.1, None, None))
    cost = PRICE.cost(40, 10)
    assert await rows(sessions) == [("ok", cost, 40, 10, None)]
    await m.release()  # nothing left open: nothing changes
    assert await billed(sessions) == (cost, 0, 1)


async def test_a_usage_over_the_bounds_settles_at_the_bounds(sessions: SessionFactory) -> None:
    """Over-reported (or, unreported, bounded by bytes) usage never settles above the worst
    case reserved for it: the caps stay hard."""
    m = meter(sessions)
    await m.before(1)
    await m.after(AttemptRecord(1, 200, "ok", Usage(10**6, 10**6, 10**6), 0.1, None, None))
    assert await rows(sessions) == [("ok", WORST, 100, 50, None)]
    assert await billed(sessions) == (WORST, 0, 1)  # reported (if not believed): settled
    await m.before(2)
    await m.after(AttemptRecord(2, 200, "ok", Usage(70, 900), 0.1, None, None,
                                usage_reported=False))
    assert (await rows(sessions))[1] == ("ok", PRICE.cost(70, 50), 70, 50, None)
    # used with no usage it reported: its cost is an upper bound, counted unresolved
    assert await billed(sessions) == (WORST + PRICE.cost(70, 50), PRICE.cost(70, 50), 2)


def test_the_prompt_bound_covers_the_whole_body() -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "héllo"}]
    bare = prompt_bound({"model": "m", "messages": messages}, 1000)
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {"x": "y" * 300}}}
    with_tools = prompt_bound({"model": "m", "messages": messages, "tools": [tool]}, 1000)
    assert 1000 > bare >= len('{"role":"user","content":"héllo"}'.encode()) + 8
    assert with_tools >= bare + len(json.dumps(tool, separators=(",", ":"))) + TOOLS_OVERHEAD_TOKENS
    # a part that is not text is billed on what it holds: the window on top of the bytes
    text_parts = [{"role": "user", "content": [{"type": "text", "text": "héllo"}]}]
    assert prompt_bound({"messages": text_parts}, 1000) < 1000
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    assert prompt_bound({"messages": image}, 1000) > 1000


async def test_an_attempt_cut_off_is_unknown_at_its_reservation(
        sessions: SessionFactory) -> None:
    m = meter(sessions)
    await m.before(1)
    await m.release()  # the request was cancelled mid-call
    assert await rows(sessions) == [("unknown", WORST, 100, 50, None)]
    assert await billed(sessions) == (WORST, WORST, 1)


async def test_rows_a_dead_process_left_in_flight_are_settled_later(
        sessions: SessionFactory) -> None:
    await meter(sessions).before(1)  # ... and the process dies here
    assert await settle_stale(sessions) == 0  # still young: its process may be alive
    assert await settle_stale(sessions, horizon_s=0) == 1
    assert await rows(sessions) == [("unknown", WORST, 100, 50, None)]
    assert await billed(sessions) == (WORST, WORST, 1)


async def test_a_dead_processs_attempt_is_held_by_the_daily_cap_and_counted_when_stale(
        sessions: SessionFactory) -> None:
    """Its daily reservation outlives the process (the call may have been billed): the cap
    does not hand that money out again; settled `unknown` later, the metrics count it as
    `release` counts an attempt cut off (found by a probe session)."""
    limit = WORST * 2
    dead_cap = DailyCap(sessions, limit, "dead:1", lease_s=0.3)
    dead = PassthroughMeter(sessions, PRICE, [dead_cap], "t1", WORST, prompt_bound=100,
                            max_tokens=50)
    await dead.before(1)  # written ahead, reserved, sent ... and the process dies here
    await dead_cap.close()  # its refresher dies with it
    await asyncio.sleep(0.5)  # the reservation expires
    alive = DailyCap(sessions, limit, "alive:1")
    try:
        with pytest.raises(BudgetExceeded):  # the day holds WORST: 2 x WORST does not fit
            await alive.reserve(limit)
        before = [REGISTRY.get_sample_value(name, labels) or 0.0 for name, labels in METRICS]
        assert await settle_stale(sessions, horizon_s=0) == 1
        after = [REGISTRY.get_sample_value(name, labels) or 0.0 for name, labels in METRICS]
        assert [b - a for a, b in zip(before, after, strict=True)] == pytest.approx(
            [1, float(WORST), float(WORST)], abs=1e-12)
        with pytest.raises(BudgetExceeded):  # still held: settling it stale frees nothing
            await alive.reserve(limit)
        async with sessions() as s:  # and adds nothing to the day's spend twice
            assert (await s.execute(select(DailySpend.spent_usd))).scalar_one() == 0
    finally:
        await alive.close()
    assert await settle_stale(sessions, horizon_s=0) == 0  # settled once
