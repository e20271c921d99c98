"""app/logs.py and its settings (SPEC §17): the json and text formats, the context fields, the
levels, and what a real process writes in json (uvicorn's lines too, a refusal, the banner)."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from app import logs
from app.config import LogSettings, Settings
from tests.support import CLI, free_port

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def record(msg: str = "hello %s", *args: Any, level: int = logging.INFO,
           exc: bool = False, **extra: Any) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            exc_info = sys.exc_info()
    rec = logging.getLogger("app.test").makeRecord(
        "app.test", level, __file__, 1, msg, args or ("world",), exc_info, extra=extra)
    return rec


def as_json(rec: logging.LogRecord) -> dict[str, Any]:
    line = logs.JsonFormatter().format(rec)
    assert "\n" not in line  # one record, one line: a traceback included
    out: dict[str, Any] = json.loads(line)
    return out


# ---- formats -------------------------------------------------------------------------------


def test_a_json_line_has_time_level_logger_message_and_the_extra_fields() -> None:
    line = as_json(record(status="succeeded", cost_usd=0.25, calls=3))
    assert set(line) == {"time", "level", "logger", "message", "status", "cost_usd", "calls"}
    assert line["level"] == "INFO" and line["logger"] == "app.test"
    assert line["message"] == "hello world"
    assert line["time"].endswith("Z") and line["time"][:4].isdigit()
    assert (line["status"], line["cost_usd"], line["calls"]) == ("succeeded", 0.25, 3)


def test_a_traceback_stays_inside_its_json_object() -> None:
    line = as_json(record(level=logging.ERROR, exc=True))
    assert line["level"] == "ERROR"
    assert "RuntimeError: boom" in line["exc_info"] and "Traceback" in line["exc_info"]


def test_the_text_format_appends_context_and_extra_fields() -> None:
    with logs.bound(swarm_id="s-1", tenant="acme"):
        text = logs.TextFormatter().format(record(calls=2))
    assert text.endswith(" INFO app.test hello world swarm_id=s-1 tenant=acme calls=2")
    plain = logs.TextFormatter().format(record())
    assert plain.endswith(" INFO app.test hello world")  # nothing bound: nothing added


def test_uvicorns_colour_copy_of_the_message_is_not_a_field() -> None:
    assert "color_message" not in as_json(record(color_message="\x1b[1mhello\x1b[0m"))


# ---- context -------------------------------------------------------------------------------


def test_bound_fields_appear_on_every_line_until_the_block_ends() -> None:
    with logs.bound(swarm_id="s-1", tenant="acme", traceparent=TRACEPARENT):
        line = as_json(record())
        assert (line["swarm_id"], line["tenant"], line["trace_id"]) == (
            "s-1", "acme", "4bf92f3577b34da6a3ce929d0e0e4736")
        with logs.bound(swarm_id="s-2"):  # the others stay
            inner = as_json(record())
            assert (inner["swarm_id"], inner["tenant"]) == ("s-2", "acme")
        assert as_json(record())["swarm_id"] == "s-1"
    assert not {"swarm_id", "tenant", "trace_id"} & set(as_json(record()))


def test_a_lines_own_fields_win_over_the_bound_ones() -> None:
    with logs.bound(swarm_id="s-1"):
        assert as_json(record(swarm_id="s-9"))["swarm_id"] == "s-9"


def test_a_task_inherits_its_starters_context_unless_detached() -> None:
    async def line() -> dict[str, Any]:
        return as_json(record())

    async def main() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        logs.bind(swarm_id="s-1", tenant="acme")  # this task's own context
        child = await asyncio.create_task(line())
        detached = await asyncio.create_task(line(), context=logs.detached())
        return child, detached, as_json(record())

    child, detached, own = asyncio.run(main())
    assert child["swarm_id"] == own["swarm_id"] == "s-1"
    assert "swarm_id" not in detached and "tenant" not in detached
    assert "swarm_id" not in as_json(record())  # asyncio.run's context was a copy


@pytest.mark.parametrize("value", ["", "garbage", "00-abc", None])
def test_no_trace_id_from_a_missing_or_malformed_traceparent(value: str | None) -> None:
    assert logs.trace_id_of(value) is None


# ---- settings and configuration ------------------------------------------------------------


def test_unset_the_format_is_text_on_a_terminal_else_json() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert logs.resolve_format(None, Tty()) == "text"
    assert logs.resolve_format(None, io.StringIO()) == "json"
    assert logs.resolve_format("json", Tty()) == "json"
    assert logs.resolve_format("text", io.StringIO()) == "text"


def test_the_settings_read_and_check_format_and_level(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWARM_LOG_FORMAT", "JSON")
    monkeypatch.setenv("SWARM_LOG_LEVEL", "warning")
    monkeypatch.setenv("SWARM_ACCESS_LOG", "1")
    got = LogSettings()
    assert (got.log_format, got.log_level, got.access_log) == ("json", "WARNING", True)
    settings = Settings(database_url="sqlite+aiosqlite:///:memory:")
    assert (settings.log_format, settings.log_level) == ("json", "WARNING")
    monkeypatch.setenv("SWARM_LOG_FORMAT", "")
    assert LogSettings().log_format is None  # empty = unset
    monkeypatch.setenv("SWARM_LOG_FORMAT", "xml")
    with pytest.raises(ValidationError, match="log_format"):
        LogSettings()
    monkeypatch.setenv("SWARM_LOG_FORMAT", "text")
    monkeypatch.setenv("SWARM_LOG_LEVEL", "LOUD")
    with pytest.raises(ValidationError, match="SWARM_LOG_LEVEL must be one of"):
        LogSettings()


def test_defaults_are_info_and_no_access_log(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SWARM_LOG_FORMAT", "SWARM_LOG_LEVEL", "SWARM_ACCESS_LOG"):
        monkeypatch.delenv(name, raising=False)
    got = LogSettings(_env_file=None)  # type: ignore[call-arg]
    assert (got.log_format, got.log_level, got.access_log) == (None, "INFO", False)


# the logging module's process-wide switches configure() turns off (logs.lean_records)
_SWITCHES = ("logThreads", "logProcesses", "logMultiprocessing")


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """configure() changes the root logger: put back what pytest's capture set up."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    named = {n: (logging.getLogger(n).handlers[:], logging.getLogger(n).level,
                 logging.getLogger(n).propagate) for n in logs.config()["loggers"]}
    switches = {n: getattr(logging, n) for n in _SWITCHES}
    yield
    for n, value in switches.items():
        setattr(logging, n, value)
    root.handlers[:] = handlers
    root.setLevel(level)
    for n, (h, lv, prop) in named.items():
        logging.getLogger(n).handlers[:] = h
        logging.getLogger(n).setLevel(lv)
        logging.getLogger(n).propagate = prop


