"""/ui for a swarm held for approval, in a real headless Chromium: its estimate and plan,
Approve with a plan edited as JSON (exactly that plan runs), Reject with a reason, and a bad
edit said on the page while the swarm stays held."""

from __future__ import annotations

import json

import httpx
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from tests.browser import LiveServer, driver, screenshot, server, severe_console, wait_for

__all__ = ["driver", "server"]  # one browser and one service for this module

HELD = {"task": "review the release", "limits": {"approval": "always"},
        "agents": [{"name": "reader", "prompt": "read it"},
                   {"name": "writer", "prompt": "write it", "depends_on": ["reader"]}]}


def _open(driver: WebDriver, server: LiveServer) -> str:
    swarm = httpx.post(f"{server.url}/swarms", json=HELD).json()
    assert swarm["status"] == "awaiting_approval"
    driver.get(f"{server.url}/ui/swarms/{swarm['id']}")
    wait_for(driver, "!document.getElementById('approval').hidden")
    return str(swarm["id"])


def _set_plan(driver: WebDriver, text: str) -> None:
    driver.find_element(By.CSS_SELECTOR, "#approval details summary").click()
    driver.execute_script("document.getElementById('plan-editor').value = arguments[0]", text)


def test_approve_an_edited_plan(driver: WebDriver, server: LiveServer) -> None:
    swarm_id = _open(driver, server)
    card = driver.find_element(By.ID, "approval").text
    assert "Awaiting approval" in card and "reader" in card and "writer" in card
    assert "expected cost" in card and "max cost" in card
    assert driver.find_element(By.ID, "swarm-status").text == "awaiting_approval"
    screenshot(driver, "ui-awaiting-approval")
    _set_plan(driver, "{ not json")
    driver.find_element(By.ID, "approve").click()
    wait_for(driver, "document.getElementById('approval-note').textContent.includes('JSON')")
    _set_plan(driver, json.dumps({"agents": [{"name": "x", "depends_on": ["nobody"]}]}))
    driver.find_element(By.ID, "approve").click()
    wait_for(driver, "document.getElementById('approval-note').textContent !== ''")
    assert httpx.get(f"{server.url}/swarms/{swarm_id}").json()["status"] == "awaiting_approval"
    _set_plan(driver, json.dumps({"agents": [{"name": "only_one", "prompt": "do it all"}]}))
    driver.find_element(By.ID, "approve").click()
    wait_for(driver, "document.getElementById('swarm-status').textContent === 'succeeded'", 60)
    wait_for(driver, "document.getElementById('approval').hidden")
    done = httpx.get(f"{server.url}/swarms/{swarm_id}").json()
    assert [s["name"] for s in done["subtasks"]] == ["only_one", "@synthesizer"]
    logged = severe_console(driver)  # the refused edit's 422 only
    assert all("422" in str(m) for m in logged), logged


def test_reject_with_a_reason(driver: WebDriver, server: LiveServer) -> None:
    swarm_id = _open(driver, server)
    driver.find_element(By.ID, "reject-reason").send_keys("not this week")
    driver.find_element(By.ID, "reject").click()
    wait_for(driver, "document.getElementById('swarm-status').textContent === 'cancelled'", 30)
    wait_for(driver, "document.getElementById('approval').hidden")
    done = httpx.get(f"{server.url}/swarms/{swarm_id}").json()
    assert done["error"]["code"] == "rejected"
    assert done["error"]["message"] == "not this week"
    assert "rejected" in driver.find_element(By.ID, "failures").text
