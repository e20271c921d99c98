"""What the erase and encryption tests share: a harness with a tool server, a swarm whose
every kind of content carries a tag, and the raw tables as a reader of the database sees them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sqlalchemy import text

from app.db.tables import METADATA
from tests.conftest import Harness, make_settings, start_harness
from tests.mcp_servers import stdio_server, write_config


async def raw_dump(h: Harness) -> str:
    """Every row of every table, every column, as text: what a reader of the database files
    through SQL finds."""
    out: list[str] = []
    async with h.app.state.db_engine.connect() as conn:
        for table in METADATA.sorted_tables:
            rows = await conn.execute(text(f'SELECT * FROM "{table.name}"'))
            out += [json.dumps([str(v) for v in row]) for row in rows]
    return "\n".join(out)


async def tooled_harness(database_url: str, tmp_path: Path, **settings: Any
                         ) -> tuple[Harness, Any]:
    """A harness whose agents may call a stdio tool server's `docs.lookup`."""
    config = write_config(tmp_path / "mcp.json", {"docs": stdio_server(tmp_path / "docs.log")})
    return await start_harness(make_settings(database_url, mcp_config=config, **settings))


def content_swarm(tag: str) -> dict[str, Any]:
    """A swarm whose task, metadata, prompts, outputs, tool transcript and events carry
    `tag`: a tool-using agent, a dependent one, a structured output."""
    return {"task": f"task {tag}-task", "metadata": {"ticket": f"{tag}-meta"},
            "agents": [{"name": "reader", "tools": ["docs.lookup"],
                        "system_prompt": f"system {tag}-system", "prompt": f"{tag}-lookup"},
                       {"name": "writer", "prompt": f"prompt {tag}-prompt",
                        "depends_on": ["reader"]},
                       {"name": "shaped", "output_schema": {
                           "type": "object", "required": ["k"],
                           "properties": {"k": {"const": f"{tag}-json"}}}}]}
