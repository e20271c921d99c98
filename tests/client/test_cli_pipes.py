"""The CLI written to pipes, as scripts use it (SPEC §13): plain columns of whole values (no
ellipsis, ids whole) at any width, one line and its exit status for each mistake (never a
traceback), failed subtasks with their reasons, --summary, a 1,000-agent swarm's report kept
short with pointers to the whole of it, --version and a help that says how to use it. Run
through real pipes (`bash -c '... | cat'`) against a live `swarm-api serve`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import uuid
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

from swarm_api_client import SwarmClient
from tests.client_support import API_KEY, SERVICE_ENV, five_agents
from tests.procs import live_service
from tests.support import CLI, free_port

pytestmark = [pytest.mark.postgres, pytest.mark.slow]
UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


@pytest.fixture(scope="module")
def api_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with live_service(tmp_path_factory.mktemp("cli_pipes"), **SERVICE_ENV) as url:
        yield url


def piped(api_url: str, command: str, *, key: str = API_KEY, cwd: Path | None = None,
          timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`command` (with `swarm-api` for the console script) in bash, its stdout through `| cat`
    (a pipe, as a script's); the status is the CLI's (PIPESTATUS), stderr the CLI's own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWARM_")}
    # a narrow terminal's width must not cut anything written to a pipe
    env.update({"SWARM_URL": api_url, "SWARM_API_KEY": key, "COLUMNS": "40"})
    at = command[: command.index("swarm-api")].count("|")  # the CLI's place in the pipeline
    script = f"{command.replace('swarm-api', CLI, 1)} | cat; exit ${{PIPESTATUS[{at}]}}"
    return subprocess.run(["bash", "-c", script], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, check=False)


def client(api_url: str) -> SwarmClient:
    return SwarmClient(api_url, api_key=API_KEY)


def write(path: Path, body: dict[str, Any]) -> Path:
    path.write_text(json.dumps(body))
    return path


def assert_whole(text: str) -> None:
    assert "…" not in text and "..." not in text, text


def test_ls_get_and_usage_print_whole_values_to_a_pipe(api_url: str) -> None:
    task = "A task long enough to be cut at forty columns: " + "word " * 30
    with client(api_url) as c:
        done = c.wait(c.create({**five_agents("x"), "task": task}).id, timeout=60)
    listed = piped(api_url, "swarm-api ls --limit 5")
    assert listed.returncode == 0 and not listed.stderr, listed.stderr
    assert_whole(listed.stdout)
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["id", "status", "succeeded", "cost", "age", "task"]
    row = next(line for line in lines if line.startswith(done.id))
    assert row.split()[:4] == [done.id, "succeeded", "6/6", f"${done.usage.cost_usd}"]
    assert row.endswith(" ".join(task.split())), "the task whole, on one line"
    assert all(re.fullmatch(UUID, line.split()[0]) for line in lines[1:])

    got = piped(api_url, f"swarm-api get {done.id}")
    assert got.returncode == 0 and not got.stderr, got.stderr
    assert_whole(got.stdout)
    assert got.stdout.startswith(f"swarm {done.id} succeeded in ")
    for s in done.subtasks:
        assert any(line.split()[:3] == [s.name, "succeeded", s.model]
                   for line in got.stdout.splitlines()), s.name
    assert done.result and got.stdout.rstrip().endswith(done.result.rstrip())

    usage = piped(api_url, "swarm-api usage")
    assert usage.returncode == 0 and not usage.stderr
    assert usage.stdout.splitlines()[0].split() == [
        "model", "calls", "prompt_tokens", "completion_tokens", "cost_usd"]
    assert usage.stdout.splitlines()[-1].split()[0] == "total"
    assert json.loads(piped(api_url, "swarm-api ls --json --limit 1").stdout)[0]["id"]


@pytest.mark.parametrize(("command", "key", "status", "says"), [
    ("swarm-api ls --url localhost:8000", API_KEY, 2,
     "--url 'localhost:8000' is not an http:// or https:// URL (did you mean "
     "http://localhost:8000?)"),
    ("swarm-api ls --url http://", API_KEY, 2, "--url 'http://' names no host"),
    (f"swarm-api ls --url http://127.0.0.1:{free_port()}", API_KEY, 3,
     "cannot reach the Swarm API at http://127.0.0.1:"),
    ("swarm-api ls", "not-the-key", 4, "refused the API key"),
    ("swarm-api submit no-such-file.json", API_KEY, 2,
     "cannot read no-such-file.json: No such file or directory"),
    ("echo '{\"task\": ' | swarm-api submit -", API_KEY, 2, "stdin is not valid JSON"),
    ("echo '[1, 2]' | swarm-api submit -", API_KEY, 2, "must be a JSON object"),
    ("echo '{\"task\": \"t\", \"model\": \"nope\"}' | swarm-api submit -", API_KEY, 2,
     "unknown_model"),
    (f"swarm-api get {uuid.uuid4()}", API_KEY, 2, "404 not_found"),
    ("swarm-api retry x --limits '[1'", API_KEY, 2, "--limits is not valid JSON"),
], ids=["url_without_scheme", "malformed_url", "unreachable", "wrong_key", "missing_file",
        "bad_json", "not_an_object", "refused_body", "unknown_swarm", "bad_limits"])
def test_each_mistake_is_one_line_and_its_exit_status(api_url: str, command: str, key: str,
                                                      status: int, says: str) -> None:
    ran = piped(api_url, command, key=key)
    assert ran.returncode == status, (ran.returncode, ran.stderr)
    assert len(ran.stderr.splitlines()) == 1 and ran.stderr.startswith("swarm-api: ")
    assert says in ran.stderr and "Traceback" not in ran.stderr, ran.stderr
    assert not ran.stdout


def test_failed_subtasks_are_shown_with_their_reasons(api_url: str, tmp_path: Path) -> None:
    body = five_agents("cli pipes failing")
    body["agents"][1]["system_prompt"] += " [[sim fail=400]]"
    failed = piped(api_url, f"swarm-api submit {write(tmp_path / 'f.json', body)} --wait")
    assert failed.returncode == 1, failed.stderr
    swarm_id = failed.stdout.split()[1]
    with client(api_url) as c:
        swarm = c.get(swarm_id)
    reason = f"{swarm.subtasks[1].error['code']}: {swarm.subtasks[1].error['message']}"
    row = next(line for line in failed.stdout.splitlines() if line.startswith("agent_2 "))
    assert row.split()[1] == "failed" and row.endswith(reason), row
    assert f"error: {swarm.error['code']}" in failed.stdout
    assert failed.stderr == (f"swarm-api: swarm {swarm_id} failed: {swarm.error['code']}: "
                             f"{swarm.error['message']} (1 failed subtask)\n")

    summary = piped(api_url, f"swarm-api get {swarm_id} --summary")
    lines = summary.stdout.splitlines()
    assert summary.returncode == 0 and lines[0].startswith(f"swarm {swarm_id} failed")
    assert lines[1].startswith("subtasks: ") and "1 failed" in lines[1]
    assert lines[2:4] == ["failed subtasks (1):", f"  agent_2  {reason}"]
    assert not any(line.startswith("subtask ") for line in lines), "no table"


def test_a_thousand_agents_print_a_short_report_with_pointers(api_url: str,
                                                              tmp_path: Path) -> None:
    agents = [{"name": f"a{i}", "system_prompt": "Answer." + (" [[sim fail=400]]"
                                                              if i % 40 == 0 else "")}
              for i in range(1000)]
    body = {"task": "wide", "agents": agents, "synthesis": {"strategy": "concatenate"},
            "limits": {"concurrency": 64, "failure_tolerance": 0.5, "budget_usd": 5}}
    done = piped(api_url, f"swarm-api submit {write(tmp_path / 'wide.json', body)} --wait",
                 timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) < 100, len(lines)
    swarm_id = lines[0].split()[1]
    assert lines[1] == "subtasks: 975 succeeded, 25 failed"
    assert f"1000 subtasks: `swarm-api get {swarm_id} --all` lists every one" in lines
    listed = lines.index("failed subtasks (20+):")
    assert [line.split()[0] for line in lines[listed + 1:listed + 21]] == [
        f"a{i}" for i in range(0, 800, 40)]
    assert lines[listed + 1].split()[1] == "gateway_rejected:"
    assert "… and 5 more failed subtasks" in done.stdout
    assert lines[-1].startswith("… result cut: ") and \
        f"`swarm-api get {swarm_id} --result` prints it whole" in lines[-1]

    with client(api_url) as c:
        swarm = c.get(swarm_id)
    assert swarm.result
    whole = piped(api_url, f"swarm-api get {swarm_id} --result")
    assert whole.returncode == 0 and whole.stdout.rstrip("\n") == swarm.result.rstrip("\n")
    every = piped(api_url, f"swarm-api get {swarm_id} --all --summary")
    assert len(every.stdout.splitlines()) < 40, "--summary wins over --all"
    every = piped(api_url, f"swarm-api get {swarm_id} --all")
    names = {line.split()[0] for line in every.stdout.splitlines() if line[:1] == "a"}
    assert {f"a{i}" for i in range(1000)} <= names

    # a reader that stops early: no traceback, no complaint about the pipe
    head = piped(api_url, f"swarm-api get {swarm_id} --all | head -1")
    assert head.returncode == 0 and not head.stderr, head.stderr
    assert head.stdout.startswith(f"swarm {swarm_id} ")


def test_version_and_help(api_url: str) -> None:
    ran = piped(api_url, "swarm-api --version")
    assert ran.returncode == 0 and ran.stdout == f"swarm-api {version('swarm-api')}\n"
    top = piped(api_url, "swarm-api --help")
    assert top.returncode == 0
    for needed in ("run LLM agent swarms", "examples:", "swarm-api submit examples/dag.json",
                   "exit statuses", "130", "environment:", "SWARM_URL", "SWARM_API_KEY"):
        assert needed in top.stdout, needed
    sub = piped(api_url, "swarm-api submit --help")
    for needed in ("--wait", "--summary", "--all", "examples:", "exit statuses", "SWARM_URL"):
        assert needed in sub.stdout, needed
