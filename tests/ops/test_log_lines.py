"""The log lines of a real run (SPEC §17): a `serve` process against a simulator process, a
swarm whose first gateway attempt fails, a webhook delivered; every line of the server's
output is one JSON object, the swarm's events are there with its context, and no line holds
a key, the task, a prompt, an output or the webhook's URL. A takeover's line, in process."""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import update

from app import logs
from app.db.tables import Event, Subtask, Swarm
from app.db.types import utcnow
from tests.conftest import make_settings, start_harness
from tests.support import CLI, free_port

API_KEY = "sk-APIKEY-pangolin-6061"
GATEWAY_KEY = "gw-GATEWAYKEY-okapi-2719"
WEBHOOK_SECRET = "whsec-WEBHOOKSECRET-tapir-3385"
TASK = "TASK-quokka-7731: write a haiku"
PROMPT = "PROMPT-axolotl-5512"
OUTPUT = "OUTPUT-narwhal-4471"
URL_TOKEN = "URLTOKEN-ibis-9090"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
SECRETS = (API_KEY, GATEWAY_KEY, WEBHOOK_SECRET, "TASK-quokka", PROMPT, OUTPUT, URL_TOKEN,
           "quokka", "axolotl", "narwhal", "pangolin", "okapi", "tapir", "ibis")


def clean_env(**env: str) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith("SWARM_")}
    out.update(env)
    return out


def wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        assert proc.poll() is None, log.read_text()
        time.sleep(0.1)
    raise AssertionError(f"{url} did not answer:\n{log.read_text()[-3000:]}")


