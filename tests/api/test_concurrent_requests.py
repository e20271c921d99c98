"""Concurrent requests on one swarm or one Idempotency-Key (both backends): one key makes
one swarm whatever the bodies (the others `422 idempotency_key_reused`), concurrent retries
with one key make one swarm, concurrent cancels answer only 202/409, and a cancel racing the
swarm's end, a retry or the engine's claims leaves its events numbered 1..n with one
`swarm.completed`. The tenant quotas under concurrency: tests/api/test_quota_races.py; a cancel
fencing a lapsed owner: tests/engine/test_cancel_fence.py."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

from app.db.tables import Event, Swarm
from tests.conftest import Harness, make_settings, start_harness
from tests.helpers import agent, error_of

ONE = {"task": "t", "agents": [{"name": "a"}], "synthesis": {"strategy": "none"},
       "limits": {"budget_usd": "1"}}


async def harness(url: str, tmp_path: Path, tenants: str | None = None, engine: bool = True,
                  **kw: Any) -> tuple[Harness, Any]:
    if tenants is not None:
        path = tmp_path / "tenants.toml"
        path.write_text(tenants)
        kw["tenants_file"] = str(path)
    return await start_harness(make_settings(url, **kw), run_engine=engine)


async def stored(h: Harness) -> int:
    async with h.app.state.sessions() as s:
        return int((await s.execute(select(func.count()).select_from(Swarm))).scalar_one())


async def event_seqs(h: Harness, swarm_id: str) -> list[int]:
    async with h.app.state.sessions() as s:
        rows = await s.execute(select(Event.seq).where(Event.swarm_id == swarm_id)
                               .order_by(Event.seq))
        return list(rows.scalars())


# ---- 1. idempotent creation ---------------------------------------------------------------


async def test_concurrent_same_key_same_and_other_bodies(database_url: str,
                                                         tmp_path: Path) -> None:
    h, close = await harness(database_url, tmp_path, engine=False)
    try:
        other = {**ONE, "task": "other"}
        answers = await asyncio.gather(*(
            h.post(ONE if i % 2 else other, headers={"Idempotency-Key": "k"})
            for i in range(20)))
        assert await stored(h) == 1
        ok = [r for r in answers if r.status_code == 202]
        assert len({r.json()["id"] for r in ok}) == 1
        winner_task = ok[0].json()["task"]
        for i, r in enumerate(answers):
            if ("t" if i % 2 else "other") == winner_task:
                assert r.status_code == 202, r.text
            else:
                error_of(r, 422, "idempotency_key_reused")
    finally:
        await close()


# ---- 2. retry ------------------------------------------------------------------------------


async def test_concurrent_retries_with_one_key_make_one_swarm(database_url: str,
                                                              tmp_path: Path) -> None:
    h, close = await harness(database_url, tmp_path, engine=False)
    try:
        old = (await h.post(ONE)).json()["id"]
        await h.client.post(f"/swarms/{old}/cancel")
        answers = await asyncio.gather(*(
            h.client.post(f"/swarms/{old}/retry", headers={"Idempotency-Key": "r"})
            for _ in range(20)))
        assert {r.status_code for r in answers} == {202}, [r.text for r in answers
                                                           if r.status_code != 202]
        assert len({r.json()["id"] for r in answers}) == 1
        assert await stored(h) == 2
    finally:
        await close()


async def test_concurrent_retries_without_key(database_url: str, tmp_path: Path) -> None:
    h, close = await harness(database_url, tmp_path, engine=False)
    try:
        old = (await h.post(ONE)).json()["id"]
        await h.client.post(f"/swarms/{old}/cancel")
        answers = await asyncio.gather(*(h.client.post(f"/swarms/{old}/retry")
                                         for _ in range(10)))
        assert {r.status_code for r in answers} == {202}, [r.text for r in answers]
        assert len({r.json()["id"] for r in answers}) == 10
        for r in answers:
            d = r.json()
            assert d["retry_of"] == old and d["status"] == "queued"
        got = (await h.client.get(f"/swarms/{old}")).json()
        assert got["status"] == "cancelled"
    finally:
        await close()


# ---- 3. cancel ----------------------------------------------------------------------------


async def test_many_cancels_of_a_running_swarm(database_url: str, tmp_path: Path) -> None:
    h, close = await harness(database_url, tmp_path)
    try:
        body = {"task": "t", "agents": [agent(f"a{i}", "[[sim latency_ms=400]]")
                                        for i in range(3)]}
        sid = (await h.post(body)).json()["id"]
        await asyncio.sleep(0.15)
        answers = await asyncio.gather(*(h.client.post(f"/swarms/{sid}/cancel")
                                         for _ in range(20)))
        assert {r.status_code for r in answers} <= {202, 409}, [r.text for r in answers]
        data = await h.wait(sid)
        assert data["status"] == "cancelled"
        seqs = await event_seqs(h, sid)
        assert seqs == list(range(1, len(seqs) + 1)), seqs
    finally:
        await close()


async def test_many_cancels_of_a_queued_swarm(database_url: str, tmp_path: Path) -> None:
    h, close = await harness(database_url, tmp_path, engine=False)
    try:
        sid = (await h.post(ONE)).json()["id"]
        answers = await asyncio.gather(*(h.client.post(f"/swarms/{sid}/cancel")
                                         for _ in range(20)))
        codes = Counter(r.status_code for r in answers)
        assert set(codes) <= {202, 409}, [r.text for r in answers]
        assert codes[202] == 1, codes
        seqs = await event_seqs(h, sid)
        assert seqs == list(range(1, len(seqs) + 1)), seqs
    finally:
        await close()


async def test_cancel_racing_the_swarms_end(database_url: str, tmp_path: Path) -> None:
    h, close = await harness(database_url, tmp_path)
    try:
        for delay in (0.0, 0.01, 0.02, 0.04, 0.06, 0.08):
            body = {"task": "t", "agents": [agent("a", "[[sim latency_ms=40]]")],
                    "synthesis": {"strategy": "none"}}
            sid = (await h.post(body)).json()["id"]
            await asyncio.sleep(delay)
            answers = await asyncio.gather(*(h.client.post(f"/swarms/{sid}/cancel")
                                             for _ in range(5)))
            assert {r.status_code for r in answers} <= {202, 409}, [r.text for r in answers]
            data = await h.wait(sid)
            assert data["status"] in ("cancelled", "succeeded")
            seqs = await event_seqs(h, sid)
            assert seqs == list(range(1, len(seqs) + 1)), seqs
            r = await h.client.get(f"/swarms/{sid}/events")
            assert r.status_code == 200
            assert r.text.count("event: swarm.completed") == 1, r.text
    finally:
        await close()


async def test_cancel_racing_retry(database_url: str, tmp_path: Path) -> None:
    h, close = await harness(database_url, tmp_path, engine=False)
    try:
        old = (await h.post(ONE)).json()["id"]
        await h.client.post(f"/swarms/{old}/cancel")
        calls = [h.client.post(f"/swarms/{old}/retry") for _ in range(5)]
        calls += [h.client.post(f"/swarms/{old}/cancel") for _ in range(5)]
        answers = await asyncio.gather(*calls)
        assert {r.status_code for r in answers[:5]} == {202}
        assert {r.status_code for r in answers[5:]} == {409}
        new = answers[0].json()["id"]
        racing = await asyncio.gather(h.client.post(f"/swarms/{new}/cancel"),
                                      h.client.post(f"/swarms/{new}/retry"),
                                      h.client.post(f"/swarms/{new}/cancel"))
        assert racing[0].status_code in (202, 409) and racing[2].status_code in (202, 409)
        assert racing[1].status_code in (202, 409), racing[1].text
        seqs = await event_seqs(h, new)
        assert seqs == list(range(1, len(seqs) + 1)), seqs
    finally:
        await close()


async def test_cancels_racing_claims_of_queued_swarms(database_url: str,
                                                      tmp_path: Path) -> None:
    h, close = await harness(database_url, tmp_path, max_running_swarms=1)
    try:
        body = {"task": "t", "agents": [agent("a", "[[sim latency_ms=30]]")],
                "synthesis": {"strategy": "none"}}
        ids = [r.json()["id"] for r in await asyncio.gather(*(h.post(body) for _ in range(12)))]
        answers = []
        for i in range(0, 12, 3):
            answers += await asyncio.gather(*(h.client.post(f"/swarms/{sid}/cancel")
                                              for sid in ids[i:i + 3] for _ in range(3)))
            await asyncio.sleep(0.03)
        assert {r.status_code for r in answers} <= {202, 409}, [r.text for r in answers]
        for sid in ids:
            data = await h.wait(sid)
            assert data["status"] in ("cancelled", "succeeded"), data["status"]
            seqs = await event_seqs(h, sid)
            assert seqs == list(range(1, len(seqs) + 1)), (sid, seqs)
            r = await h.client.get(f"/swarms/{sid}/events")
            assert r.text.count("event: swarm.completed") == 1, r.text
    finally:
        await close()
