"""Every fenced Python and shell block of README.md runs as written, from the repository root,
against the service `make run` starts: in order, as a reader in a second terminal would.

The one liberty is the port: the service listens on a free one (`PORT`, which the Makefile
reads), so `127.0.0.1:8000` in a block becomes that port and `SWARM_URL` points at it. A line
`[VAR=value ...] make run` (re)starts the service with those variables, as the reader's first
terminal does; `make test` is checked with `make -n` (running the suite inside itself would
recurse). A block whose first line is a comment saying `not runnable` is skipped (Docker)."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path

import httpx
import pytest

from app.simulator.directives import FAIL_KINDS, PLAN_KINDS, Directives
from tests.support import free_port

pytestmark = [pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SHELL = {"bash", "sh", "shell", "console"}
PYTHON = {"python", "py"}
NOT_RUN = {"text", "toml", "json", "yaml"}  # shown, not run: synopses and files
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.M | re.S)


@dataclass
class Block:
    lang: str
    code: str
    line: int

    @property
    def skipped(self) -> bool:
        first = self.code.lstrip().splitlines()[0] if self.code.strip() else ""
        return first.startswith("#") and "not runnable" in first


def blocks(text: str) -> list[Block]:
    return [Block(m.group(1).strip(), m.group(2), text[: m.start()].count("\n") + 1)
            for m in FENCE.finditer(text)]


class Service:
    """`make run` in its own process group, restarted with the variables a block gives."""

    def __init__(self, env: dict[str, str], url: str, log: Path) -> None:
        self.env, self.url, self.log = env, url, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, assignments: dict[str, str]) -> None:
        self.stop()
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(["make", "run"], cwd=ROOT, env={**self.env,
                                         **assignments}, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"make run exited:\n{self.log.read_text()}"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return
            time.sleep(0.3)
        raise AssertionError(f"make run did not get ready:\n{self.log.read_text()}")

    def stop(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    port = free_port()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SWARM_", "MAKE", "MFLAGS"))}
    env.update(PORT=str(port), HOST="127.0.0.1", SWARM_URL=f"http://127.0.0.1:{port}",
               SWARM_DATABASE_URL=f"sqlite+aiosqlite:///{tmp_path / 'swarm.db'}")
    svc = Service(env, f"http://127.0.0.1:{port}", tmp_path / "make-run.log")
    try:
        yield svc
    finally:
        svc.stop()


def make_line(line: str) -> tuple[dict[str, str], str] | None:
    """(variables, target) when the line is `[VAR=value ...] make run|test`, else None."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError:  # a line of a multi-line command
        return None
    assignments = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        name, _, value = words.pop(0).partition("=")
        assignments[name] = value
    if words[:1] == ["make"] and len(words) == 2 and words[1] in ("run", "test"):
        return assignments, words[1]
    return None


def run_shell(script: str, env: dict[str, str], where: str) -> None:
    ran = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300, check=False)
    told = f"{where}\n--- script\n{script}\n--- stdout\n{ran.stdout}\n--- stderr\n{ran.stderr}"
    assert ran.returncode == 0, told
    assert "Traceback" not in ran.stdout + ran.stderr, told
    assert ran.stdout.strip(), told


def run_block(block: Block, service: Service) -> None:
    port = service.url.rsplit(":", 1)[1]
    code = block.code.replace("127.0.0.1:8000", f"127.0.0.1:{port}").replace(
        "localhost:8000", f"localhost:{port}")
    where = f"README.md line {block.line} ({block.lang})"
    if block.lang in PYTHON:
        ran = subprocess.run([str(ROOT / ".venv/bin/python"), "-"], input=code, cwd=ROOT,
                             env=service.env, capture_output=True, text=True, timeout=300,
                             check=False)
        told = f"{where}\n{code}\n--- stdout\n{ran.stdout}\n--- stderr\n{ran.stderr}"
        assert ran.returncode == 0 and ran.stdout.strip(), told
        return
    pending: list[str] = []
    for line in code.splitlines():
        found = make_line(line)
        if found is None:
            pending.append(line)
            continue
        if any(p.strip() for p in pending):
            run_shell("\n".join(pending), service.env, where)
        pending = []
        assignments, target = found
        if target == "run":
            service.start(assignments)
        else:
            dry = subprocess.run(["make", "-n", "test"], cwd=ROOT, env=service.env,
                                 capture_output=True, text=True, timeout=60, check=False)
            assert dry.returncode == 0 and "pytest" in dry.stdout, dry.stdout + dry.stderr
    if any(p.strip() and not p.strip().startswith("#") for p in pending):
        run_shell("\n".join(pending), service.env, where)


def test_every_fenced_block_says_its_language() -> None:
    for block in blocks(README.read_text()):
        assert block.lang in SHELL | PYTHON | NOT_RUN, (
            f"README.md line {block.line}: a block needs a language: {SHELL | PYTHON} run, "
            f"{NOT_RUN} do not")


def test_the_readme_runs_as_written(service: Service) -> None:
    found = blocks(README.read_text())
    runnable = [b for b in found if b.lang in SHELL | PYTHON]
    skipped = [b for b in runnable if b.skipped]
    assert len(runnable) >= 8 and len(skipped) <= 1, [b.line for b in skipped]
    assert make_line(runnable[0].code.splitlines()[0]) == ({}, "run"), "start with make run"
    for block in runnable:
        if not block.skipped:
            run_block(block, service)
    for name in ("dag", "planned", "failing", "tools"):  # the files the README names
        assert (ROOT / "examples" / f"{name}.json").is_file()


def test_every_simulator_directive_is_documented() -> None:
    """The README's table names every key `[[sim ...]]` accepts (app/simulator/directives.py),
    and every `fail=` kind."""
    text = README.read_text()
    for name in [f.name for f in fields(Directives)] + ["when"]:
        assert f"`{name}=" in text or f", `{name}=" in text, name
    for kind in (*FAIL_KINDS, *PLAN_KINDS):
        assert f"`{kind}`" in text or f"`fail={kind}`" in text, kind
