"""/ui in a real headless Chromium: the swarm list, a running DAG turning green live from the
event stream (also across a dropped connection), the key prompt with auth on, and a
thousand-node swarm laid out. Screenshots land in test-artifacts/ for a person to look at."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from tests.browser import (
    ARTIFACTS,
    LiveServer,
    driver,
    js_seconds,
    outside,
    page_left_behind,
    requests_made,
    screenshot,
    server,
    severe_console,
    stat_text,
    wait_for,
)
from tests.conftest import make_settings
from tests.helpers import slow_prompt

# module-scoped: one browser and one service for this module, each page left behind
__all__ = ["driver", "page_left_behind", "server"]

KEY = "key-acme-0123456789"


# 6 agents + @synthesizer = the 7-node DAG: two roots fan out, one joins, the synthesizer last
DAG = {
    "task": "Review the v1 -> v2 migration of our FastAPI payment service",
    "agents": [
        {"name": "code_analyst", "system_prompt": slow_prompt(900)},
        {"name": "risk_auditor", "system_prompt": slow_prompt(1500), "model": "deepseek-v3.2"},
        {"name": "dependency_scanner", "system_prompt": slow_prompt(700)},
        {"name": "test_designer", "system_prompt": slow_prompt(900),
         "depends_on": ["code_analyst"]},
        {"name": "perf_reviewer", "system_prompt": slow_prompt(700),
         "depends_on": ["dependency_scanner"]},
        {"name": "doc_writer", "system_prompt": slow_prompt(700),
         "depends_on": ["test_designer", "risk_auditor", "perf_reviewer"]},
    ],
    "metadata": {"ticket": "PAY-1234"},
}
NAMES = {a["name"] for a in DAG["agents"]} | {"@synthesizer"}
DEPENDS = {a["name"]: a.get("depends_on", []) for a in DAG["agents"]}
STATUSES_JS = """return Object.fromEntries([...document.querySelectorAll('.node[data-name]')]
    .map(g => [g.dataset.name, g.getAttribute('data-status')]))"""


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """Auth on (one tenant) and no engine: swarms stay queued, as big as they come."""
    db = tmp_path_factory.mktemp("ui-auth") / "swarm.db"
    with LiveServer(make_settings(f"sqlite+aiosqlite:///{db}", engine=False,
                                  api_keys=f"acme:{KEY}")) as live:
        yield live


def _watch(driver: WebDriver, until_status: str, timeout: float = 60) -> list[dict[str, str]]:
    """Every distinct set of node statuses the page shows until the swarm's badge says
    `until_status`."""
    seen: list[dict[str, str]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        statuses = driver.execute_script(STATUSES_JS)
        if not seen or statuses != seen[-1]:
            seen.append(statuses)
        badge = driver.find_element(By.ID, "swarm-status").text
        if badge == until_status and set(statuses.values()) == {"succeeded"}:
            return seen
        time.sleep(0.05)
    raise AssertionError(f"page did not reach {until_status}; last seen {seen[-1:]}")


def _check_order(seen: list[dict[str, str]]) -> None:
    """No node ever succeeds before what it depends on, and none goes back."""
    done: set[str] = set()
    for statuses in seen:
        now = {n for n, s in statuses.items() if s == "succeeded"}
        assert done <= now, f"a node went back: {done - now}"
        for n in now:
            assert set(DEPENDS.get(n, [])) <= now, (n, statuses)
        done = now


def test_swarm_page_turns_a_running_dag_green_live(driver: WebDriver,
                                                   server: LiveServer) -> None:
    driver.get(f"{server.url}/ui")  # the browser is warm before the swarm starts
    swarm = httpx.post(f"{server.url}/swarms", json=DAG).json()
    requests_made(driver)
    driver.get(f"{server.url}/ui/swarms/{swarm['id']}")
    wait_for(driver, "document.querySelectorAll('.node[data-name]').length === 7")
    names = {g.get_attribute("data-name"): g.find_element(By.CSS_SELECTOR, ".name").text
             for g in driver.find_elements(By.CSS_SELECTOR, ".node[data-name]")}
    assert names == {n: n for n in NAMES}  # each node carries its subtask's name as text
    wait_for(driver, "document.querySelector('.node[data-status=running]')")
    seen = [driver.execute_script(STATUSES_JS)]
    assert "running" in seen[0].values() and "pending" in seen[0].values()
    screenshot(driver, "ui-swarm-running")
    seen += _watch(driver, "succeeded")
    assert any(0 < list(s.values()).count("succeeded") < 7 for s in seen), "not live"
    _check_order(seen)

    # left to right: planner-less roots, then each dependency level, the synthesizer last
    x = {n: driver.execute_script(
        f"return document.querySelector('.node[data-name=\"{n}\"]').getBoundingClientRect().x")
        for n in NAMES}
    assert x["code_analyst"] < x["test_designer"] < x["doc_writer"] < x["@synthesizer"]
    # one column for the roots: a node's box includes its live label, which moves it by a pixel
    # or two as statuses change; columns are a node's width apart
    roots = [x["code_analyst"], x["risk_auditor"], x["dependency_scanner"]]
    assert max(roots) - min(roots) < 8, roots

    # the page's figures are the terminal swarm's: its subtasks all succeeded a moment before
    # the swarm ends (the synthesizer's commit, then the finish), so read it once it has ended
    wait_for(driver, "document.getElementById('stream-state').dataset.state === 'ended'")
    final = httpx.get(f"{server.url}/swarms/{swarm['id']}", params={"wait": 10},
                      timeout=20).json()
    assert final["status"] == "succeeded", final
    speedup = final["timing"]["speedup"]  # as JavaScript prints a number: 2.0 is "2"
    shown = f"{speedup:g}" if float(speedup).is_integer() else str(speedup)
    # the page re-reads the swarm on `swarm.completed` (throttled), so the terminal figures
    # land a moment after the stream ends: wait for them, then check them all
    wanted = f"{shown}\N{MULTIPLICATION SIGN}"
    try:
        wait_for(driver, f"document.getElementById('stats').innerText.includes({wanted!r})")
    except TimeoutException:
        pass  # the assertion below says what the page shows instead
    stats = driver.find_element(By.ID, "stats").text
    assert f"{final['progress']['total']} / {final['progress']['total']}" in stats
    assert wanted in stats, (wanted, stats)
    # the critical path is highlighted: a chain ending at the synthesizer
    critical = driver.execute_script(
        "return [...document.querySelectorAll('.node.critical')].map(g => g.dataset.name)")
    assert "@synthesizer" in critical and "doc_writer" in critical
    # ... the API's chain: its latencies sum to timing.critical_path_s, which the card shows
    latency = {s["name"]: s["latency_ms"] or 0 for s in final["subtasks"]}
    assert sum(latency[n] for n in critical) / 1000 == pytest.approx(
        final["timing"]["critical_path_s"], abs=0.002)
    assert {"code_analyst", "test_designer"} <= set(critical)  # 900 + 900 ms over risk's 1500
    card = stat_text(driver, "critical")
    assert card == js_seconds(final["timing"]["critical_path_s"]), card

    # selecting a node shows its output, usage and latency from the API
    driver.find_element(By.CSS_SELECTOR, '.node[data-name="test_designer"]').click()
    sub = next(s for s in final["subtasks"] if s["name"] == "test_designer")
    wait_for(driver, "document.querySelector('#panel pre.out')")
    panel = driver.find_element(By.ID, "panel").text
    assert sub["output"].splitlines()[0] in panel
    assert f"{sub['usage']['prompt_tokens']} in · {sub['usage']['completion_tokens']} out" in panel
    assert "depends on\ncode_analyst" in panel
    screenshot(driver, "ui-swarm")

    made = requests_made(driver)
    assert any(r["url"].endswith(f"/swarms/{swarm['id']}/events") for r in made)
    assert outside(made, server.url) == []
    assert severe_console(driver) == []


def test_event_stream_resumes_after_the_connection_drops(
        driver: WebDriver, server: LiveServer, tmp_path_factory: pytest.TempPathFactory) -> None:
    """A replica restart cuts the stream: the page reconnects with Last-Event-ID and keeps
    following the swarm (taken over by the restarted engine) to the end."""
    db = tmp_path_factory.mktemp("ui-restart") / "swarm.db"
    settings = make_settings(f"sqlite+aiosqlite:///{db}", lease_seconds=1.0)
    first = LiveServer(settings).__enter__()
    port = first.port
    swarm = httpx.post(f"{first.url}/swarms", json=DAG).json()
    driver.get(f"{first.url}/ui/swarms/{swarm['id']}")
    requests_made(driver)
    wait_for(driver, "document.querySelector('.node[data-status=succeeded]')"
                     " && document.getElementById('stream-state').dataset.state === 'live'")
    first.__exit__(None, None, None)
    wait_for(driver, "document.getElementById('stream-state').dataset.state === 'reconnecting'")
    with LiveServer(settings, port=port):
        seen = _watch(driver, "succeeded", timeout=90)
    _check_order(seen)
    sent = _events_requests(driver)
    resumed = [r for r in sent if r.get("last-event-id")]
    assert resumed, f"the page never resumed with Last-Event-ID: {sent}"
    assert all(int(r["last-event-id"]) >= 1 for r in resumed)
    # what the console saw is the refused connections while the service was down, no error
    # of the page's own
    assert not [m for m in severe_console(driver) if "Uncaught" in m or ".js" in m]


def _events_requests(driver: WebDriver) -> list[dict[str, Any]]:
    """Headers (lower-cased names) of every request the page sent to an event stream."""
    found = []
    for entry in driver.get_log("performance"):
        msg = json.loads(entry["message"])["message"]
        if msg["method"] == "Network.requestWillBeSent":
            req = msg["params"]["request"]
            if req["url"].endswith("/events"):
                found.append({k.lower(): v for k, v in req["headers"].items()})
    return found


def test_cancel_button_cancels_the_running_swarm(driver: WebDriver,
                                                  server: LiveServer) -> None:
    swarm = httpx.post(f"{server.url}/swarms", json={"task": "long", "agents": [
        {"name": "slow_a", "system_prompt": slow_prompt(20000)},
        {"name": "after", "depends_on": ["slow_a"]}]}).json()
    driver.get(f"{server.url}/ui/swarms/{swarm['id']}")
    wait_for(driver, "document.querySelector('.node[data-name=slow_a][data-status=running]')")
    # no event comes while slow_a runs, and still the wall time counts on, second by second
    shown = []
    for _ in range(4):
        shown.append(stat_text(driver, "wall"))
        time.sleep(1.05)
    seconds_shown = [float(v.split()[0]) / (1000 if v.endswith(" ms") else 1) for v in shown]
    assert seconds_shown == sorted(seconds_shown) and len(set(shown)) == 4, shown
    # a reading is the clock's value at its last tick (once a second) or at the render before
    # the first tick: the span of four readings 1.05 s apart is 3.15 s within one tick
    assert seconds_shown[-1] - seconds_shown[0] == pytest.approx(3.15, abs=1.05), shown
    # the timeline runs on the same clock: its axis ends at "now", further each second
    driver.find_element(By.CSS_SELECTOR, '[data-view="timeline"]').click()
    last_tick = "return document.querySelector('.tl-axis .tl-tick:last-child').textContent"
    wait_for(driver, "document.querySelector('.tl-row[data-name=slow_a][data-status=running]"
                     " .tl-bar')")
    first = driver.execute_script(last_tick)
    time.sleep(1.2)
    assert driver.execute_script(last_tick) != first
    screenshot(driver, "ui-timeline-running")
    driver.find_element(By.CSS_SELECTOR, '[data-view="graph"]').click()
    # the cancel's answer (the swarm before its end) comes after the end's events and read:
    # the page keeps the ended swarm (its clock stopped, the cut-off call billed)
    driver.execute_script("""
      const real = window.fetch;
      window.fetch = async (url, opts) => {
        const r = await real(url, opts);
        if (String(url).endsWith('/cancel')) {
          await new Promise((ok) => setTimeout(ok, 2500));
          setTimeout(() => { window.cancelAnswered = true; }, 0);
        }
        return r;
      };""")
    driver.find_element(By.ID, "cancel").click()
    wait_for(driver, "document.getElementById('confirm-cancel').open")
    driver.find_element(By.CSS_SELECTOR, "#confirm-cancel button[value=yes]").click()
    wait_for(driver, "document.getElementById('swarm-status').textContent === 'cancelled'", 30)
    wait_for(driver, "document.querySelector('.node[data-name=slow_a]')"
                     ".getAttribute('data-status') === 'cancelled'")
    wait_for(driver, "document.getElementById('cancel').hidden")
    done = httpx.get(f"{server.url}/swarms/{swarm['id']}").json()
    assert done["status"] == "cancelled"
    # the cut-off call is billed at its reservation: said so, never shown as a billed usage
    cut = next(s for s in done["subtasks"] if s["name"] == "slow_a")
    assert float(cut["usage"]["cost_usd"]) > 0, cut
    wait_for(driver, "document.querySelector('.node[data-name=slow_a] .meta')"
                     ".textContent.includes('reserved')")
    driver.find_element(By.CSS_SELECTOR, '.node[data-name="slow_a"]').click()
    wait_for(driver, "document.querySelector('#panel .reserved')")
    panel = driver.find_element(By.ID, "panel").text
    assert "reserved (upper bound, not billed usage)" in panel, panel
    assert f"≤ {cut['usage']['completion_tokens']} out (reserved)" in panel, panel
    wait_for(driver, "window.cancelAnswered === true", 30)
    stats = driver.find_element(By.ID, "stats").text
    assert "reserved (upper bound" in stats, stats
    assert "start to finish" in stats, stats
    # a cancelled swarm can be retried; the panel says what was cancelled
    assert driver.find_element(By.ID, "retry").is_displayed()
    assert "Cancelled" in driver.find_element(By.ID, "failures").text
    screenshot(driver, "ui-cancelled-reserved")
    assert severe_console(driver) == []


def test_list_shows_recent_swarms_filtered_and_paged(driver: WebDriver,
                                                     server: LiveServer) -> None:
    api = httpx.Client(base_url=server.url, timeout=30)
    for i in range(3):
        api.post("/swarms", json={"task": f"quick task {i}", "agents": [{"name": "a"}]})
    failed = api.post("/swarms", json={"task": "doomed", "agents": [
        {"name": "a", "system_prompt": "[[sim fail=400]]"}]}).json()
    assert api.get(f"/swarms/{failed['id']}", params={"wait": 20}).json()["status"] == "failed"

    def shown() -> list[str]:
        return driver.execute_script(
            "return [...document.querySelectorAll('#swarms tbody tr')].map(r => r.dataset.id)")

    first = api.get("/swarms", params={"limit": 2}).json()
    driver.get(f"{server.url}/ui?limit=2")
    wait_for(driver, "document.querySelectorAll('#swarms tbody tr').length === 2")
    assert shown() == [s["id"] for s in first["items"]]  # newest first, as the API pages
    row = driver.find_element(By.CSS_SELECTOR, f'tr[data-id="{first["items"][0]["id"]}"]').text
    assert first["items"][0]["status"] in row and "ago" in row
    screenshot(driver, "ui-list")

    second = api.get("/swarms", params={"limit": 2, "cursor": first["next_cursor"]}).json()
    driver.find_element(By.ID, "older").click()
    wait_for(driver, f"document.querySelector('#swarms tbody tr').dataset.id === "
                     f"'{second['items'][0]['id']}'")
    assert shown() == [s["id"] for s in second["items"]]
    driver.find_element(By.ID, "newer").click()
    wait_for(driver, f"document.querySelector('#swarms tbody tr').dataset.id === "
                     f"'{first['items'][0]['id']}'")

    driver.find_element(By.CSS_SELECTOR, '#filters [data-status="failed"]').click()
    wait_for(driver, "location.search.includes('status=failed')")
    only_failed = [s["id"] for s in
                   api.get("/swarms", params={"limit": 2, "status": "failed"}).json()["items"]]
    wanted = json.dumps(only_failed, separators=(",", ":"))
    wait_for(driver, "JSON.stringify([...document.querySelectorAll('#swarms tbody tr')]"
                     f".map(r => r.dataset.id)) === '{wanted}'")
    assert set(driver.execute_script(
        "return [...document.querySelectorAll('#swarms tbody tr')].map(r => r.dataset.status)")
    ) == {"failed"}
    assert severe_console(driver) == []


def test_key_prompt_with_auth_on(driver: WebDriver, auth_server: LiveServer) -> None:
    swarm = httpx.post(f"{auth_server.url}/swarms", headers={"Authorization": f"Bearer {KEY}"},
                       json={"task": "t", "agents": [{"name": "a"}, {"name": "b"}]}).json()
    driver.get(f"{auth_server.url}/ui")
    wait_for(driver, "document.querySelector('dialog.key-dialog[open]')")
    screenshot(driver, "ui-key-prompt")
    field = driver.find_element(By.CSS_SELECTOR, "dialog.key-dialog input[name=key]")
    field.send_keys("not-the-key\n")
    wait_for(driver, "document.querySelector('dialog.key-dialog[open] .reason')"
                     " && document.querySelector('dialog.key-dialog .reason')"
                     ".textContent.includes('refused')")
    driver.find_element(By.CSS_SELECTOR, "dialog.key-dialog input[name=key]").send_keys(KEY + "\n")
    wait_for(driver, f"document.querySelector('tr[data-id=\"{swarm['id']}\"]')")
    assert driver.execute_script("return sessionStorage.getItem('swarm-api-key')") == KEY
    # the next page of the tab reuses the key: no prompt, and the stream is read with it
    driver.get(f"{auth_server.url}/ui/swarms/{swarm['id']}")
    wait_for(driver, "document.querySelectorAll('.node[data-name]').length === 3"
                     " && document.getElementById('stream-state').dataset.state === 'live'")
    assert not driver.find_elements(By.CSS_SELECTOR, "dialog.key-dialog[open]")
    # the only errors the console saw are the refused requests before a good key was given
    assert all("401" in m for m in severe_console(driver))


def test_a_thousand_nodes_open_folded_and_lay_out_on_demand(driver: WebDriver,
                                                             auth_server: LiveServer) -> None:
    """A layer of more than 50 subtasks opens as one summary node (SPEC §13); expanded, its
    960 nodes lay out in sub-columns left of the layer that depends on them."""
    agents: list[dict[str, Any]] = [{"name": f"agent_{i:04d}"} for i in range(960)]
    agents += [{"name": f"review_{i:02d}",
                "depends_on": [f"agent_{j:04d}" for j in range(i * 40, i * 40 + 40)]}
               for i in range(24)]
    swarm = httpx.post(f"{auth_server.url}/swarms", headers={"Authorization": f"Bearer {KEY}"},
                       json={"task": "a wide fan-out", "agents": agents}, timeout=60).json()
    driver.get(f"{auth_server.url}/ui")
    driver.execute_script(f"sessionStorage.setItem('swarm-api-key', '{KEY}')")
    driver.get(f"{auth_server.url}/ui/swarms/{swarm['id']}")
    wait_for(driver, "document.querySelector('.node.summary[data-layer=\"0\"]')", 60)
    drawn = "return document.querySelectorAll('.node[data-name]').length"
    assert driver.execute_script(drawn) == 25
    summary = driver.find_element(By.CSS_SELECTOR, '.node.summary[data-layer="0"]').text
    assert "workers · 960" in summary and "960 pending" in summary
    screenshot(driver, "ui-swarm-1000-folded")
    driver.find_element(By.CSS_SELECTOR, '.node.summary[data-layer="0"]').click()
    wait_for(driver, "document.querySelectorAll('.node[data-name]').length === 985", 60)
    layout_ms = driver.execute_script("return document.querySelector('svg.dag').dataset.layoutMs")
    x = driver.execute_script("""return Object.fromEntries(['agent_0000', 'agent_0959',
        'review_00', 'review_23', '@synthesizer'].map(n => [n,
        document.querySelector(`.node[data-name="${n}"]`).getBoundingClientRect().x]))""")
    assert x["agent_0959"] < x["review_00"] == x["review_23"] < x["@synthesizer"]
    screenshot(driver, "ui-swarm-1000")
    driver.find_element(By.CSS_SELECTOR, '.layer-label[data-layer="0"]').click()
    wait_for(driver, "document.querySelectorAll('.node[data-name]').length === 25")
    Path(ARTIFACTS / "ui-layout.txt").write_text(
        f"985-node swarm: layout + draw of the expanded layer {layout_ms} ms in the browser\n")
    # the only errors: the list page's reads before the key was put in the tab
    assert all("401" in m for m in severe_console(driver))
