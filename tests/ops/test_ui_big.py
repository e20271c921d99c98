"""/ui for big swarms in a real headless Chromium: a 1,000-subtask swarm opens with its wide
layer folded into one summary node (well under a hundred status nodes in the page) and unfolds
on demand, Find unfolds and zooms to a match, and the timeline draws every subtask of a
50-agent swarm and stays summarised at 1,000. Screenshots land in test-artifacts/."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from tests.browser import (
    ARTIFACTS,
    LiveServer,
    driver,
    js_seconds,
    screenshot,
    severe_console,
    stat_text,
    wait_for,
)
from tests.conftest import make_settings

__all__ = ["driver"]  # one browser for this module

STATUS_NODES = "return document.querySelectorAll('[data-status]').length"
DRAWN = "return document.querySelectorAll('.node[data-name]').length"
TIMELINE_ROWS = "return document.querySelectorAll('.tl-row[data-name]').length"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """The service with its engine and the simulator, as `swarm-api serve` runs it."""
    db = tmp_path_factory.mktemp("ui-big") / "swarm.db"
    with LiveServer(make_settings(f"sqlite+aiosqlite:///{db}")) as live:
        print(f"\nscreenshots: {ARTIFACTS}")
        yield live


def _run(server: LiveServer, body: dict[str, Any], timeout: float = 240) -> dict[str, Any]:
    """POST the swarm and wait for its end; the finished swarm."""
    api = httpx.Client(base_url=server.url, timeout=90)
    swarm = api.post("/swarms", json=body).json()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done: dict[str, Any] = api.get(f"/swarms/{swarm['id']}", params={"wait": 30}).json()
        if done["status"] in ("succeeded", "failed", "cancelled"):
            return done
    raise AssertionError(f"swarm {swarm['id']} did not finish in {timeout} s")


@pytest.fixture(scope="module")
def thousand(server: LiveServer) -> dict[str, Any]:
    """A finished 1,000-subtask swarm: 976 workers fan out, 24 reviewers read 40 each, and
    their outputs are concatenated (no synthesizer subtask)."""
    agents: list[dict[str, Any]] = [
        {"name": f"agent_{i:04d}", "system_prompt": "[[sim latency_ms=2]]"} for i in range(976)]
    agents += [{"name": f"review_{i:02d}", "system_prompt": "[[sim latency_ms=2]]",
                "depends_on": [f"agent_{j:04d}" for j in range(i * 40, i * 40 + 40)]}
               for i in range(24)]
    swarm = _run(server, {"task": "a wide fan-out", "agents": agents,
                          "synthesis": {"strategy": "concatenate"},
                          "limits": {"concurrency": 200}})
    assert swarm["status"] == "succeeded", swarm["error"]
    assert swarm["progress"]["total"] == 1000
    return swarm


def _open(driver: WebDriver, server: LiveServer, swarm: dict[str, Any]) -> None:
    driver.get(f"{server.url}/ui/swarms/{swarm['id']}")
    wait_for(driver, "document.getElementById('stream-state').dataset.state === 'ended'"
                     " && document.querySelector('svg.dag')", 60)


def test_a_thousand_subtasks_open_folded_and_unfold_on_demand(
        driver: WebDriver, server: LiveServer, thousand: dict[str, Any]) -> None:
    _open(driver, server, thousand)
    # the 976 workers are one summary node: everything in the page with a status is < 100
    assert driver.execute_script(STATUS_NODES) < 100
    assert driver.execute_script(DRAWN) == 24  # the reviewers
    summary = driver.find_element(By.CSS_SELECTOR, '.node.summary[data-layer="0"]').text
    assert "workers · 976" in summary and "976 succeeded" in summary
    screenshot(driver, "ui-big-1000-folded")
    folded_ms = driver.execute_script("return document.querySelector('svg.dag').dataset.layoutMs")

    driver.find_element(By.CSS_SELECTOR, '.node.summary[data-layer="0"]').click()
    wait_for(driver, "document.querySelectorAll('.node[data-name]').length === 1000", 60)
    unfolded_ms = driver.execute_script("return document.querySelector('svg.dag').dataset.layoutMs")
    (ARTIFACTS / "ui-big-layout.txt").write_text(
        f"1,000-subtask swarm in the browser: layout + draw folded {folded_ms} ms,"
        f" its 976-worker layer unfolded {unfolded_ms} ms\n")
    assert not driver.find_elements(By.CSS_SELECTOR, ".node.summary")
    screenshot(driver, "ui-big-1000-unfolded")

    driver.find_element(By.ID, "collapse-all").click()
    wait_for(driver, "document.querySelectorAll('.node[data-name]').length === 0")
    assert len(driver.find_elements(By.CSS_SELECTOR, ".node.summary")) == 2
    driver.find_element(By.ID, "expand-all").click()
    wait_for(driver, "document.querySelectorAll('.node[data-name]').length === 1000", 60)
    assert severe_console(driver) == []


def test_find_unfolds_and_zooms_to_the_match(driver: WebDriver, server: LiveServer,
                                             thousand: dict[str, Any]) -> None:
    _open(driver, server, thousand)
    driver.find_element(By.ID, "zoom-out").click()  # the reader zoomed out first
    driver.find_element(By.ID, "zoom-out").click()
    driver.find_element(By.ID, "find").send_keys("agent_0700")
    wait_for(driver, "document.querySelector('.node.current[data-name=agent_0700]')")
    # its folded layer was unfolded, the graph is back at full size and the match is in view
    assert driver.execute_script(DRAWN) == 1000
    assert driver.find_element(By.ID, "find-count").text == "1 of 1"
    inside = driver.execute_script("""
        const n = document.querySelector('.node[data-name=agent_0700]').getBoundingClientRect();
        const g = document.getElementById('graph').getBoundingClientRect();
        return [n.left >= g.left, n.right <= g.right, n.top >= g.top, n.bottom <= g.bottom,
                n.width];""")
    assert inside[:4] == [True, True, True, True], inside
    assert inside[4] > 140  # nodes at full size, readable
    screenshot(driver, "ui-big-find")
    # Enter goes to the next match
    find = driver.find_element(By.ID, "find")
    find.clear()
    find.send_keys("review_0")
    wait_for(driver, "document.getElementById('find-count').textContent === '1 of 10'")
    find.send_keys("\n")
    wait_for(driver, "document.getElementById('find-count').textContent === '2 of 10'")
    assert severe_console(driver) == []


def test_timeline_stays_summarised_at_a_thousand(driver: WebDriver, server: LiveServer,
                                                 thousand: dict[str, Any]) -> None:
    _open(driver, server, thousand)
    driver.find_element(By.CSS_SELECTOR, '[data-view="timeline"]').click()
    wait_for(driver, "document.querySelector('.timeline .tl-summary')")
    assert driver.execute_script(TIMELINE_ROWS) == 24
    assert driver.execute_script(STATUS_NODES) < 100
    row = driver.find_element(By.CSS_SELECTOR, '.tl-summary[data-layer="0"]')
    assert "976 succeeded" in row.text
    span = row.find_element(By.CSS_SELECTOR, ".tl-span").size["width"]
    assert span > 0
    screenshot(driver, "ui-big-timeline-1000")
    # unfolding it in the timeline draws its rows (and the graph's nodes) on demand
    row.find_element(By.CSS_SELECTOR, "button").click()
    wait_for(driver, "document.querySelectorAll('.tl-row[data-name]').length === 1000", 60)
    assert severe_console(driver) == []


def test_timeline_draws_every_subtask_of_fifty(driver: WebDriver, server: LiveServer) -> None:
    agents = [{"name": f"agent_{i:02d}", "system_prompt": f"[[sim latency_ms={100 + 10 * i}]]"}
              for i in range(50)]
    swarm = _run(server, {"task": "fifty at once", "agents": agents,
                          "limits": {"concurrency": 50}})
    assert swarm["status"] == "succeeded", swarm["error"]
    _open(driver, server, swarm)
    assert driver.execute_script(DRAWN) == 51  # 50 is not over the fold: all drawn
    driver.find_element(By.CSS_SELECTOR, '[data-view="timeline"]').click()
    wait_for(driver, "document.querySelectorAll('.tl-row[data-name]').length === 51")
    assert not driver.find_elements(By.CSS_SELECTOR, ".tl-summary")
    bars = driver.execute_script("""return Object.fromEntries([...document
        .querySelectorAll('.tl-row[data-name]')].map(r => [r.dataset.name,
        [r.dataset.status, r.querySelector('.tl-bar').getBoundingClientRect().width,
         r.querySelector('.tl-bar').getBoundingClientRect().left]]))""")
    assert set(bars) == {s["name"] for s in swarm["subtasks"]}
    assert all(status == "succeeded" and width >= 2 for status, width, _ in bars.values())
    # a bar is as long as its subtask ran: agent_49 (590 ms) outlasts agent_00 (100 ms)
    assert bars["agent_49"][1] > 2 * bars["agent_00"][1]
    # the synthesis starts after every worker
    assert bars["@synthesizer"][2] >= max(b[2] for n, b in bars.items() if n != "@synthesizer")
    screenshot(driver, "ui-big-timeline-50")
    assert severe_console(driver) == []


def test_a_running_big_swarm_updates_its_summary_live(driver: WebDriver,
                                                      server: LiveServer) -> None:
    """While 300 workers run, their folded layer's counts move with the event stream and the
    page never grows past a hundred status elements."""
    agents = [{"name": f"w_{i:03d}", "system_prompt": "[[sim latency_ms=300]]"}
              for i in range(300)]
    swarm = httpx.post(f"{server.url}/swarms", timeout=30, json={
        "task": "a live fan-out", "agents": agents, "limits": {"concurrency": 25}}).json()
    driver.get(f"{server.url}/ui/swarms/{swarm['id']}")
    wait_for(driver, "document.querySelector('.node.summary[data-layer=\"0\"]')")
    texts: list[str] = []
    most = 0
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        text, count, state = driver.execute_script(
            "const s = document.querySelector('.node.summary[data-layer=\"0\"] .meta');"
            "return [s ? s.textContent : '', document.querySelectorAll('[data-status]').length,"
            " document.getElementById('stream-state').dataset.state]")
        most = max(most, count)
        if text and (not texts or texts[-1] != text):
            texts.append(text)
        if state == "ended" and text.startswith("300 succeeded"):
            break
        time.sleep(0.2)
    assert texts and texts[-1].startswith("300 succeeded"), texts[-3:]
    partial = [t for t in texts if "succeeded" in t and not t.startswith("300 succeeded")]
    assert len(partial) >= 3, texts  # counts moved while it ran, not only at the end
    assert most < 100, most
    assert severe_console(driver) == []


CRITICAL_JS = """const [subtasks, done] = arguments;
import('/ui/static/graph-layout.js').then((m) => {
  const deps = m.dependencies(subtasks);
  const cp = m.criticalPath(subtasks, deps, m.layering(subtasks, deps).order);
  done([cp.seconds, cp.names]);
}, (err) => done([null, String(err)]));"""


def test_critical_path_is_the_apis(driver: WebDriver, server: LiveServer) -> None:
    """The page's critical path is the one `timing.critical_path_s` measures, through a
    planner, compressors and a DAG whose longest chain is not its deepest."""
    dag = _run(server, {"task": "chains", "synthesis": {"compress": "always"}, "agents": [
        {"name": "long_alone", "system_prompt": "[[sim latency_ms=900]]"},
        {"name": "a", "system_prompt": "[[sim latency_ms=150]]"},
        {"name": "b", "system_prompt": "[[sim latency_ms=150]]", "depends_on": ["a"]},
        {"name": "c", "system_prompt": "[[sim latency_ms=150]]", "depends_on": ["b"]}]})
    planned = _run(server, {"task": "Compare three caching strategies for a payment API"})
    driver.get(f"{server.url}/ui")  # the module is imported from the service's own pages
    for swarm in (dag, planned):
        assert swarm["status"] == "succeeded", swarm["error"]
        seconds, names = driver.execute_async_script(CRITICAL_JS, swarm["subtasks"])
        assert seconds == pytest.approx(swarm["timing"]["critical_path_s"], abs=0.0011), names
        latency = {s["name"]: s["latency_ms"] or 0 for s in swarm["subtasks"]}
        assert sum(latency[n] for n in names) / 1000 == pytest.approx(seconds, abs=0.0011)
        _open(driver, server, swarm)
        lit = driver.execute_script(
            "return [...document.querySelectorAll('.node.critical')].map(g => g.dataset.name)")
        assert set(lit) == set(names)
        card = stat_text(driver, "critical")
        assert card == js_seconds(swarm["timing"]["critical_path_s"]), card
    assert any(s["kind"] == "compressor" for s in dag["subtasks"])
    assert any(s["kind"] == "planner" for s in planned["subtasks"])


@pytest.fixture(scope="module")
def idle_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """No engine: a swarm stays queued, its shape all there is to draw."""
    db = tmp_path_factory.mktemp("ui-big-idle") / "swarm.db"
    with LiveServer(make_settings(f"sqlite+aiosqlite:///{db}", engine=False)) as live:
        yield live


def test_a_thousand_in_layers_of_forty_open_as_a_screenful(driver: WebDriver,
                                                           idle_server: LiveServer) -> None:
    """No layer is over 50, yet the page does not open with 1,000 nodes: the largest layers
    start folded until at most 60 nodes (summaries included) are drawn; each unfolds on demand."""
    sizes = [40] * 24 + [39]
    agents: list[dict[str, Any]] = []
    for layer, size in enumerate(sizes):
        above = [f"l{layer - 1:02d}_00"] if layer else []
        agents += [{"name": f"l{layer:02d}_{i:02d}", "depends_on": above} for i in range(size)]
    swarm = httpx.post(f"{idle_server.url}/swarms", timeout=60,
                       json={"task": "deep and wide", "agents": agents}).json()
    assert swarm["progress"]["total"] == 1000, swarm["progress"]
    driver.get(f"{idle_server.url}/ui/swarms/{swarm['id']}")
    wait_for(driver, "document.querySelector('.node.summary')", 60)
    assert driver.execute_script(STATUS_NODES) < 100
    drawn = driver.execute_script(DRAWN)
    assert drawn + len(driver.find_elements(By.CSS_SELECTOR, ".node.summary")) <= 60, drawn
    folded = driver.find_element(By.CSS_SELECTOR, ".node.summary")
    layer = folded.get_attribute("data-layer")
    folded.click()
    wait_for(driver, f"document.querySelectorAll('.node[data-name]').length > {drawn}"
                     f" && !document.querySelector('.node.summary[data-layer=\"{layer}\"]')")
    screenshot(driver, "ui-big-1000-deep")
    assert severe_console(driver) == []


def test_many_failures_are_listed_with_reasons_and_found(driver: WebDriver,
                                                         server: LiveServer) -> None:
    """60 failed workers in a folded layer: the panel gives their reason once, with their
    count and the first names; picking one there unfolds its layer and selects it."""
    agents = [{"name": f"bad_{i:02d}", "system_prompt": "[[sim fail=400]]"} for i in range(60)]
    agents.append({"name": "good"})
    swarm = _run(server, {"task": "mostly broken", "agents": agents,
                          "limits": {"failure_tolerance": 1.0}})
    assert swarm["progress"]["failed"] == 60, swarm["progress"]
    error = swarm["subtasks"][0]["error"]
    _open(driver, server, swarm)
    wait_for(driver, "!document.getElementById('failures').hidden")
    panel = driver.find_element(By.ID, "failures").text
    assert "60 subtasks failed, within the failure tolerance" in panel
    groups = driver.find_elements(By.CSS_SELECTOR, "#failures li[data-reason]")
    assert len(groups) == 1
    assert f"60 \N{MULTIPLICATION SIGN} {error['code']}: {error['message']}" in groups[0].text
    named = groups[0].find_elements(By.CSS_SELECTOR, "button[data-name]")
    assert [b.text for b in named] == [f"bad_{i:02d}" for i in range(12)]
    assert "and 48 more" in groups[0].text
    assert driver.find_elements(By.CSS_SELECTOR, '.node.summary[data-layer="0"]')
    driver.find_element(By.CSS_SELECTOR, '#failures button[data-name="bad_07"]').click()
    wait_for(driver, "document.querySelector('.node.selected[data-name=bad_07]')")
    assert "bad_07" in driver.find_element(By.CSS_SELECTOR, "#panel h2").text
    screenshot(driver, "ui-big-failures")
    assert severe_console(driver) == []