def test_configure_sends_every_logger_uvicorns_included_through_one_handler(
        restore_logging: None, capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure("json", "WARNING")
    logging.getLogger("uvicorn.error").warning("uvicorn says %s", "hi")
    logging.getLogger("app.engine.runner").info("below the level")
    logging.getLogger("app.engine.runner").error("above it")
    logging.getLogger("httpx").warning("httpx at warning")
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert [(d["logger"], d["message"]) for d in lines] == [
        ("uvicorn.error", "uvicorn says hi"), ("app.engine.runner", "above it"),
        ("httpx", "httpx at warning")]
    assert logs.is_json()
    logs.configure("text", "DEBUG")
    logging.getLogger("aiosqlite").debug("executing <a statement's parameters>")
    logging.getLogger("mcp.client").debug("a tool's message")
    logging.getLogger("app.x").debug("now seen")
    assert capsys.readouterr().err.rstrip().splitlines()[-1].endswith(" DEBUG app.x now seen")
    assert not logs.is_json()


def test_configured_records_leave_out_what_no_line_writes(
        restore_logging: None, capsys: pytest.CaptureFixture[str]) -> None:
    """A configured process's records carry no thread or process names or ids (no formatter
    writes them; filling them is work on every record), and its lines keep every field: the
    same line as a record with them all."""
    logs.configure("json", "INFO")
    assert not any(getattr(logging, n) for n in _SWITCHES)
    lean = record("swarm %s created", "s1", swarm_id="s1", subtasks=1, queue_position=None)
    assert (lean.threadName, lean.thread, lean.processName, lean.process) == (
        None, None, None, None)
    for n in _SWITCHES:
        setattr(logging, n, True)
    full = record("swarm %s created", "s1", swarm_id="s1", subtasks=1, queue_position=None)
    assert full.threadName and full.process
    full.created, full.msecs = lean.created, lean.msecs
    line = json.loads(logs.JsonFormatter().format(lean))
    assert line == json.loads(logs.JsonFormatter().format(full))
    assert line == {"time": line["time"], "level": "INFO", "logger": "app.test",
                    "message": "swarm s1 created", "swarm_id": "s1", "subtasks": 1,
                    "queue_position": None}
    text = logs.TextFormatter()
    assert text.format(lean) == text.format(full)


def test_debug_is_the_services_own_other_libraries_stay_at_info(
        restore_logging: None, capsys: pytest.CaptureFixture[str]) -> None:
    """Their debug lines carry what a line must not: aiosqlite's the statements' parameters,
    the MCP SDK's the tool messages."""
    logs.configure("json", "DEBUG")
    logging.getLogger("aiosqlite").debug("executing <a prompt>")
    logging.getLogger("mcp.client.stdio").debug("<a tool result>")
    logging.getLogger("aiosqlite").info("an info line")
    logging.getLogger("app.engine.runner").debug("ours")
    logging.getLogger("swarm_api").debug("ours too")
    logging.getLogger("uvicorn.error").debug("uvicorn's")
    lines = [json.loads(line)["message"] for line in capsys.readouterr().err.splitlines()]
    assert lines == ["an info line", "ours", "ours too", "uvicorn's"]


# ---- a real process ------------------------------------------------------------------------


def clean_env(**env: str) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith("SWARM_")}
    out.update(env)
    return out


