"""A dependency output far beyond any window (SPEC §4: compressed or truncated, never dropped):
the compressor's own input is cut to its model's window, and a compressor that cannot run
leaves its dependent the truncated text instead of stopping the swarm (SQLite and
PostgreSQL)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from app.config import Settings
from app.engine.inputs import COMPRESSOR_SYSTEM
from app.gateway.client import GatewayClient
from app.pricing import PriceTable
from tests.conftest import app_on, make_settings

# under the 1 MiB floor an answer to a 1,500-token call is read up to, and ~8 windows of the
# cheapest model's 128k tokens: the compressor's input must be cut to fit
BIG = "B" * 1_000_000
GIST = "the gist of B"


class Gateway:
    """`BIG` for the agent asked for it, `GIST` for a compressor (or `compressor_status`), a
    short answer otherwise; keeps every request body."""

    def __init__(self, compressor_status: int = 200) -> None:
        self.compressor_status = compressor_status
        self.bodies: list[dict[str, Any]] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.bodies.append(body)
        messages = body["messages"]
        if messages[0]["content"] == COMPRESSOR_SYSTEM:
            if self.compressor_status != 200:
                return httpx.Response(self.compressor_status, json={"error": {"message": "no"}})
            content = GIST
        else:
            content = BIG if "WRITE-BIG" in messages[-1]["content"] else "done"
        return httpx.Response(200, json={
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 10}})

    def asked(self, what: str) -> list[dict[str, Any]]:
        compressor = [b for b in self.bodies if b["messages"][0]["content"] == COMPRESSOR_SYSTEM]
        if what == "compressor":
            return compressor
        return [b for b in self.bodies if b not in compressor
                and "WRITE-BIG" not in b["messages"][-1]["content"]]


async def run(settings: Settings, gateway: Gateway, body: dict[str, Any]) -> dict[str, Any]:
    client = GatewayClient("http://gw/v1", transport=httpx.MockTransport(gateway.handle))
    async with app_on(settings, client) as c:
        r = await c.post("/swarms", json=body)
        assert r.status_code == 202, r.text
        for _ in range(6):
            data: dict[str, Any] = (await c.get(f"/swarms/{r.json()['id']}",
                                                params={"wait": 10})).json()
            if data["status"] in ("succeeded", "failed", "cancelled"):
                return data
        raise AssertionError("not terminal")


def swarm(budget: float, model: str | None = None) -> dict[str, Any]:
    chosen = {"model": model} if model else {}
    return {"task": "t", "synthesis": {"strategy": "none", **chosen}, **chosen,
            "limits": {"budget_usd": budget}, "agents": [
                {"name": "big", "prompt": "WRITE-BIG"},
                {"name": "dep", "prompt": "use it", "depends_on": ["big"]}]}


async def test_the_compressor_input_is_cut_to_its_window(database_url: str) -> None:
    gateway = Gateway()
    # uncut, the compressor's prompt would not fit its model's window
    done = await run(make_settings(database_url), gateway, swarm(budget=1.0))
    assert done["status"] == "succeeded", done["error"]
    subs = {s["name"]: s for s in done["subtasks"]}
    assert subs["@compress.big"]["status"] == "succeeded"
    [compressor] = gateway.asked("compressor")
    window = PriceTable.builtin().cheapest().context_window
    sent = len(json.dumps(compressor["messages"]).encode())
    assert sent + compressor["max_tokens"] * 4 <= window * 4  # prompt and output in its window
    assert "[... truncated:" in compressor["messages"][-1]["content"]
    [dep] = gateway.asked("dep")
    assert "### big (compressed)" in dep["messages"][-1]["content"]
    assert GIST in dep["messages"][-1]["content"]


async def test_a_compressor_that_cannot_run_leaves_the_truncated_text(
        database_url: str, tmp_path: Path) -> None:
    # the cheapest model by output reads at a price no budget here pays: its reservation
    # never fits, and the dependent (cheap to read) is sent the cut text instead
    models = tmp_path / "models.json"
    models.write_text(json.dumps({"models": {
        "main": {"input": "0.10", "output": "10", "context_window": 128_000},
        "squeeze": {"input": "100", "output": "1", "context_window": 128_000}}}))
    settings = make_settings(database_url, models_file=str(models), default_model="main")
    for gateway, code in ((Gateway(), "budget_exceeded"),
                          (Gateway(compressor_status=400), "gateway_rejected")):
        budget = 1.0 if code == "budget_exceeded" else 100.0
        done = await run(settings, gateway, swarm(budget, model="main"))
        assert done["status"] == "succeeded", done["error"]
        subs = {s["name"]: s for s in done["subtasks"]}
        assert (subs["@compress.big"]["status"], subs["@compress.big"]["error"]["code"]) == (
            "failed", code)
        assert subs["dep"]["status"] == "succeeded"
        [dep] = gateway.asked("dep")
        text = dep["messages"][-1]["content"]
        assert "### big\nBBBB" in text and "[... truncated:" in text
        assert len(text) < 128_000 * 3
