"""Encryption at rest (SPEC §16), on SQLite and on PostgreSQL: with SWARM_ENCRYPTION_KEYS a raw
read of every table finds no task, prompt, output, tool result or event payload, while the API,
a retry's copy and the OpenAI facade read them whole; keys rotate (the old one still opens,
`swarm-api reencrypt` moves every value, from plaintext too, then the old key can go); a
process without the key that opens the content refuses to start."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from sqlalchemy import Text, event, insert, select, type_coerce

from app.cli import main
from app.crypto import MARK, Sealer, SealError, key_id, parse_keys
from app.db.reencrypt import check_keys, sealed_tables
from app.db.sealed import open_json, seal_json, use_sealer
from app.db.session import make_db_engine, make_session_factory
from app.db.tables import Subtask, Swarm
from app.engine.specs import new_swarm_row
from tests.conftest import Harness, make_settings, start_harness
from tests.erase_support import content_swarm, raw_dump, tooled_harness
from tests.helpers import agent, by_name, read_events

FLAKY_400 = "[[sim when=flaky fail=400]]"


def new_key() -> str:
    return base64.b64encode(os.urandom(32)).decode()


K1, K2, K3 = new_key(), new_key(), new_key()


def sealed_with(key: str) -> str:
    """How a value sealed with `key` starts, as the raw dump (json of str) shows it."""
    return json.dumps(f"{MARK}{key_id(base64.b64decode(key))}:")[1:-1]


@pytest.fixture
async def sealed(database_url: str, tmp_path: Path) -> AsyncIterator[Harness]:
    h, close = await tooled_harness(database_url, tmp_path, encryption_keys=K1)
    yield h
    await close()


async def test_no_table_holds_the_content_in_the_clear(sealed: Harness) -> None:
    h = sealed
    tag = f"zq{uuid.uuid4().hex[:12]}"
    done = await h.run(content_swarm(tag), timeout=120)
    assert done["status"] == "succeeded", done["error"]
    # the API reads every piece whole: task, metadata, output, tool result, events
    got = (await h.client.get(f"/swarms/{done['id']}")).json()
    assert got["task"] == f"task {tag}-task" and got["metadata"] == {"ticket": f"{tag}-meta"}
    assert by_name(got)["shaped"]["output_json"] == {"k": f"{tag}-json"}
    assert tag in by_name(got)["shaped"]["output"]
    detail = (await h.client.get(f"/swarms/{done['id']}/subtasks/reader")).json()
    assert any(tag in json.dumps(m) for m in detail["transcript"] if m["role"] == "tool")
    events = await read_events(h.client, done["id"])
    assert any(tag in json.dumps(e["data"]) for e in events)
    assert events[-1]["event"] == "swarm.completed"

    raw = await raw_dump(h)
    assert tag not in raw  # no column of any table, in any row
    assert sealed_with(K1) in raw


async def test_a_retry_and_the_facade_work_on_encrypted_content(database_url: str) -> None:
    h, close = await start_harness(make_settings(database_url, encryption_keys=K1))
    try:
        flags = h.simulator.state.config.flags
        flags.add("flaky")
        tag = f"zq{uuid.uuid4().hex[:12]}"
        old = await h.run({"task": f"{tag} task", "agents": [
            agent("a", prompt=f"{tag} a"), agent("x", FLAKY_400, depends_on=["a"])]})
        assert old["status"] == "failed" and by_name(old)["a"]["status"] == "succeeded"
        flags.discard("flaky")
        r = await h.client.post(f"/swarms/{old['id']}/retry")
        assert r.status_code == 202, r.text
        new = await h.wait(r.json()["id"])
        assert new["status"] == "succeeded" and new["task"] == f"{tag} task"
        reused = by_name(new)["a"]  # copied inside the database: still opens
        assert reused["reused"] is True and reused["output"] == by_name(old)["a"]["output"]

        r = await h.client.post("/v1/chat/completions", json={
            "model": "kimi-k2.5", "messages": [{"role": "user", "content": f"{tag} review"}],
            "agent_swarm": {"enabled": True, "max_sub_agents": 2}})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"]
        facade = (await h.client.get(f"/swarms/{r.json()['swarm_id']}")).json()
        assert tag in facade["task"] and facade["status"] == "succeeded"
        assert tag not in await raw_dump(h)
        ui = await h.client.get(f"/ui/swarms/{new['id']}")
        assert ui.status_code == 200
    finally:
        await close()


async def _run(settings_keys: str | None, url: str, tag: str) -> str:
    """A swarm run to its end by a process with these keys; its id."""
    h, close = await start_harness(make_settings(url, encryption_keys=settings_keys or ""))
    try:
        done = await h.run({"task": f"{tag} task", "metadata": {"m": tag},
                            "agents": [agent("a", prompt=f"{tag} prompt")]})
        assert done["status"] == "succeeded"
        return str(done["id"])
    finally:
        await close()


async def _read(keys: str, url: str, ids: list[str], tag: str) -> str:
    """Every swarm read back whole by a process with these keys; the raw tables."""
    h, close = await start_harness(make_settings(url, encryption_keys=keys))
    try:
        for swarm_id in ids:
            got = (await h.client.get(f"/swarms/{swarm_id}")).json()
            assert got["task"] == f"{tag} task" and got["metadata"] == {"m": tag}
            assert by_name(got)["a"]["output"]
            events = await read_events(h.client, swarm_id)
            assert events[-1]["event"] == "swarm.completed"
        return await raw_dump(h)
    finally:
        await close()


async def reencrypt(monkeypatch: pytest.MonkeyPatch, url: str, keys: str) -> int:
    """`swarm-api reencrypt` (small batches: several transactions a table) as it runs."""
    monkeypatch.setenv("SWARM_DATABASE_URL", url)
    monkeypatch.setenv("SWARM_ENCRYPTION_KEYS", keys)
    try:
        return await asyncio.to_thread(main, ["reencrypt", "--batch", "3"])
    finally:
        use_sealer(None)


async def test_rotation_from_plaintext_to_a_key_to_another(
        database_url: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    tag = f"zq{uuid.uuid4().hex[:12]}"
    plain = await _run(None, database_url, tag)  # written before any key was set
    first = await _run(K1, database_url, tag)
    raw = await _read(K1, database_url, [plain, first], tag)  # a mixed table reads whole
    assert tag in raw and sealed_with(K1) in raw

    assert await reencrypt(monkeypatch, database_url, K1) == 0  # plaintext encrypted
    assert "every value is encrypted with key" in capsys.readouterr().out
    assert tag not in await _read(K1, database_url, [plain, first], tag)

    rotated = await _run(f"{K2},{K1}", database_url, tag)  # the new key first: it encrypts
    raw = await _read(f"{K2},{K1}", database_url, [plain, first, rotated], tag)
    assert sealed_with(K1) in raw and sealed_with(K2) in raw
    assert await reencrypt(monkeypatch, database_url, f"{K2},{K1}") == 0
    assert await reencrypt(monkeypatch, database_url, f"{K2},{K1}") == 0  # idempotent
    out = capsys.readouterr().out
    assert "swarms: 0 of 3 rows re-encrypted" in out  # the second pass found nothing to do

    raw = await _read(K2, database_url, [plain, first, rotated], tag)  # the old key gone
    assert sealed_with(K1) not in raw and tag not in raw

    # a process that holds no key of the content (a wrong one, or none) refuses to start
    for keys in (K3, ""):
        with pytest.raises(SealError, match="SWARM_ENCRYPTION_KEYS"):
            await start_harness(make_settings(database_url, encryption_keys=keys))
    # and reencrypt with only the wrong key says so, changing nothing
    assert await reencrypt(monkeypatch, database_url, K3) == 1
    assert tag not in await _read(K2, database_url, [plain], tag)


def test_keys_are_checked_when_the_settings_are_built() -> None:
    assert len(parse_keys(f" {K1} , {K2},")) == 2
    for bad in ("not base64!", base64.b64encode(b"short").decode(), f"{K1},{K1}"):
        with pytest.raises(ValidationError, match="SWARM_ENCRYPTION_KEYS"):
            make_settings("sqlite+aiosqlite:///x.db", encryption_keys=bad)
    assert make_settings("sqlite+aiosqlite:///x.db", encryption_keys=K1).sealer is not None


def test_a_value_opens_only_with_its_key_and_unaltered() -> None:
    one, both = Sealer(parse_keys(K1)), Sealer(parse_keys(f"{K2},{K1}"))
    value = one.seal("a secret ünïcode task")
    assert "secret" not in value and one.seal("x") != one.seal("x")  # a nonce per value
    assert both.open(value) == "a secret ünïcode task"  # an older key still opens
    assert both.is_current(both.seal("x")) and not both.is_current(value)
    with pytest.raises(SealError, match=key_id(base64.b64decode(K1))):
        Sealer(parse_keys(K2)).open(value)
    altered = value[:-4] + ("AAAA" if not value.endswith("AAAA") else "BBBB")
    with pytest.raises(SealError, match="altered"):
        one.open(altered)


def test_json_columns_keep_their_values() -> None:
    use_sealer(Sealer(parse_keys(K1)))
    for value in ({"a": [1, 2.5, None, "é"]}, [], "text", 3, True):
        sealed = seal_json(value)
        assert isinstance(sealed, str) and sealed.startswith(MARK)
        assert open_json(sealed) == value
    assert seal_json(None) is None
    use_sealer(None)
    assert seal_json({"a": 1}) == {"a": 1}  # no key: stored as it is


def test_every_content_column_is_sealed() -> None:
    """The columns SPEC §16 lists as content (what an erase removes) are the sealed ones."""
    names = {f"{t.name}.{c.name}" for t, cols in sealed_tables() for c in cols}
    assert names == {
        "swarms.task", "swarms.spec", "swarms.metadata", "swarms.result", "swarms.error",
        "swarms.approval", "subtasks.system_prompt", "subtasks.prompt", "subtasks.output",
        "subtasks.error", "subtasks.output_json", "events.data",
        "transcript_messages.message"}


async def test_a_raw_value_is_sealed_in_the_row(sealed: Harness) -> None:
    """What the engine's hot path wrote (the group commit, not the ORM) is sealed too."""
    h = sealed
    done = await h.run({"task": "t", "agents": [agent("a", prompt="p")]})
    async with h.app.state.db_engine.connect() as conn:
        raw: Any = (await conn.execute(select(type_coerce(Subtask.output, Text))
                                       .where(Subtask.swarm_id == done["id"], Subtask.name == "a"))
               ).scalar_one()
    assert raw.startswith(MARK) and by_name(done)["a"]["output"] not in raw


