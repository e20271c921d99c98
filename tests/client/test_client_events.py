"""The client's event stream against a scripted server: keep-alive pings are not events, the
CLI's live view keeps its own time on a quiet stream, and Ctrl-C names the swarm it leaves
running."""

from __future__ import annotations

import argparse
import io
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from rich.console import Console

from swarm_api_client import AsyncSwarmClient, SwarmClient, WaitTimeout
from swarm_api_client import cli as client_cli

SSE = {"content-type": "text/event-stream"}
# a ping between two events, as the service sends one: a comment, then the blank line
PINGED = ('id: 1\nevent: swarm.status\ndata: {"seq": 1, "status": "running"}\n\n'
          ": ping - 2026-12-03 12:00:00\n\n: ping - 2026-12-03 12:00:15\n\n"
          'id: 2\nevent: swarm.completed\ndata: {"seq": 2, "status": "succeeded"}\n\n')


def swarm_json(status: str = "running") -> dict[str, Any]:
    zero = {"prompt_tokens": 0, "completion_tokens": 0, "cost_usd": "0"}
    return {"id": str(uuid.uuid4()), "status": status, "created_at": "2026-11-30T12:00:00Z",
            "started_at": None, "finished_at": None, "task": "t", "metadata": {}, "spec": {},
            "progress": {"total": 0}, "subtasks": [], "usage": {**zero, "gateway_calls": 0},
            "timing": {"wall_s": None, "critical_path_s": 0, "serial_s": 0, "speedup": None,
                       "subtask_latency_s": {"p50": None, "p95": None, "p99": None}},
            "queue_position": None, "result": None, "error": None}


def handler(events: Any) -> Any:
    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/events"):
            return httpx.Response(200, headers=SSE, content=events())
        return httpx.Response(200, json=swarm_json())
    return handle


def pinged() -> Iterator[bytes]:
    yield PINGED.encode()


def test_pings_are_not_events() -> None:
    with SwarmClient("http://swarm.test", transport=httpx.MockTransport(handler(pinged))) as c:
        events = list(c.events("s"))
    assert [(e.id, e.event) for e in events] == [(1, "swarm.status"), (2, "swarm.completed")]


async def test_pings_are_not_events_async() -> None:
    async def apinged() -> Any:
        yield PINGED.encode()

    async with AsyncSwarmClient("http://swarm.test",
                                transport=httpx.MockTransport(handler(apinged))) as c:
        events = [e async for e in c.events("s")]
    assert [e.id for e in events] == [1, 2]


def quiet() -> Iterator[bytes]:
    yield b'id: 1\nevent: swarm.status\ndata: {"seq": 1, "status": "running"}\n\n'
    time.sleep(20)  # a slow call: nothing to say for a while
    yield b""


def test_the_live_view_times_out_on_a_quiet_stream() -> None:
    with SwarmClient("http://swarm.test", transport=httpx.MockTransport(handler(quiet))) as c:
        started = time.monotonic()
        with pytest.raises(WaitTimeout):
            client_cli.follow(c, "s", Console(file=io.StringIO()), timeout=1.0)
        assert time.monotonic() - started < 5  # its clock, not the next event's


def test_ctrl_c_while_following_names_the_swarm(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    created = swarm_json()

    def interrupted(*_: Any, **__: Any) -> Any:
        raise KeyboardInterrupt

    # a terminal's stderr follows live, a pipe's waits quietly: Ctrl-C can land in either
    monkeypatch.setattr(client_cli, "follow", interrupted)
    monkeypatch.setattr(SwarmClient, "wait", interrupted)
    monkeypatch.setattr(SwarmClient, "create", lambda *_, **__: _read(created))
    args = argparse.Namespace(command="submit", url="http://swarm.test", file="-", wait=True,
                              json=False, timeout=None, idempotency_key=None)
    monkeypatch.setattr(client_cli, "_read_body", lambda _: {"task": "t"})
    assert client_cli.run(args) == client_cli.INTERRUPTED
    err = capsys.readouterr().err
    assert f"swarm {created['id']} keeps running" in err
    assert f"swarm-api cancel {created['id']}" in err


def _read(data: dict[str, Any]) -> Any:
    from app.schemas import SwarmRead
    return SwarmRead.model_validate(data)
