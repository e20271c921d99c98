"""The tool row's peer: the script a caller writes without the service, on the same simulator and
example MCP server as the row. Every agent at once (`asyncio.gather`): a turn on one aiohttp
session, each tool call it asks for on the MCP SDK's own `Client` (one per server, its default
protocol negotiation), then the answering turn; it persists nothing and checks no limit.

    .venv/bin/python -m bench.bench_tool_row … prints it beside the row; `make bench` too.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
from mcp import Client, StdioServerParameters


def openai_tools(client_tools: Any, name: str) -> list[dict[str, Any]]:
    """The server's tool `name` as an OpenAI tool definition, from its `tools/list`."""
    tool = next(t for t in client_tools.tools if t.name == name)
    return [{"type": "function", "function": {
        "name": tool.name, "description": tool.description or "",
        "parameters": tool.input_schema}}]


def tool_text(result: Any) -> str:
    """A `tools/call` result as the tool message's content: its text parts, joined."""
    text = "".join(part.text for part in result.content if getattr(part, "text", None))
    return f"error: {text}" if result.is_error else text


async def tool_gather(sim: str, server: str | StdioServerParameters, agents: int,
                      tool: str = "lookup") -> float:
    """Wall seconds of `agents` tool-using agents (a turn asking for `tool`, the call, a turn)
    against the simulator at `sim` (its latency is its own setting) and the MCP `server` (a
    streamable-HTTP URL, or a stdio command), after one warm-up agent."""
    url = f"{sim}/chat/completions"
    connector = aiohttp.TCPConnector(limit=agents)
    async with aiohttp.ClientSession(connector=connector) as http, Client(server) as mcp:
        tools = openai_tools(await mcp.list_tools(), tool)

        async def turn(messages: list[dict[str, Any]]) -> dict[str, Any]:
            body = {"model": "kimi-k2.5", "max_tokens": 200, "messages": messages,
                    "tools": tools}
            async with http.post(url, json=body) as r:
                r.raise_for_status()
                answer: dict[str, Any] = (await r.json())["choices"][0]["message"]
                return answer

        async def agent(i: int) -> str:
            messages: list[dict[str, Any]] = [
                {"role": "user", "content": f"bench {i} [[sim turns=1]]"}]
            first = await turn(messages)
            calls = first.get("tool_calls") or []
            assert calls, f"agent {i}: the simulator asked for no tool"
            messages.append(first)
            for call in calls:
                fn = call["function"]
                result = await mcp.call_tool(fn["name"], json.loads(fn["arguments"]))
                text = tool_text(result)
                assert not text.startswith("error:"), text
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": text})
            return str((await turn(messages))["content"])

        await agent(-1)
        t0 = time.perf_counter()
        await asyncio.gather(*(agent(i) for i in range(agents)))
        return time.perf_counter() - t0
