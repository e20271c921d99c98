"""The README example end to end on both databases."""

from __future__ import annotations

from tests.conftest import Harness

README_BODY = {
    "task": "Review the v1 -> v2 migration of our FastAPI payment service",
    "agents": [
        {"name": "code_analyst", "system_prompt": "You are a senior code analyst."},
        {"name": "risk_auditor", "system_prompt": "You are a security auditor.",
         "model": "deepseek-v3.2"},
        {"name": "test_designer", "system_prompt": "You are a QA engineer.",
         "depends_on": ["code_analyst"]},
        {"name": "doc_writer", "system_prompt": "You write release notes.",
         "prompt": "Write the notes", "depends_on": ["code_analyst", "risk_auditor",
                                                     "test_designer"]},
    ],
    "limits": {"concurrency": 8, "budget_usd": 5.0},
}


async def test_readme_swarm_succeeds_with_outputs_usage_and_cost(harness: Harness) -> None:
    data = await harness.run(README_BODY)
    assert data["status"] == "succeeded", data["error"]
    names = [s["name"] for s in data["subtasks"]]
    assert names == ["code_analyst", "risk_auditor", "test_designer", "doc_writer",
                     "@synthesizer"]
    assert all(s["status"] == "succeeded" and s["output"] for s in data["subtasks"])
    assert data["progress"] == {"total": 5, "pending": 0, "running": 0, "succeeded": 5,
                                "failed": 0, "skipped": 0, "cancelled": 0}
    assert data["result"]
    assert data["usage"]["gateway_calls"] == 5
    assert float(data["usage"]["cost_usd"]) > 0
    assert data["subtasks"][1]["model"] == "deepseek-v3.2"
    assert data["timing"]["serial_s"] >= data["timing"]["critical_path_s"] > 0
