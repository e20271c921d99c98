"""/ui's swarm page in a real headless Chromium, the parts beside the DAG: a subtask's panel
(tool calls, a repaired output and a fallback, a worker's text as it streams), a failed swarm's
reason and its retry with lineage, and erasure asked for before it is done."""

from __future__ import annotations

import httpx
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from tests.browser import (
    LiveServer,
    driver,
    page_left_behind,
    requests_made,
    screenshot,
    server,
    severe_console,
    wait_for,
)
from tests.conftest import make_settings
from tests.helpers import slow_prompt
from tests.mcp_servers import HttpServer, write_config

# module-scoped: one browser and one service for this module, each page left behind
__all__ = ["driver", "page_left_behind", "server"]


def test_panel_shows_a_subtasks_tool_calls(driver: WebDriver,
                                           tmp_path_factory: pytest.TempPathFactory) -> None:
    """Tool calls come from GET /swarms/{id}/subtasks/{name}: each with its tool, arguments
    and result, and a failing one marked as an error."""
    tmp = tmp_path_factory.mktemp("ui-tools")
    mcp = HttpServer(tmp / "mcp.log")
    try:
        config = write_config(tmp / "mcp.json", {"docs": {"url": mcp.url}})
        settings = make_settings(f"sqlite+aiosqlite:///{tmp}/swarm.db", mcp_config=config)
        with LiveServer(settings) as live:
            swarm = httpx.post(f"{live.url}/swarms", timeout=60, json={
                "task": "Which planets have moons?", "synthesis": {"strategy": "none"},
                "agents": [{"name": "researcher", "tools": ["docs.lookup", "docs.fail"],
                            "prompt": "moon [[sim latency_ms=0 turns=2]]"}]}).json()
            done = httpx.get(f"{live.url}/swarms/{swarm['id']}", params={"wait": 30}).json()
            assert done["status"] == "succeeded", done
            detail = httpx.get(f"{live.url}/swarms/{swarm['id']}/subtasks/researcher").json()
            calls = [c for m in detail["transcript"] if m["role"] == "assistant"
                     for c in m.get("tool_calls") or []]
            driver.get(f"{live.url}/ui/swarms/{swarm['id']}#subtask=researcher")
            wait_for(driver, "document.querySelectorAll('.tool-call').length === "
                             f"{len(calls)}")
            items = driver.find_elements(By.CSS_SELECTOR, ".tool-call")
            names = [i.find_element(By.CSS_SELECTOR, ".tool-name").text for i in items]
            assert sorted(names) == sorted(c["function"]["name"].replace("__", ".", 1)
                                           for c in calls)
            assert {"docs.lookup", "docs.fail"} <= set(names)
            failed = driver.find_elements(By.CSS_SELECTOR, ".tool-call.failed .tool-name")
            assert {f.text for f in failed} == {"docs.fail"}
            panel = driver.find_element(By.ID, "panel").text
            assert f"tool calls\n{detail['tool_calls']}" in panel
            screenshot(driver, "ui-tool-calls")
            assert severe_console(driver) == []
    finally:
        mcp.close()


def test_panel_says_a_repaired_output_and_a_fallback(driver: WebDriver,
                                                     server: LiveServer) -> None:
    """SPEC §15 in the panel: the output's status with the parsed JSON shown, and how many
    models were passed over before the one that answered."""
    schema = {"type": "object", "properties": {"verdict": {"enum": ["ship", "hold"]}},
              "required": ["verdict"]}
    swarm = httpx.post(f"{server.url}/swarms", timeout=60, json={
        "task": "Release?",
        "synthesis": {"strategy": "none"},
        "agents": [{"name": "judge", "model": ["kimi-k2.5", "deepseek-v3.2"],
                    "prompt": "Judge [[sim output=fence down=kimi-k2.5 retry_after=0]]",
                    "output_schema": schema}]}).json()
    done = httpx.get(f"{server.url}/swarms/{swarm['id']}", params={"wait": 30}).json()
    assert done["status"] == "succeeded", done
    (judge,) = done["subtasks"]
    assert judge["output_status"] == "repaired" and judge["fallbacks"] == 1, judge
    driver.get(f"{server.url}/ui/swarms/{swarm['id']}#subtask=judge")
    wait_for(driver, "document.querySelector('.output-repaired') !== null")
    panel = driver.find_element(By.ID, "panel").text
    assert "output\nrepaired JSON" in panel and "fallbacks\n1 model passed over" in panel
    assert "model\ndeepseek-v3.2" in panel
    assert '"verdict": "ship"' in panel  # the parsed value, indented
    assert severe_console(driver) == []


