"""GET /metrics (SPEC §5): names, types, labels, buckets, zero series, route templates,
several processes, and the worker's own metrics port."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import Harness
from tests.helpers import agent, subtask_running, until

BIN = Path(sys.executable).parent
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
LATENCY_LE = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0,
              120.0, 300.0, 600.0, float("inf")]
SPEC: dict[str, tuple[str, set[str]]] = {
    "swarm_runs_total": ("counter", {"status"}),
    "swarm_run_duration_seconds": ("histogram", {"status"}),
    "swarm_subtask_duration_seconds": ("histogram", {"kind", "model", "status"}),
    "swarm_gateway_request_duration_seconds": ("histogram", {"model", "outcome"}),
    "swarm_gateway_requests_total": ("counter", {"model", "outcome"}),
    "swarm_tokens_total": ("counter", {"model", "type"}),
    "swarm_spend_usd_total": ("counter", {"model"}),
    "swarm_runs_in_progress": ("gauge", set()),
    "swarm_subtasks_in_flight": ("gauge", {"model"}),
    "swarm_gateway_retries_total": ("counter", {"model", "reason"}),
    "swarm_finish_reason_total": ("counter", {"model", "finish_reason"}),
    "swarm_budget_denials_total": ("counter", {"scope"}),
    "swarm_structured_outputs_total": ("counter", {"status"}),
    "swarm_run_cost_usd": ("histogram", {"status"}),
    "swarm_subtask_queue_wait_seconds": ("histogram", {"kind"}),
    "swarm_http_request_duration_seconds": ("histogram", {"method", "route", "status"}),
    "swarm_takeovers_total": ("counter", {"reason"}),
    "swarm_queue_oldest_age_seconds": ("gauge", set()),
}
SECRET_TASK = "metrics-task-do-not-label-me"


async def run_a_few(h: Harness) -> list[str]:
    bodies: list[dict[str, Any]] = [
        {"task": SECRET_TASK, "agents": [agent("a"), agent("b", "[[sim finish=length]]")]},
        {"task": SECRET_TASK, "agents": [agent("a", "[[sim fail=500 times=1 retry_after=0]]"),
                                         agent("b", "[[sim fail=429 times=1 retry_after=0]]")],
         "synthesis": {"strategy": "concatenate"}},
        {"task": SECRET_TASK, "agents": [agent("a")], "limits": {"budget_usd": "0.000001"}},
    ]
    ids = [(await h.run(b))["id"] for b in bodies]
    r = await h.post({"task": SECRET_TASK, "agents": [agent("slow", "[[sim latency_ms=5000]]")]})
    ids.append(r.json()["id"])
    await until(lambda: subtask_running(h, ids[-1]), 10, "the slow agent to run")
    assert (await h.client.post(f"/swarms/{ids[-1]}/cancel")).status_code == 202
    assert (await h.wait(ids[-1]))["status"] == "cancelled"
    await h.client.get(f"/swarms/{ids[0]}/events")
    await h.client.get("/nope/123")
    return ids


def families(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


async def test_every_spec_metric_with_type_labels_and_buckets(api: Harness) -> None:
    ids = await run_a_few(api)
    text = (await api.client.get("/metrics")).text
    fams = families(text)
    for name, (kind, labels) in SPEC.items():
        assert f"# TYPE {name} {kind}" in text, name
        family = fams[name.removesuffix("_total") if kind == "counter" else name]
        samples = [s for s in family.samples if not s.name.endswith("_created")]
        assert samples, f"{name} has no series"
        for s in samples:
            assert set(s.labels) - {"le"} == labels, (name, s.labels)
        if kind == "histogram":
            series = {tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
                      for s in samples}
            some = next(iter(series))
            le = [float(s.labels["le"]) for s in samples if s.name.endswith("_bucket")
                  and tuple(sorted((k, v) for k, v in s.labels.items() if k != "le")) == some]
            if name == "swarm_run_cost_usd":
                assert le[0] == 0.001 and le[-2] == 100.0, le
            else:
                assert le == LATENCY_LE, (name, le)
    # what happened is visible, under bounded labels only
    assert 'swarm_runs_total{status="cancelled"}' in text
    assert re.search(r'swarm_gateway_retries_total\{model="kimi-k2.5",reason="server_error"\} '
                     r"[1-9]", text)
    assert re.search(r'swarm_finish_reason_total\{finish_reason="length",model="kimi-k2.5"\} '
                     r"[1-9]", text)
    assert re.search(r'swarm_budget_denials_total\{scope="swarm"\} [1-9]', text)
    for line in text.splitlines():
        if not line.startswith("#"):
            assert not UUID.search(line), line
            assert SECRET_TASK not in line, line
            assert all(i not in line for i in ids)


async def test_http_histogram_uses_route_templates(api: Harness) -> None:
    ids = await run_a_few(api)
    text = (await api.client.get("/metrics")).text
    routes = set(re.findall(r'swarm_http_request_duration_seconds_count\{[^}]*route="([^"]*)"',
                            text))
    assert {"/swarms", "/swarms/{swarm_id}", "/swarms/{swarm_id}/cancel",
            "/swarms/{swarm_id}/events", "unmatched"} <= routes, routes
    assert not any(i in r for r in routes for i in ids)
    assert re.search(r'swarm_http_request_duration_seconds_count\{method="POST",route="/swarms",'
                     r'status="202"\} [1-9]', text)


def _render_in_new_process(env: dict[str, str] | None = None, code: str = "") -> str:
    script = f"from app import metrics\n{code}\nprint(metrics.render()[0].decode())"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env={**os.environ, **(env or {})}, timeout=60, check=True)
    return out.stdout


def test_known_series_are_exposed_at_zero_from_the_start() -> None:
    text = _render_in_new_process()  # (the exposition sorts each series' labels by name)
    for line in ('swarm_runs_total{status="cancelled"} 0.0',
                 'swarm_runs_total{status="succeeded"} 0.0',
                 "swarm_runs_in_progress 0.0",
                 'swarm_subtasks_in_flight{model="other"} 0.0',
                 'swarm_budget_denials_total{scope="daily"} 0.0',
                 'swarm_structured_outputs_total{status="invalid"} 0.0',
                 'swarm_gateway_requests_total{model="other",outcome="connection_error"} 0.0',
                 'swarm_tokens_total{model="gpt-4.1",type="completion"} 0.0',
                 'swarm_spend_usd_total{model="other"} 0.0',
                 'swarm_finish_reason_total{finish_reason="content_filter",model="kimi-k2.5"} 0.0',
                 'swarm_gateway_retries_total{model="deepseek-v3.2",reason="rate_limited"} 0.0',
                 'swarm_run_duration_seconds_bucket{le="600.0",status="failed"} 0.0',
                 'swarm_run_cost_usd_count{status="cancelled"} 0.0',
                 'swarm_subtask_queue_wait_seconds_count{kind="synthesizer"} 0.0',
                 'swarm_subtask_duration_seconds_count{kind="worker",model="other",'
                 'status="failed"} 0.0',
                 'swarm_gateway_request_duration_seconds_count{model="other",'
                 'outcome="timeout"} 0.0'):
        assert line in text, line
    for name in SPEC:
        assert f"# TYPE {name} " in text, name


def test_several_processes_add_up_in_multiprocess_mode(tmp_path: Path) -> None:
    env = {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    work = ("from app.pricing import PriceTable\n"
            "metrics.set_price_table(PriceTable.builtin())\n"
            "metrics.runs_total.labels('succeeded').inc()\n"
            "metrics.runs_in_progress.inc()\n"
            "metrics.spend_total.labels('kimi-k2.5').inc(0.25)\n"
            "import os; print(os.getpid())")
    pids = [int(_render_in_new_process(env, work).split("\n", 1)[0]) for _ in range(2)]
    text = _render_in_new_process(env)
    assert 'swarm_runs_total{status="succeeded"} 2.0' in text
    assert 'swarm_spend_usd_total{model="kimi-k2.5"} 0.5' in text
    assert "swarm_runs_in_progress 2.0" in text  # livesum: both still count...
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(pids[0], str(tmp_path))  # type: ignore[no-untyped-call]
    text = _render_in_new_process(env)
    assert "swarm_runs_in_progress 1.0" in text  # ...until a dead one is marked
    assert 'swarm_runs_total{status="succeeded"} 2.0' in text  # totals keep the dead's share
    assert text.count("swarm_price_table_info{") == 1  # livemax: one series, not one per pid


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_worker_serves_metrics_on_its_own_port(tmp_path: Path) -> None:
    port = _free_port()
    env = {**os.environ, "SWARM_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path}/w.db",
           "SWARM_METRICS_PORT": str(port), "SWARM_SHUTDOWN_GRACE_S": "0"}
    for key in ("SWARM_GATEWAY_URL", "PROMETHEUS_MULTIPROC_DIR"):
        env.pop(key, None)
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([str(BIN / "swarm-api"), "worker"], env=env, cwd=tmp_path,
                                stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 30
            while True:
                assert proc.poll() is None, log.read_text()
                try:
                    r = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2)
                    break
                except httpx.TransportError:
                    assert time.monotonic() < deadline, log.read_text()
                    time.sleep(0.2)
            assert r.status_code == 200
            assert 'swarm_runs_total{status="succeeded"} 0.0' in r.text
            assert "swarm_price_table_info{" in r.text
        finally:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(20)
    assert code == 0, log.read_text()


def test_a_worker_whose_metrics_port_is_taken_says_so_and_exits_1(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {**os.environ, "SWARM_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path}/w.db",
               "SWARM_METRICS_PORT": str(port), "SWARM_LOG_FORMAT": "text"}
        run = subprocess.run([str(BIN / "swarm-api"), "worker"], env=env, cwd=tmp_path,
                             capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 1, run.stderr
    assert run.stderr.strip() == (f"swarm-api worker: cannot serve /metrics on 127.0.0.1:{port} "
                                  "(SWARM_METRICS_PORT): [Errno 98] Address already in use")
