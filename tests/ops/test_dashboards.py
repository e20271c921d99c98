"""The shipped Grafana dashboard and provisioning, checked against a real Prometheus that
scrapes a real `swarm-api serve` after a few swarms."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "swarm-api.json"
BIN = Path(sys.executable).parent
# Grafana's variables, as Grafana would expand them for a short range
VARIABLES = {"$__rate_interval": "1m", "${__rate_interval}": "1m", "$__interval": "15s",
             "${__interval}": "15s", "$__range": "5m", "${__range}": "5m",
             "$model": ".*", "${model}": ".*", "$instance": ".*", "${instance}": ".*"}
MAIN_PANELS = ("Swarms per second by status", "Swarm duration p50 / p95 / p99",
               "Tokens per hour by model", "USD per hour by model", "Tool calls by outcome",
               "Tool call p95 by tool")
MCP_SERVER = ROOT / "examples" / "mcp" / "server.py"


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def panels() -> list[dict[str, Any]]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def expressions() -> list[tuple[str, str]]:
    """(panel title, PromQL with Grafana's variables expanded) for every target."""
    out = []
    for p in panels():
        for t in p["targets"]:
            expr = t["expr"]
            for var, value in VARIABLES.items():
                expr = expr.replace(var, value)
            assert "$" not in expr, f"unexpanded variable in {p['title']}: {expr}"
            out.append((p["title"], expr))
    return out


def test_provisioning_points_at_the_dashboards_and_datasource() -> None:
    sources = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/prometheus.yml")
                             .read_text())["datasources"]
    providers = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/dashboards.yml")
                               .read_text())["providers"]
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    mounts = compose["services"]["grafana"]["volumes"]
    assert "./deploy/grafana/dashboards:/var/lib/grafana/dashboards:ro" in mounts
    assert "./deploy/grafana/provisioning:/etc/grafana/provisioning:ro" in mounts
    assert providers[0]["options"]["path"] == "/var/lib/grafana/dashboards"
    assert sources[0]["url"] == "http://prometheus:9090"
    uid = sources[0]["uid"]
    for p in panels():
        assert p["datasource"]["uid"] == uid, p["title"]
        assert all(t["datasource"]["uid"] == uid for t in p["targets"]), p["title"]
    ids = [p["id"] for p in dashboard()["panels"]]
    assert len(ids) == len(set(ids))


def test_alert_panels_with_model_and_instance_variables() -> None:
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    for name, metric in (("model", "swarm_spend_usd_total"), ("instance", "swarm_runs_total")):
        v = variables[name]
        assert v["type"] == "query" and v["datasource"]["uid"] == "prometheus"
        assert v["query"]["query"] == f"label_values({metric}, {name})"
        assert v["includeAll"] and v["allValue"] == ".*"
    exprs = {p["title"]: p["targets"][0]["expr"] for p in panels()}
    unresolved = exprs["Unresolved spend by model"]
    assert "swarm_spend_unresolved_usd_total" in unresolved
    assert 'model=~"$model"' in unresolved and 'instance=~"$instance"' in unresolved
    for title, metric in (("Quota denials by limit", "swarm_quota_denials_total"),
                          ("Oldest queued swarm", "swarm_queue_oldest_age_seconds"),
                          ("Takeovers by reason", "swarm_takeovers_total")):
        assert metric in exprs[title] and 'instance=~"$instance"' in exprs[title], title


def test_workers_are_scraped() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    port = compose["services"]["worker"]["environment"]["SWARM_METRICS_PORT"]
    jobs = {j["job_name"]: j for j in yaml.safe_load(
        (DEPLOY / "prometheus" / "prometheus.yml").read_text())["scrape_configs"]}
    assert jobs["swarm-worker"]["dns_sd_configs"][0]["port"] == int(port)
    assert jobs["swarm-api"]["dns_sd_configs"][0]["port"] == 8000


def test_dashboard_covers_the_issue_and_uses_only_spec_metrics() -> None:
    titles = {p["title"] for p in panels()}
    for wanted in (*MAIN_PANELS, "Subtask duration p95 by model", "Gateway request p95 by model",
                   "Retries by reason", "Gateway requests by outcome", "Gateway error rate",
                   "Gateway calls in flight", "Budget denials"):
        assert wanted in titles, wanted
    spec = (ROOT.parent / "shared" / "SPEC.md")  # beside the clone in CI and here
    # SPEC §5 names metrics alone (`name`), §9 with their labels (`name{labels}`)
    names = set(re.findall(r"`(swarm_[a-z_]+)[`{]", spec.read_text())) if spec.exists() else set()
    if names:
        names.add("swarm_price_table_info")  # the issue's addition to SPEC §5
        names.add("swarm_subtasks_reused_total")  # issue 13 (retry), beside SPEC §11
    for title, expr in expressions():
        for metric in re.findall(r"\bswarm_[a-z_]+", expr):
            base = re.sub(r"_(bucket|count|sum)$", "", metric)
            assert not names or base in names, (title, metric)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, log.read_text()
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, f"{url} not up: {log.read_text()}"
        time.sleep(0.2)


