"""Token streaming (SPEC §10, §3): with `agent_swarm.streaming: true` the workers' calls stream
and their text reaches the facade's client inside its frames while the swarm runs, one frame
open at a time; `GET /swarms/{id}/events?deltas=true` carries `subtask.delta` events (no `id:`)
for a swarm created with `limits.stream_tokens`; nothing changes for a client that did not
ask."""

from __future__ import annotations

import json
import re
from typing import Any

from tests.facade.conftest import Facade

# three workers whose answers come in pieces over 1.5 s each (the simulator's stream_ms)
TASK = [{"role": "user", "content": "Review the service [[sim stream_ms=1500]]"}]
SWARM = {"agent_swarm": {"enabled": True, "max_sub_agents": 3, "streaming": True,
                         "fan_in_strategy": "concatenate"}}
FRAME = re.compile(r"\[SUB_AGENT_(\w+)\](.*?)\[/SUB_AGENT\]\n", re.S)


async def test_workers_tokens_are_framed_as_they_come(facade: Facade) -> None:
    stream = await facade.sdk().chat.completions.create(  # type: ignore[call-overload]
        model="kimi-k2.5", messages=TASK, stream=True, extra_body=SWARM)
    pieces: list[str] = []
    status_at_first_piece = None
    swarm_id = ""
    async for chunk in stream:
        text = chunk.choices[0].delta.content if chunk.choices else None
        if not text:
            continue
        if text.startswith("[SUB_AGENT_") and status_at_first_piece is None:
            swarm_id = chunk.id.removeprefix("chatcmpl-")
            status_at_first_piece = (await facade.swarm(swarm_id))["status"]
            # a frame opened with the first piece of text, not the whole output
            assert not text.endswith("[/SUB_AGENT]\n"), text
        pieces.append(text)
    assert status_at_first_piece == "running"
    swarm = await facade.swarm(swarm_id)
    assert swarm["status"] == "succeeded" and swarm["spec"]["limits"]["stream_tokens"]
    outputs = {s["name"]: s["output"] for s in swarm["subtasks"] if s["kind"] == "worker"}
    framed = "".join(pieces[:-1])  # the last piece is the result
    assert dict(FRAME.findall(framed)) == outputs  # a parser of whole frames reads them all
    assert len(FRAME.findall(framed)) == len(outputs) == 3
    assert pieces[-1] == swarm["result"]
    # one frame open at a time: frames never interleave
    assert "".join(f"[SUB_AGENT_{n}]{o}[/SUB_AGENT]\n"
                   for n, o in FRAME.findall(framed)) == framed
    assert len(pieces) > len(outputs) + 1  # text came in pieces, not one piece per frame


async def test_without_streaming_frames_come_whole_and_calls_do_not_stream(
        facade: Facade) -> None:
    body = {"agent_swarm": {**SWARM["agent_swarm"], "streaming": None}}
    stream = await facade.sdk().chat.completions.create(  # type: ignore[call-overload]
        model="kimi-k2.5", messages=TASK, stream=True, extra_body=body)
    pieces = [c.choices[0].delta.content async for c in stream
              if c.choices and c.choices[0].delta.content]
    assert all(FRAME.fullmatch(p) for p in pieces[:-1]) and len(pieces) == 4
    calls = facade.simulator.state.stats.by_key.values()
    assert not any("first_piece_at" in c for c in calls)  # no call streamed


async def events(facade: Facade, swarm_id: str, **params: Any) -> list[dict[str, Any]]:
    """Every SSE event of the swarm's stream: its fields as sent."""
    out: list[dict[str, Any]] = []
    async with facade.http.stream("GET", f"/swarms/{swarm_id}/events", params=params) as r:
        assert r.status_code == 200
        event: dict[str, Any] = {}
        async for line in r.aiter_lines():
            if not line:
                if event:
                    out.append(event)
                event = {}
            elif not line.startswith(":"):
                field, _, value = line.partition(":")
                event[field] = value.removeprefix(" ")
    return out


async def test_events_carry_deltas_only_to_a_client_that_asks(facade: Facade) -> None:
    body = {"task": "Audit [[sim stream_ms=800]]", "agents": [{"name": "a"}, {"name": "b"}],
            "limits": {"stream_tokens": True}}
    r = await facade.http.post("/swarms", json=body)
    assert r.status_code == 202, r.text
    swarm_id = r.json()["id"]
    seen = await events(facade, swarm_id, deltas="true")
    deltas = [e for e in seen if e["event"] == "subtask.delta"]
    assert deltas and all("id" not in e for e in deltas)  # not stored, not resumable
    assert all(e["id"].isdigit() for e in seen if e["event"] != "subtask.delta")
    swarm = await facade.swarm(swarm_id)
    for sub in swarm["subtasks"]:
        if sub["kind"] == "worker":
            texts = [json.loads(e["data"]) for e in deltas]
            assert "".join(t["text"] for t in texts if t["name"] == sub["name"]) == sub["output"]
    # each worker's text precedes its end
    order = [(e["event"], json.loads(e["data"]).get("name")) for e in seen]
    for name in ("a", "b"):
        assert order.index(("subtask.delta", name)) < order.index(("subtask.succeeded", name))
    # a client that does not ask reads the stored events alone
    again = await events(facade, swarm_id)
    assert [e["event"] for e in again] == [e["event"] for e in seen
                                           if e["event"] != "subtask.delta"]


async def test_deltas_query_must_be_a_boolean(facade: Facade) -> None:
    r = await facade.http.post("/swarms", json={"task": "t", "agents": [{"name": "a"}]})
    r = await facade.http.get(f"/swarms/{r.json()['id']}/events", params={"deltas": "maybe"})
    assert r.status_code == 422 and r.json()["error"]["code"]