async def test_the_start_check_reads_as_much_whatever_the_swarms_stored(
        database_url: str) -> None:
    """The keys check a start makes reads one statement and the heads of two tasks, with
    three swarms stored or sixty, and still refuses keys that open none of them."""
    engine = make_db_engine(database_url)
    sessions = make_session_factory(engine)
    statements: list[str] = []

    def executed(conn: object, cursor: object, statement: str, *rest: object) -> None:
        if "swarms" in statement:
            statements.append(statement)

    event.listen(engine.sync_engine, "before_cursor_execute", executed)
    sealer = Sealer(parse_keys(K1))
    use_sealer(sealer)
    costs: list[tuple[int, int]] = []
    try:
        for added in (3, 57):
            rows = [dict(vars(new_swarm_row(str(uuid.uuid4()), "t", f"task {n}",
                                            {"limits": {}}, {}, None, None, None)))
                    for n in range(added)]
            async with sessions() as session, session.begin():
                await session.execute(insert(Swarm), rows)
            statements.clear()
            async with sessions() as session, session.begin():
                costs.append((await check_keys(session, sealer), len(statements)))
        for keys in (K3, ""):  # a wrong key, or none
            with pytest.raises(SealError, match="SWARM_ENCRYPTION_KEYS"):
                async with sessions() as session, session.begin():
                    await check_keys(session, Sealer.from_setting(keys))
    finally:
        use_sealer(None)
        await engine.dispose()
    assert costs == [(2, 1), (2, 1)]
