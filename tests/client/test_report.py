"""The CLI's subtask rows (swarm_api_client/report.py) say what SPEC §15 adds to a subtask: an
output that was not valid as it came, and the models passed over before the one that answered."""

from __future__ import annotations

from app.schemas import SwarmRead
from swarm_api_client.report import SUBTASK_HEADERS, swarm_report
from tests.conftest import Harness

SCHEMA = {"type": "object", "properties": {"verdict": {"enum": ["ship", "hold"]}},
          "required": ["verdict"]}


async def test_rows_name_a_repaired_output_and_the_fallbacks(api: Harness) -> None:
    data = await api.run({"task": "Release?", "synthesis": {"strategy": "none"}, "agents": [
        {"name": "judge", "model": ["kimi-k2.5", "deepseek-v3.2"], "output_schema": SCHEMA,
         "prompt": "Judge [[sim output=fence down=kimi-k2.5 retry_after=0]]"},
        {"name": "plain", "prompt": "Say it"}]})
    assert data["status"] == "succeeded", data["error"]
    rows = swarm_report(SwarmRead.model_validate(data)).rows
    assert rows is not None
    by_name = {r[0]: dict(zip(SUBTASK_HEADERS, r, strict=True)) for r in rows}
    assert by_name["judge"]["status"] == "succeeded (repaired output)"
    assert by_name["judge"]["model"] == "deepseek-v3.2 (after 1 fallback)"
    # a valid output and a first model that answered add nothing
    assert by_name["plain"]["status"] == "succeeded" and by_name["plain"]["model"] == "kimi-k2.5"
