"""LiteLLM's proxy (PyPI `litellm[proxy]`, its own virtualenv) as the gateway, in front of the
simulator as its own process: money exact (ledger = what the gateway answered), the provider's
wait hint honoured through LiteLLM's renamed headers (SPEC §4), and a model LiteLLM does not map
failing the swarm with its cause named (SPEC §3)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.gateway.client import GatewayClient
from app.pricing import BUILTIN_MODELS
from tests.conftest import app_on, make_settings
from tests.interop.conftest import neighbour
from tests.support import CLI, free_port

MASTER = "sk-interop-master-0123456789"
MAPPED = [m for m in BUILTIN_MODELS if m != "gpt-4.1"]  # gpt-4.1: a model LiteLLM lacks
HEADERS = {"Authorization": "Bearer k1"}


def _wait(url: str, proc: subprocess.Popen[bytes], log: Path, **kw: Any) -> None:
    deadline = time.monotonic() + 120  # LiteLLM's proxy imports for a long while
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
        try:
            if httpx.get(url, timeout=2, **kw).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"{url} did not answer:\n{log.read_text(errors='replace')[-3000:]}")


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(LiteLLM's base URL, the simulator's) with both processes running."""
    work = tmp_path_factory.mktemp("litellm")
    sim_port, proxy_port = free_port(), free_port()
    sim_url = f"http://127.0.0.1:{sim_port}/v1"
    models = "\n".join(
        f"  - model_name: {m}\n    litellm_params:\n      model: openai/{m}\n"
        f"      api_base: {sim_url}\n      api_key: sim\n      max_retries: 0" for m in MAPPED)
    # one retry layer, ours: LiteLLM's own retries off (docs/GATEWAYS.md)
    (work / "config.yaml").write_text(
        f"model_list:\n{models}\nlitellm_settings:\n  num_retries: 0\n"
        f"router_settings:\n  num_retries: 0\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWARM_")}
    sim_log, proxy_log = work / "sim.log", work / "litellm.log"
    procs = [
        subprocess.Popen([CLI, "simulator", "--port", str(sim_port)], env={
            **env, "SWARM_SIM_LATENCY_MS": "20"},
            stdout=sim_log.open("wb"), stderr=subprocess.STDOUT),
        subprocess.Popen([neighbour(".venv-litellm", "litellm"), "--config",
                          str(work / "config.yaml"), "--host", "127.0.0.1",
                          "--port", str(proxy_port)],
                         env={**env, "LITELLM_MASTER_KEY": MASTER,
                              "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
                         stdout=proxy_log.open("wb"), stderr=subprocess.STDOUT, cwd=work)]
    try:
        _wait(f"{sim_url}/_stats", procs[0], sim_log)
        _wait(f"http://127.0.0.1:{proxy_port}/v1/models", procs[1], proxy_log,
              headers={"Authorization": f"Bearer {MASTER}"})
        yield f"http://127.0.0.1:{proxy_port}/v1", sim_url
    finally:
        for p in procs:
            p.kill()
            p.wait()


@pytest.fixture
async def api(database_url: str, gateway: tuple[str, str]) -> AsyncIterator[httpx.AsyncClient]:
    httpx.post(f"{gateway[1]}/_reset")
    settings = make_settings(database_url, api_keys="t1:k1", gateway_url=gateway[0],
                             gateway_api_key=MASTER)
    async with app_on(settings, GatewayClient(gateway[0], MASTER)) as client:
        client.headers.update(HEADERS)
        yield client


async def _run(api: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
    r = await api.post("/swarms", json=body)
    assert r.status_code == 202, r.text
    for _ in range(12):
        r = await api.get(f"/swarms/{r.json()['id']}", params={"wait": 10})
        data: dict[str, Any] = r.json()
        if data["status"] in ("succeeded", "failed", "cancelled"):
            return data
    raise AssertionError(f"not terminal: {data['status']}")


async def test_money_is_exact_through_litellm(api: httpx.AsyncClient,
                                              gateway: tuple[str, str]) -> None:
    body = {"task": "review the service", "agents": [
        {"name": f"a{i}", "model": MAPPED[i % len(MAPPED)]} for i in range(8)],
        "synthesis": {"model": "kimi-k2.5"}}
    done = await _run(api, body)
    assert done["status"] == "succeeded", done["error"]
    sim = httpx.get(f"{gateway[1]}/_stats").json()
    answered = [t for per_model in sim["answered"].values() for t in per_model.values()]
    billed = (sum(t[0] for t in answered), sum(t[1] for t in answered), sum(t[3] for t in answered))
    usage = done["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"], usage["gateway_calls"]) == billed
    total = (await api.get("/usage")).json()["total"]
    assert total["cost_usd"] == usage["cost_usd"]


async def test_the_providers_wait_hint_is_honoured_through_litellm(
        api: httpx.AsyncClient) -> None:
    """LiteLLM sends the provider's Retry-After as `llm_provider-retry-after`: the retry waits
    the 1.5 s asked, not our own backoff."""
    body = {"task": "t", "synthesis": {"strategy": "none"}, "agents": [
        {"name": "a", "prompt": "[[sim fail=429 times=1 retry_after=1.5]]"}]}
    done = await _run(api, body)
    assert done["status"] == "succeeded", done["error"]
    a = done["subtasks"][0]
    assert a["attempts"] == 2 and 1500 <= a["latency_ms"] < 4000, a


async def test_a_model_litellm_lacks_names_its_cause_on_the_swarm(
        api: httpx.AsyncClient) -> None:
    body = {"task": "t", "model": "gpt-4.1", "synthesis": {"strategy": "none"},
            "agents": [{"name": "a"}, {"name": "b"}]}
    done = await _run(api, body)
    assert (done["status"], done["error"]["code"]) == ("failed", "failure_tolerance_exceeded")
    assert done["error"]["details"]["causes"] == {"gateway_rejected": 1}, done["error"]
    assert all(s["attempts"] == 1 for s in done["subtasks"] if s["status"] == "failed")


def test_python_is_ours() -> None:
    """The proxy runs from its own virtualenv: never imported by the service's."""
    assert "litellm" not in sys.modules
