"""Start `swarm-api` processes for benchmarks and wait until they answer."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
CLI = str(Path(sys.executable).with_name("swarm-api"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1).status_code < 500:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer in {timeout}s")


@contextlib.contextmanager
def process(args: list[str], env: dict[str, str], ready_url: str, log: Path) -> Iterator[None]:
    """Run `swarm-api <args>` until the block ends (SIGTERM, then SIGKILL)."""
    with log.open("w") as out:
        proc = subprocess.Popen([CLI, *args], env={**os.environ, **env}, stdout=out,
                                stderr=subprocess.STDOUT, cwd=log.parent)
        try:
            wait_http(ready_url)
            yield
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