def test_failed_swarm_shows_why_and_retries_with_lineage(driver: WebDriver,
                                                         server: LiveServer) -> None:
    """The failure panel lists each failed subtask with its reason; Retry starts the retry
    (POST /swarms/{id}/retry) and opens it; it links back, reuses what succeeded (badged),
    and the origin links to it."""
    api = httpx.Client(base_url=server.url, timeout=30)
    old = api.post("/swarms", json={"task": "half broken", "agents": [
        {"name": "fine", "system_prompt": slow_prompt(100)},
        {"name": "broken", "system_prompt": "[[sim fail=400]]", "depends_on": ["fine"]},
        {"name": "after", "depends_on": ["broken"]}]}).json()
    old = api.get(f"/swarms/{old['id']}", params={"wait": 30}).json()
    assert old["status"] == "failed", old
    reason = next(s for s in old["subtasks"] if s["name"] == "broken")["error"]
    driver.get(f"{server.url}/ui/swarms/{old['id']}")
    wait_for(driver, "!document.getElementById('failures').hidden"
                     " && !document.getElementById('retry').hidden")
    panel = driver.find_element(By.ID, "failures").text
    assert "Failed" in panel and old["error"]["code"] in panel
    item = driver.find_element(By.CSS_SELECTOR, "#failures li[data-reason]").text
    assert "broken" in item, item
    assert f"{reason['code']}: {reason['message']}" in item, (item, reason)
    assert f"{old['progress']['skipped']} skipped" in panel
    screenshot(driver, "ui-failed")

    driver.find_element(By.ID, "retry").click()
    wait_for(driver, f"!location.pathname.endsWith({old['id']!r})")
    new_id = driver.execute_script("return location.pathname.split('/').pop()")
    new = api.get(f"/swarms/{new_id}").json()
    assert new["retry_of"] == old["id"]
    # the lineage is redrawn with each read of the swarm: read it in one go
    back = wait_for(driver, "document.querySelector('#lineage .retry-of a')"
                            " && document.querySelector('#lineage .retry-of a').href")
    assert back.endswith(f"/ui/swarms/{old['id']}")
    wait_for(driver, "document.querySelector('.node[data-name=fine][data-reused]')")
    assert "reused" in driver.find_element(By.CSS_SELECTOR, '.node[data-name="fine"]').text
    assert not driver.find_elements(By.CSS_SELECTOR, '.node[data-name="broken"][data-reused]')
    # the page redraws the graph while the retry runs: the click goes to the graph it ends with
    ended = api.get(f"/swarms/{new_id}", params={"wait": 30}).json()["status"]
    wait_for(driver, f"document.title.includes({' · ' + ended + ' · '!r})")
    driver.find_element(By.CSS_SELECTOR, '.node[data-name="fine"]').click()
    wait_for(driver, "document.getElementById('panel').innerText.includes('no call was made')")
    screenshot(driver, "ui-retry")

    driver.get(f"{server.url}/ui/swarms/{old['id']}")
    wait_for(driver, "document.querySelector('#lineage .retried-by a')")
    links = driver.execute_script(
        "return [...document.querySelectorAll('#lineage .retried-by a')].map(a => a.href)")
    assert links == [f"{server.url}/ui/swarms/{new_id}"]
    # the list marks both ends of the lineage
    driver.get(f"{server.url}/ui")
    wait_for(driver, f"document.querySelector('tr[data-id=\"{new_id}\"] .retry-tag')"
                     f" && document.querySelector('tr[data-id=\"{old['id']}\"] .retried-tag')")
    assert severe_console(driver) == []