def serve_until_ready(tmp_path: Path, **env: str) -> tuple[list[str], int]:
    """`serve` on SQLite with stderr piped (not a terminal) until /readyz answers, then
    SIGTERM: its output's lines and port."""
    port = free_port()
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([CLI, "serve", "--port", str(port)], cwd=tmp_path,
                                env=clean_env(**env), stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert proc.poll() is None, log.read_text()
                time.sleep(0.1)
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
        finally:
            if proc.poll() is None:
                proc.kill()
    return log.read_text().splitlines(), port


def test_piped_serve_writes_only_json_lines_uvicorns_and_the_banner_included(
        tmp_path: Path) -> None:
    lines, port = serve_until_ready(tmp_path)
    records = [json.loads(line) for line in lines]  # every line: one JSON object
    assert all({"time", "level", "logger", "message"} <= set(r) for r in records)
    loggers = {r["logger"] for r in records}
    assert "uvicorn.error" in loggers, lines
    messages = [r["message"] for r in records]
    base = f"http://127.0.0.1:{port}"
    assert any(base in m and f"{base}/docs" in m and f"{base}/ui" in m for m in messages)
    off = [r for r in records if "auth is off" in r["message"]]
    assert off and off[0]["level"] == "WARNING", messages
    assert any("Uvicorn running on" in m for m in messages)


def test_text_at_warning_drops_info_lines(tmp_path: Path) -> None:
    lines, _ = serve_until_ready(tmp_path, SWARM_LOG_FORMAT="text", SWARM_LOG_LEVEL="WARNING")
    assert lines and all(" WARNING " in line or " ERROR " in line for line in lines), lines
    assert any("auth is off" in line for line in lines)
    assert not any("Uvicorn running on" in line for line in lines)  # uvicorn's INFO too


def test_a_refused_setting_is_one_json_record_in_json(tmp_path: Path) -> None:
    run = subprocess.run([CLI, "serve", "--port", str(free_port())], cwd=tmp_path,
                         env=clean_env(SWARM_LOG_FORMAT="json", SWARM_MAX_AGENTS="lots"),
                         capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 2, run.stderr
    [line] = run.stderr.splitlines()
    record = json.loads(line)
    assert record["level"] == "ERROR" and "SWARM_MAX_AGENTS" in record["message"]
    assert "lots" not in line


def test_a_bad_log_setting_itself_is_refused_plainly(tmp_path: Path) -> None:
    run = subprocess.run([CLI, "migrate"], cwd=tmp_path, env=clean_env(SWARM_LOG_LEVEL="LOUD"),
                         capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 2
    assert run.stderr.startswith("swarm-api: invalid configuration:")
    assert "SWARM_LOG_LEVEL" in run.stderr


def test_migrate_says_it_in_json_when_asked(tmp_path: Path) -> None:
    run = subprocess.run([CLI, "migrate"], cwd=tmp_path, env=clean_env(
        SWARM_LOG_FORMAT="json", SWARM_DATABASE_URL=f"sqlite+aiosqlite:///{tmp_path}/m.db"),
        capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stderr
    records = [json.loads(line) for line in (run.stdout + run.stderr).splitlines()]
    assert any(r["message"] == "database at head" for r in records)
    assert any(r["logger"].startswith("alembic") for r in records)
