"""nginx (Debian's nginx-light) in front of the facade, as users deploy it: with nginx's default
read timeout a long swarm request gets 504 and the OpenAI SDK retries it, and the retries answer
from the one swarm (SPEC §10); with the settings docs/OPENAI.md gives, the answer and the frames
of a stream pass through as they come."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import openai
import pytest

from tests.facade.conftest import start_facade
from tests.support import free_port

TASK = [{"role": "user", "content": "Audit the service [[sim latency_ms=2500]]"}]
SWARM = {"agent_swarm": {"enabled": True, "max_sub_agents": 3,
                         "fan_in_strategy": "concatenate"}}


@contextmanager
def nginx(upstream: str, work: Path, read_timeout: str) -> Iterator[str]:
    """nginx on a free port proxying to `upstream`; yields its base URL."""
    binary = shutil.which("nginx") or "/usr/sbin/nginx"
    if not Path(binary).exists():
        pytest.fail("nginx is not installed: Debian's nginx-light (.ci/run installs it)")
    port = free_port()
    for d in ("body", "proxy", "logs"):
        (work / d).mkdir(exist_ok=True)
    (work / "nginx.conf").write_text(f"""
daemon off;
worker_processes 1;
pid {work}/nginx.pid;
error_log {work}/logs/error.log warn;
events {{ worker_connections 256; }}
http {{
  access_log off;
  client_body_temp_path {work}/body;
  proxy_temp_path {work}/proxy;
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass {upstream};
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_read_timeout {read_timeout};
      proxy_buffering off;
    }}
  }}
}}
""")
    proc = subprocess.Popen([binary, "-p", str(work), "-c", str(work / "nginx.conf"),
                             "-e", str(work / "logs" / "error.log")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            assert proc.poll() is None, (work / "logs" / "error.log").read_text()
            try:  # its port accepts (a proxied request would wait on this test's own loop)
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "nginx did not start"
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


async def test_the_sdks_retries_after_a_proxy_timeout_run_one_swarm(
        database_url: str, tmp_path: Path) -> None:
    async with start_facade(database_url) as facade:
        with nginx(facade.base_url, tmp_path, read_timeout="1s") as proxied:
            sdk = openai.AsyncOpenAI(base_url=f"{proxied}/v1", api_key="k1", max_retries=2)
            with pytest.raises(openai.InternalServerError) as caught:
                await sdk.chat.completions.create(  # type: ignore[call-overload]
                    model="kimi-k2.5", messages=TASK, extra_body=SWARM)
            assert caught.value.status_code == 504
        items = (await facade.http.get("/swarms")).json()["items"]
        assert len(items) == 1, items  # three tries, one swarm
        r = await facade.http.get(f"/swarms/{items[0]['id']}", params={"wait": 30})
        assert r.json()["status"] == "succeeded"


async def test_with_the_documented_settings_answers_and_frames_pass(
        database_url: str, tmp_path: Path) -> None:
    async with start_facade(database_url) as facade:
        with nginx(facade.base_url, tmp_path, read_timeout="3600s") as proxied:
            sdk = openai.AsyncOpenAI(base_url=f"{proxied}/v1", api_key="k1", max_retries=0)
            answer = await sdk.chat.completions.create(  # type: ignore[call-overload]
                model="kimi-k2.5", messages=TASK, extra_body=SWARM)
            assert answer.choices[0].message.content
            stream = await sdk.chat.completions.create(  # type: ignore[call-overload]
                model="kimi-k2.5", messages=[{"role": "user", "content": (
                    "Audit it [[sim latency_ms=600]]")}],
                stream=True, extra_body=SWARM)
            first_frame_status = None
            async for chunk in stream:
                text = chunk.choices[0].delta.content if chunk.choices else None
                if text and text.startswith("[SUB_AGENT_") and first_frame_status is None:
                    swarm_id = chunk.id.removeprefix("chatcmpl-")
                    first_frame_status = (await facade.swarm(swarm_id))["status"]
            # a frame came through while the swarm still ran: nginx did not buffer the stream
            assert first_frame_status in ("running", "synthesizing"), first_frame_status
        assert len((await facade.http.get("/swarms")).json()["items"]) == 2
