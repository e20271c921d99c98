"""A real headless Chromium (Debian's chromium + chromium-driver through selenium) against the
service under uvicorn in a thread, with every outside host unreachable."""

from __future__ import annotations

import json
import shutil
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import uvicorn
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from app.config import Settings
from app.main import create_app
from tests.conftest import make_settings

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


class LiveServer:
    """create_app(settings) served by uvicorn on a free loopback port, engine included."""

    def __init__(self, settings: Settings, port: int = 0) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart, same port
        self.sock.bind(("127.0.0.1", port))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        # open event streams are cut after a second at shutdown, as a crashed replica's would
        config = uvicorn.Config(create_app(settings), log_level="warning", lifespan="on",
                                timeout_graceful_shutdown=1)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       daemon=True)

    def __enter__(self) -> LiveServer:
        self.thread.start()
        for _ in range(300):
            if self.server.started or not self.thread.is_alive():
                break
            self.thread.join(0.05)
        assert self.server.started, "the service did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(15)
        self.sock.close()


def chromium_driver(tmp: Path) -> WebDriver:
    """Headless Chromium as root with a fresh profile, and no outside host reachable."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not shutil.which(p)]
    if missing:
        pytest.fail(f"{' and '.join(missing)} missing: `apt-get install chromium chromium-driver`"
                    " (.ci/run installs them)", pytrace=False)
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                 "--disable-default-apps", "--disable-extensions", "--no-pings",
                 "--window-size=1440,900", f"--user-data-dir={tmp}",
                 # no name but the loopback address resolves: the internet is unreachable
                 "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    return webdriver.Chrome(options=opts, service=Service(CHROMEDRIVER))


def requests_made(driver: WebDriver) -> list[dict[str, Any]]:
    """Requests the pages made since the last call: url, and why it failed if it did."""
    sent: dict[str, dict[str, Any]] = {}
    for entry in driver.get_log("performance"):
        msg = json.loads(entry["message"])["message"]
        params = msg.get("params", {})
        if msg["method"] == "Network.requestWillBeSent":
            sent[params["requestId"]] = {"url": params["request"]["url"], "blocked": None}
        elif msg["method"] == "Network.loadingFailed" and params["requestId"] in sent:
            sent[params["requestId"]]["blocked"] = params.get("blockedReason")
    return list(sent.values())


def outside(requests: list[dict[str, Any]], base: str) -> list[dict[str, Any]]:
    """The requests to anything but the service (data: and blob: URLs stay in the page)."""
    own = urlsplit(base).netloc
    return [r for r in requests
            if urlsplit(r["url"]).scheme in ("http", "https", "ws", "wss")
            and urlsplit(r["url"]).netloc != own]


def severe_console(driver: WebDriver) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def wait_for(driver: WebDriver, script: str, timeout: float = 20) -> Any:
    """Until the JavaScript expression `script` is truthy; its value."""
    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(
        lambda d: d.execute_script(f"return {script}"))


def js_seconds(s: float) -> str:
    """Seconds as the page prints them (dom.js `seconds`), for s under a minute."""
    if s < 1:
        return f"{round(s * 1000)} ms"
    return f"{s:.2f} s" if s < 10 else f"{s:.1f} s"


def stat_text(driver: WebDriver, key: str) -> str:
    """A stats card's value as the page shows it (stats.js `stat`), read in one step of the
    page: the stats re-render on a re-read of the swarm, and an element found before that is
    stale after."""
    text: str = driver.execute_script(
        "return document.querySelector(`[data-stat=\"${arguments[0]}\"] .stat-value`).innerText",
        key)
    return text


def screenshot(driver: WebDriver, name: str) -> Path:
    """Saved for a person to look at (test-artifacts/ is not committed)."""
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    assert driver.save_screenshot(str(path)), f"no screenshot {path}"
    return path


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebDriver]:
    """One browser per test module."""
    d = chromium_driver(tmp_path_factory.mktemp("chromium"))
    yield d
    d.quit()


@pytest.fixture(autouse=True)
def page_left_behind(driver: WebDriver) -> Iterator[None]:
    """For a module sharing one browser (imported beside `driver`): after each test its page is
    closed and its logs drained, so a page still polling a server its test stopped cannot put
    errors (refused connections) into the next test's console."""
    yield
    driver.get("about:blank")
    driver.get_log("browser")
    driver.get_log("performance")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """The service with its engine and the simulator, as `swarm-api serve` runs it."""
    db = tmp_path_factory.mktemp("ui") / "swarm.db"
    with LiveServer(make_settings(f"sqlite+aiosqlite:///{db}")) as live:
        yield live