def _spawn(args: list[str], env: dict[str, str], log: Path, cwd: Path
           ) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(args, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)


@pytest.fixture
def api_server(tmp_path: Path) -> Iterator[str]:
    """`swarm-api serve` as a real process: temp SQLite, the in-process simulator."""
    port = _free_port()
    env = {**os.environ, "SWARM_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path}/api.db",
           "SWARM_SIMULATOR_LATENCY_MS": "5", "SWARM_SIMULATOR_LATENCY_JITTER_MS": "0",
           "SWARM_POLL_INTERVAL_S": "0.2", "SWARM_SHUTDOWN_GRACE_S": "0",
           "SWARM_MCP_CONFIG": str(tmp_path / "mcp.json")}
    (tmp_path / "mcp.json").write_text(json.dumps({"mcpServers": {"files": {
        "command": sys.executable, "args": [str(MCP_SERVER)]}}}))
    for key in ("SWARM_GATEWAY_URL", "SWARM_API_KEYS", "PROMETHEUS_MULTIPROC_DIR"):
        env.pop(key, None)
    log = tmp_path / "api.log"
    proc = _spawn([str(BIN / "swarm-api"), "serve", "--port", str(port)], env, log, tmp_path)
    try:
        _wait_http(f"http://127.0.0.1:{port}/readyz", proc, log, timeout=90)  # + an MCP server
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(20)


def run_swarms(base: str, n: int) -> None:
    """Swarms on several models, one agent failing once (a retry), one over its budget."""
    bodies = [{"task": f"dash {i}", "model": m, "agents": [
        {"name": "a", "system_prompt": "[[sim fail=500 times=1 retry_after=0]]" if i == 0
         else "You are a."}, {"name": "b", "model": "deepseek-v3.2"}]}
        for i, m in enumerate(("kimi-k2.5", "gpt-4.1", "gemini-2.5-flash")[:n])]
    bodies.append({"task": "over budget", "limits": {"budget_usd": "0.000001"}})
    bodies.append({"task": "tools", "agents": [{"name": "t", "tools": ["files.lookup"],
                                                "prompt": "moon"}]})
    with httpx.Client(base_url=base, timeout=30) as c:
        ids = [c.post("/swarms", json=b).json()["id"] for b in bodies]
        for i in ids:
            assert c.get(f"/swarms/{i}", params={"wait": 20}).json()["status"] in (
                "succeeded", "failed")


def _prometheus_binary() -> str:
    found = shutil.which("prometheus") or (
        "/usr/bin/prometheus" if Path("/usr/bin/prometheus").exists() else None)
    if found is None:
        pytest.fail("the prometheus binary is missing: apt-get install -y prometheus "
                    "(.ci/run installs it)", pytrace=False)
    return found


def _scrapes(prom: httpx.Client) -> int:
    r = prom.get("/api/v1/query", params={"query": 'count_over_time(up{job="swarm"}[5m])'})
    result = r.json()["data"]["result"] if r.status_code == 200 else []
    return int(float(result[0]["value"][1])) if result else 0


def _wait_scrapes(prom: httpx.Client, n: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 30
    while _scrapes(prom) < n:
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, f"fewer than {n} scrapes: {log.read_text()}"
        time.sleep(0.3)


@pytest.mark.slow
def test_every_dashboard_query_runs_on_a_real_prometheus(api_server: str,
                                                        tmp_path: Path) -> None:
    binary = _prometheus_binary()
    run_swarms(api_server, 2)
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "swarm", "static_configs": [
            {"targets": [api_server.removeprefix("http://")]}]}]}))
    port = _free_port()
    log = tmp_path / "prometheus.log"
    proc = _spawn([binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path}/tsdb",
                   f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                  dict(os.environ), log, tmp_path)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as prom:
            _wait_http(f"http://127.0.0.1:{port}/-/ready", proc, log)
            _wait_scrapes(prom, 2, proc, log)
            run_swarms(api_server, 3)  # between scrapes, so every rate() moves
            _wait_scrapes(prom, 4, proc, log)
            results = {}
            for title, expr in expressions():
                body = prom.get("/api/v1/query", params={"query": expr}).json()
                assert body["status"] == "success", (title, expr, body)
                results.setdefault(title, []).append((expr, body["data"]["result"]))
    finally:
        proc.terminate()
        proc.wait(20)
    # the alert panels' series exist from the start (at zero)
    for title in (*MAIN_PANELS, "Unresolved spend by model", "Quota denials by limit",
                  "Oldest queued swarm", "Takeovers by reason"):
        for expr, series in results[title]:
            assert series, f"{title}: no data for {expr}"
    assert results["Price table version"][0][1], "swarm_price_table_info not scraped"