@pytest.fixture
def receiver() -> Iterator[tuple[str, list[bytes]]]:
    """A webhook receiver on loopback: its URL (a token in the path) and the bodies it got."""
    got: list[bytes] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            got.append(self.rfile.read(int(self.headers["content-length"])))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/hook/{URL_TOKEN}", got
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def spawn(procs: list[subprocess.Popen[bytes]], args: list[str], log: Path,
          env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:  # the child holds its own descriptor
        proc = subprocess.Popen([CLI, *args], cwd=log.parent, env=env, stdout=out,
                                stderr=subprocess.STDOUT)
    procs.append(proc)
    return proc


def test_a_real_runs_lines_name_its_events_and_never_a_secret(
        tmp_path: Path, receiver: tuple[str, list[bytes]],
        procs: list[subprocess.Popen[bytes]]) -> None:
    hook_url, delivered = receiver
    sim_port, port = free_port(), free_port()
    sim_log, log = tmp_path / "simulator.log", tmp_path / "serve.log"
    sim = spawn(procs, ["simulator", "--port", str(sim_port)], sim_log,
                clean_env(SWARM_SIM_LATENCY_MS="5"))
    wait_http(f"http://127.0.0.1:{sim_port}/v1/_stats", sim, sim_log)
    # SWARM_LOG_FORMAT unset and the output not a terminal: json
    serve = spawn(procs, ["serve", "--port", str(port)], log, clean_env(
        SWARM_DATABASE_URL=f"sqlite+aiosqlite:///{tmp_path}/swarm.db",
        SWARM_GATEWAY_URL=f"http://127.0.0.1:{sim_port}/v1",
        SWARM_GATEWAY_API_KEY=GATEWAY_KEY, SWARM_API_KEYS=f"acme:{API_KEY}",
        SWARM_WEBHOOK_SECRET=WEBHOOK_SECRET, SWARM_WEBHOOK_ALLOW_HTTP="1",
        SWARM_WEBHOOK_ALLOW_PRIVATE="1", SWARM_WEBHOOK_RETRY_BASE_S="0.2",
        SWARM_ACCESS_LOG="1", SWARM_POLL_INTERVAL_S="0.2"))
    base = f"http://127.0.0.1:{port}"
    wait_http(f"{base}/readyz", serve, log)

    auth = {"Authorization": f"Bearer {API_KEY}",
            "traceparent": f"00-{TRACE_ID}-00f067aa0ba902b7-01"}
    body = {"task": TASK, "webhook_url": hook_url, "synthesis": {"strategy": "concatenate"},
            "agents": [{"name": "w", "prompt": f'{PROMPT} [[sim fail=500 times=1 '
                                                f'answer="{OUTPUT}"]]'}]}
    created = httpx.post(f"{base}/swarms", json=body, headers=auth, timeout=30)
    assert created.status_code == 202, created.text
    swarm_id = created.json()["id"]
    deadline = time.monotonic() + 60
    while True:
        swarm = httpx.get(f"{base}/swarms/{swarm_id}", params={"wait": 10}, headers=auth,
                          timeout=30).json()
        if swarm["status"] in ("succeeded", "failed", "cancelled") or time.monotonic() > deadline:
            break
    assert swarm["status"] == "succeeded", swarm
    assert OUTPUT in swarm["result"]  # the output was real, and is what the grep looks for
    deadline = time.monotonic() + 30
    while not delivered and time.monotonic() < deadline:
        time.sleep(0.1)
    assert delivered and OUTPUT.encode() in delivered[0]
    time.sleep(0.5)  # the delivery's record and its line follow the receiver's answer
    serve.send_signal(signal.SIGTERM)
    serve.wait(30)  # its lines are all written: the file is complete

    text = log.read_text()
    records = [json.loads(line) for line in text.splitlines()]  # every line: one object
    leaked = [s for s in SECRETS if s in text]
    assert not leaked, f"{leaked} in the server's output:\n{text}"

    mine = [r for r in records if r.get("swarm_id") == swarm_id]

    def one(pred: Any, what: str) -> dict[str, Any]:
        found = [r for r in mine if pred(r)]
        assert found, f"no line for {what}:\n{text}"
        return found[0]

    made = one(lambda r: r["message"].startswith(f"swarm {swarm_id} created"), "the creation")
    claimed = one(lambda r: "claimed" in r["message"], "the claim")
    failed = one(lambda r: r["logger"] == "app.gateway.client", "the failed attempt")
    ended = one(lambda r: " ended " in r["message"], "the end")
    hook = one(lambda r: r["logger"] == "app.webhooks", "the webhook delivery")
    for r in (made, claimed, failed, ended, hook):
        assert r["tenant"] == "acme" and r["trace_id"] == TRACE_ID, r
    assert made["subtasks"] == 1 and made["level"] == "INFO"
    assert claimed["epoch"] == 1
    assert (failed["level"], failed["http_status"], failed["retry_class"], failed["attempt"]) == (
        "WARNING", 500, "server_error", 1)
    assert isinstance(failed["wait_s"], float) and 0 <= failed["wait_s"] <= 60
    assert (ended["status"], ended["calls"]) == ("succeeded", swarm["usage"]["gateway_calls"])
    assert ended["cost_usd"] == pytest.approx(float(swarm["usage"]["cost_usd"]))
    assert ended["duration_s"] >= 0
    assert (hook["http_status"], hook["state"]) == (200, "delivered")
    access = [r for r in records if r["logger"] == "swarm_api.access"]
    post = next(r for r in access if r["method"] == "POST")
    assert (post["path"], post["http_status"], post["tenant"]) == ("/swarms", 202, "acme")
    assert post["duration_ms"] > 0
    assert any(r["logger"] == "uvicorn.error" for r in records)
    assert any(f"{base}/docs" in r["message"] for r in records)
    assert any(r["message"].startswith("auth on") for r in records)
    # the simulator's own output is JSON too (only its warnings and uvicorn's)
    assert all(json.loads(line) for line in sim_log.read_text().splitlines())


@pytest.fixture
def json_lines() -> Iterator[io.StringIO]:
    """This process's records as JSON lines, formatted as they are emitted (the context
    fields are those of the code that logs)."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logs.JsonFormatter())
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield out
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


async def test_a_takeover_is_logged_with_what_the_swarm_was_doing(
        database_url: str, json_lines: io.StringIO) -> None:
    settings = make_settings(database_url)
    h, close = await start_harness(settings)
    try:
        swarm_id = (await h.run({"task": "t", "agents": [{"name": "a"}]}))["id"]
    finally:
        await close()
    # a process died while synthesizing: the synthesizer running, its lease expired
    async with h.app.state.sessions() as s, s.begin():
        await s.execute(update(Subtask).where(Subtask.swarm_id == swarm_id,
                                              Subtask.name == "@synthesizer")
                        .values(status="running", output=None, finished_at=None))
        await s.execute(update(Swarm).where(Swarm.id == swarm_id).values(
            status="synthesizing", finished_at=None, result=None, lease_owner="dead:1",
            lease_expires_at=utcnow() - timedelta(seconds=1)))
        await s.execute(Event.__table__.delete().where(
            Event.swarm_id == swarm_id, Event.type == "swarm.completed"))
        await s.execute(update(Swarm).where(Swarm.id == swarm_id).values(
            event_seq=Swarm.event_seq - 1))
    await h.release_db()
    h2, close2 = await start_harness(settings)
    try:
        assert (await h2.wait(swarm_id, timeout=10))["status"] == "succeeded"
    finally:
        await close2()
    records = [json.loads(line) for line in json_lines.getvalue().splitlines()]
    mine = [r for r in records if r.get("swarm_id") == swarm_id]
    taken = [r for r in mine if "taken over" in r["message"]]
    assert len(taken) == 1, mine
    # the dead owner's calls had settled: a fruitful takeover, no rescue counted
    assert (taken[0]["status"], taken[0]["rescues"], taken[0]["tenant"], taken[0]["epoch"]) == (
        "synthesizing", 0, "default", 2)
    ends = [r for r in mine if " ended " in r["message"]]
    assert [r["status"] for r in ends] == ["succeeded", "succeeded"]  # the first run's, then