def test_a_streaming_swarms_panel_shows_the_workers_text_as_it_comes(
        driver: WebDriver, server: LiveServer) -> None:
    swarm = httpx.post(f"{server.url}/swarms", json={
        "task": "write it", "limits": {"stream_tokens": True}, "synthesis": {"strategy": "none"},
        "agents": [{"name": "writer", "system_prompt": "[[sim stream_ms=6000]] Write.",
                    "max_tokens": 400}]}).json()
    driver.get(f"{server.url}/ui/swarms/{swarm['id']}#subtask=writer")
    live = "document.querySelector('#panel pre.out.live')"
    wait_for(driver, f"{live} && {live}.textContent.length > 0", 30)
    first = driver.execute_script(f"return {live}.textContent")
    assert driver.execute_script(
        "return document.querySelector('.node[data-name=writer]').dataset.status") == "running"
    wait_for(driver, f"{live} && {live}.textContent.length > {len(first)}", 30)  # it grows
    screenshot(driver, "ui-live-text")
    wait_for(driver, "document.getElementById('swarm-status').textContent === 'succeeded'", 30)
    done = httpx.get(f"{server.url}/swarms/{swarm['id']}").json()
    output = done["subtasks"][0]["output"]
    assert first in output  # the text since the page connected (deltas are not replayed)
    wait_for(driver, "document.querySelector('#panel pre.out') && "
             "!document.querySelector('#panel pre.out.live')", 30)
    made = requests_made(driver)
    assert any(r["url"].endswith(f"/swarms/{swarm['id']}/events?deltas=true") for r in made)


def test_erase_asks_first_then_erases_an_ended_swarm(driver: WebDriver,
                                                     server: LiveServer) -> None:
    """An ended swarm has an Erase button; its dialog can be declined (nothing happens) or
    confirmed (DELETE): the page then says the content is erased, without Erase or Retry."""
    running = httpx.post(f"{server.url}/swarms", json={"task": "long", "agents": [
        {"name": "slow_a", "system_prompt": slow_prompt(20000)}]}).json()
    driver.get(f"{server.url}/ui/swarms/{running['id']}")
    wait_for(driver, "document.querySelector('.node[data-name=slow_a][data-status=running]')")
    assert driver.find_element(By.ID, "erase").is_displayed() is False  # not while it runs
    httpx.post(f"{server.url}/swarms/{running['id']}/cancel")

    swarm = httpx.post(f"{server.url}/swarms", json={
        "task": "erase-me-task", "agents": [{"name": "a", "prompt": "erase-me-prompt"}]}).json()
    httpx.get(f"{server.url}/swarms/{swarm['id']}", params={"wait": 30})
    driver.get(f"{server.url}/ui/swarms/{swarm['id']}")
    wait_for(driver, "document.getElementById('swarm-status').textContent === 'succeeded'"
                     " && !document.getElementById('erase').hidden")
    assert driver.find_element(By.ID, "swarm-task").text == "erase-me-task"
    driver.find_element(By.ID, "erase").click()
    wait_for(driver, "document.getElementById('confirm-erase').open")
    driver.find_element(By.CSS_SELECTOR, "#confirm-erase button[value=no]").click()
    wait_for(driver, "!document.getElementById('confirm-erase').open")
    assert httpx.get(f"{server.url}/swarms/{swarm['id']}").json()["erased"] is False

    driver.find_element(By.ID, "erase").click()
    wait_for(driver, "document.getElementById('confirm-erase').open")
    driver.find_element(By.CSS_SELECTOR, "#confirm-erase button[value=yes]").click()
    wait_for(driver, "document.getElementById('erase').hidden", 20)
    wait_for(driver, "document.getElementById('swarm-task').textContent"
                     ".startsWith('Content erased')")
    got = httpx.get(f"{server.url}/swarms/{swarm['id']}").json()
    assert got["erased"] is True and got["task"] == "" and got["result"] is None
    assert driver.find_element(By.ID, "retry").is_displayed() is False
    assert "erase-me" not in driver.find_element(By.TAG_NAME, "body").text
    screenshot(driver, "ui-erased")
    assert severe_console(driver) == []
