"""How the /ui DAG view scales: layout (JS, no DOM) and the first draw (DOM + style + layout)
of swarms of 100, 300 and 1000 subtasks in headless Chromium, and each size's cost per node
relative to the smallest (1.0 = linear).

    .venv/bin/python -m bench.bench_ui_layout [--rounds 3]

The service runs without an engine (swarms stay queued), so only the page does work.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path
from typing import Any

import httpx

from tests.browser import LiveServer, chromium_driver, wait_for
from tests.conftest import make_settings

SIZES = (100, 300, 1000)
MEASURE = """
const done = arguments[arguments.length - 1];
(async () => {
  const m = await import('/ui/static/dag.js');
  const s = await (await fetch(location.pathname.replace('/ui', ''))).json();
  const out = {layout: [], draw: []};
  for (let i = 0; i < arguments[0]; i++) {
    let t = performance.now();
    m.layout(s.subtasks);
    out.layout.push(performance.now() - t);
    const box = document.createElement('div');
    document.body.append(box);
    const view = new m.DagView(box, {onSelect() {}});
    view.subtasks = new Map(s.subtasks.map((x) => [x.name, x]));
    t = performance.now();
    view.draw(s.subtasks);
    document.body.offsetHeight;  // style and layout of what was drawn
    out.draw.push(performance.now() - t);
    box.remove();
  }
  done(out);
})().catch((e) => done(String(e)));
"""


def fan_out(total: int) -> dict[str, Any]:
    """`total` subtasks: workers, reviewers of 40 workers each, and the synthesizer."""
    reviewers = max(1, total // 41)
    workers = total - reviewers - 1
    agents: list[dict[str, Any]] = [{"name": f"agent_{i:04d}"} for i in range(workers)]
    agents += [{"name": f"review_{r:02d}",
                "depends_on": [f"agent_{j:04d}" for j in range(r * 40, min(r * 40 + 40, workers))]}
               for r in range(reviewers)]
    return {"task": f"bench {total}", "agents": agents}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    driver = chromium_driver(tmp / "chromium")
    driver.set_script_timeout(300)
    rows = []
    try:
        with LiveServer(make_settings(f"sqlite+aiosqlite:///{tmp}/bench.db", engine=False)) as live:
            for size in SIZES:
                sid = httpx.post(f"{live.url}/swarms", json=fan_out(size), timeout=60).json()["id"]
                driver.get(f"{live.url}/ui/swarms/{sid}")
                wait_for(driver, f"document.querySelectorAll('.node[data-name]').length === {size}",
                         120)
                res = driver.execute_async_script(MEASURE, args.rounds + 1)
                assert isinstance(res, dict), res
                rows.append((size, statistics.median(res["layout"][1:]),
                             statistics.median(res["draw"][1:])))
    finally:
        driver.quit()
    base = rows[0]
    print("| subtasks | layout (JS) ms | first draw ms | draw per node vs 100 |")
    print("|---:|---:|---:|---:|")
    for size, lay, draw in rows:
        ratio = (draw / size) / (base[2] / base[0])
        print(f"| {size} | {lay:.1f} | {draw:.0f} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
