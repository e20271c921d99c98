"""The CLI's client commands (`swarm-api submit/get/ls/watch/cancel/retry/erase/usage/audit`),
run as the console script against a real `swarm-api serve` on PostgreSQL."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from swarm_api_client import SwarmClient
from tests.client_support import API_KEY, SERVICE_ENV, cli, five_agents
from tests.procs import live_service
from tests.support import CLI, PG_URL, free_port, with_db

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


@pytest.fixture(scope="module")
def api_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with live_service(tmp_path_factory.mktemp("cli"), **SERVICE_ENV) as url:
        yield url


def body_file(tmp_path: Path, body: dict[str, Any]) -> str:
    path = tmp_path / f"swarm-{uuid.uuid4().hex[:6]}.json"
    path.write_text(json.dumps(body))
    return str(path)


def read(api_url: str, swarm_id: str) -> Any:
    with SwarmClient(api_url, api_key=API_KEY) as client:
        return client.get(swarm_id)


def test_submit_wait_prints_the_result_and_exits_0(api_url: str, tmp_path: Path) -> None:
    done = cli(api_url, "submit", body_file(tmp_path, five_agents("cli five")), "--wait")
    assert done.returncode == 0, done.stderr
    swarm_id = done.stdout.split()[1]
    swarm = read(api_url, swarm_id)
    assert swarm.status == "succeeded" and swarm.result
    assert swarm.result in done.stdout, "the result, unwrapped"
    assert f"swarm {swarm_id} succeeded" in done.stdout
    for name in ("agent_1", "agent_2", "agent_3", "agent_4", "agent_5", "@synthesizer"):
        row = next(line for line in done.stdout.splitlines() if line.split()[:1] == [name])
        assert "succeeded" in row and "kimi-k2.5" in row and "$" in row

    listed = cli(api_url, "ls")
    assert listed.returncode == 0 and swarm_id in listed.stdout

    watched = cli(api_url, "watch", swarm_id)
    assert watched.returncode == 0, watched.stderr
    assert f"swarm {swarm_id} succeeded" in watched.stdout and swarm.result in watched.stdout
    assert "@synthesizer" in watched.stdout

    refused = cli(api_url, "cancel", swarm_id)
    assert refused.returncode == 2 and "already_terminal" in refused.stderr


def test_failing_swarm_exits_non_zero_with_its_error_code(api_url: str, tmp_path: Path) -> None:
    body = five_agents("cli failing")
    body["agents"][2]["system_prompt"] += " [[sim fail=400]]"  # the gateway refuses agent_3
    failed = cli(api_url, "submit", "-", "--wait", stdin=json.dumps(body))
    assert failed.returncode == 1, failed.stdout + failed.stderr
    swarm_id = failed.stdout.split()[1]
    swarm = read(api_url, swarm_id)
    assert swarm.status == "failed" and swarm.error
    assert f"swarm {swarm_id} failed: {swarm.error['code']}" in failed.stderr
    assert swarm_id in cli(api_url, "ls", "--status", "failed").stdout

    retried = cli(api_url, "retry", swarm_id, "--wait", "--limits", '{"failure_tolerance": 0.5}')
    assert retried.returncode == 0, retried.stdout + retried.stderr
    new_id = retried.stderr.split("new swarm ")[1].split()[0]
    assert read(api_url, new_id).retry_of == swarm_id
    assert f"swarm {new_id} succeeded" in retried.stdout


def test_json_output_parses(api_url: str, tmp_path: Path) -> None:
    path = body_file(tmp_path, five_agents("cli json"))
    # two swarms of its own for `ls --limit 2`, whichever tests of the module ran before
    assert cli(api_url, "submit", path).returncode == 0
    waited = cli(api_url, "submit", path, "--wait", "--json")
    assert waited.returncode == 0, waited.stderr
    final = json.loads(waited.stdout)
    assert final["status"] == "succeeded" and final["result"]

    listed = json.loads(cli(api_url, "ls", "--json", "--limit", "2").stdout)
    assert [s["id"] for s in listed][:1] == [final["id"]] and len(listed) == 2
    events = [json.loads(line) for line in cli(api_url, "watch", final["id"], "--json")
              .stdout.splitlines()]
    assert [e["id"] for e in events] == list(range(1, len(events) + 1))
    assert events[-1]["event"] == "swarm.completed"
    usage = json.loads(cli(api_url, "usage", "--json").stdout)
    assert usage["group_by"] == "model" and usage["total"]["gateway_calls"] > 0
    assert "from" in usage
    audit = json.loads(cli(api_url, "audit", "--json", "--action", "create", "--limit",
                           "1").stdout)
    assert [(a["action"], a["swarm_id"]) for a in audit] == [("create", final["id"])]
    assert audit[0]["key_id"] and API_KEY not in json.dumps(audit)


def test_unreachable_service_and_refused_key(api_url: str, tmp_path: Path) -> None:
    down = cli(f"http://127.0.0.1:{free_port()}", "ls")
    assert down.returncode == 3 and "cannot reach the Swarm API" in down.stderr
    assert "SWARM_URL" in down.stderr and not down.stdout
    refused = cli(api_url, "ls", key="not-a-key")
    assert refused.returncode == 4 and "refused the API key" in refused.stderr
    invalid = cli(api_url, "submit", "-", stdin=json.dumps({"task": "x", "model": "nope"}))
    assert invalid.returncode == 2 and "unknown_model" in invalid.stderr


def test_a_bad_setting_stops_the_process_naming_it_not_its_value(tmp_path: Path) -> None:
    """One line a setting (its variable, what is wrong), exit 2, nothing created; a value is
    never echoed: a database URL carries its password."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWARM_")}
    env["SWARM_LOG_FORMAT"] = "text"  # the line itself, not a JSON record of it
    env.update(SWARM_DATABASE_URL="mysql://app:hunter2@db/swarm", SWARM_MAX_AGENTS="lots",
               SWARM_GATEWAY_URL="gateway.example/v1")
    run = subprocess.run([CLI, "serve", "--port", str(free_port())], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 2, run.stderr
    lines = run.stderr.splitlines()
    assert lines[0] == "swarm-api: invalid configuration:", run.stderr
    assert sorted(line.split(":")[0].split()[0] for line in lines[1:]) == [
        "SWARM_DATABASE_URL", "SWARM_GATEWAY_URL", "SWARM_MAX_AGENTS"], run.stderr
    assert "hunter2" not in run.stderr and "lots" not in run.stderr, run.stderr
    assert "Traceback" not in run.stderr and not list(tmp_path.iterdir())


@pytest.mark.parametrize(("database", "says"), [
    (f"postgresql+asyncpg://postgres@127.0.0.1:{free_port()}/test", "ConnectionRefusedError"),
    (with_db(PG_URL, "swarm_never_created"), 'database "swarm_never_created" does not exist'),
], ids=["refused", "not_created"])  # fixed ids: every xdist worker must collect the same tests
def test_migrate_says_in_a_line_why_it_cannot_reach_the_database(database: str, says: str,
                                                                  tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWARM_")}
    env["SWARM_LOG_FORMAT"] = "text"  # the line itself, not a JSON record of it
    env["SWARM_DATABASE_URL"] = database
    run = subprocess.run([CLI, "migrate"], env=env, cwd=tmp_path, capture_output=True,
                         text=True, timeout=60, check=False)
    assert run.returncode == 1, run.stderr
    assert run.stderr.startswith("swarm-api: cannot migrate: database unavailable (")
    assert says in run.stderr and "Traceback" not in run.stderr, run.stderr
    assert len(run.stderr.splitlines()) == 1, run.stderr  # nor the pool's INFO lines


@pytest.mark.parametrize(("workers", "database", "says"), [
    ("2", "sqlite+aiosqlite:///./swarm.db", "serve --workers needs PostgreSQL"),
    ("0", "sqlite+aiosqlite:///./swarm.db", "--workers must be at least 1"),
])
def test_serve_workers_refuses_what_it_cannot_run(workers: str, database: str, says: str,
                                                  tmp_path: Path) -> None:
    """Several processes need a database they can share (not the embedded SQLite file)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWARM_")}
    env["SWARM_LOG_FORMAT"] = "text"  # the line itself, not a JSON record of it
    env["SWARM_DATABASE_URL"] = database
    run = subprocess.run([CLI, "serve", "--workers", workers, "--port", str(free_port())],
                         env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60,
                         check=False)
    assert run.returncode == 2 and says in run.stderr, run.stderr
    assert not (tmp_path / "swarm.db").exists()  # refused before anything was created


def test_erase_removes_a_swarms_content(api_url: str, tmp_path: Path) -> None:
    done = cli(api_url, "submit", body_file(tmp_path, five_agents("cli erase")), "--wait")
    assert done.returncode == 0, done.stderr
    swarm_id = done.stdout.split()[1]
    erased = cli(api_url, "erase", swarm_id)
    assert erased.returncode == 0, erased.stderr
    assert erased.stdout == f"erased: {swarm_id}\n"
    swarm = read(api_url, swarm_id)
    assert swarm.erased and swarm.task == "" and swarm.result is None
    assert json.loads(cli(api_url, "erase", swarm_id, "--json").stdout) == {
        "id": swarm_id, "erased": True}
    missing = cli(api_url, "erase", str(uuid.uuid4()))
    assert missing.returncode == 2 and "not_found" in missing.stderr


def test_estimate_prints_the_figures_and_creates_nothing(api_url: str, tmp_path: Path) -> None:
    body = five_agents("cli estimate")
    done = cli(api_url, "estimate", body_file(tmp_path, body))
    assert done.returncode == 0, done.stderr
    lines = {line.split()[0]: line.split()[1:] for line in done.stdout.splitlines()}
    assert lines["plan"][:2] == ["5", "agents"]
    assert lines["cost_usd"][0] == "expected" and lines["cost_usd"][4] == "max"
    as_json = cli(api_url, "estimate", body_file(tmp_path, body), "--json")
    assert as_json.returncode == 0, as_json.stderr
    got = json.loads(as_json.stdout)
    assert [a["name"] for a in got["plan"]["agents"]] == [a["name"] for a in body["agents"]]
    assert got["cost_usd"]["max"] == lines["cost_usd"][5]
    refused = cli(api_url, "estimate", body_file(tmp_path, {**body, "model": "nope"}))
    assert refused.returncode == 2 and "unknown_model" in refused.stderr
