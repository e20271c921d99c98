"""The LangGraph peer of the fan-out benchmark: N `Send`s to an agent node, then a synthesis
node, each node one chat completion against the same simulator. Run with the benchmark-only
virtualenv (`make bench` creates .venv-bench with a pinned langgraph; never a dependency of the
service). Prints one JSON object: {"walls": [seconds, ...]}.

    .venv-bench/bin/python bench/peer_langgraph.py SIM_URL AGENTS LATENCY_MS RUNS
"""

from __future__ import annotations

import asyncio
import json
import operator
import sys
import time
from typing import Annotated, Any, TypedDict

import httpx
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send


class State(TypedDict):
    agents: int
    results: Annotated[list[str], operator.add]
    answer: str


def main() -> None:
    sim, agents, latency_ms, runs = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    directive = f"[[sim latency_ms={latency_ms}]]"

    async def run() -> list[float]:
        async with httpx.AsyncClient(limits=httpx.Limits(max_connections=agents + 1),
                                     timeout=60) as client:
            async def chat(system: str, user: str) -> str:
                r = await client.post(f"{sim}/chat/completions", json={
                    "model": "kimi-k2.5", "max_tokens": 200,
                    "messages": [{"role": "system", "content": f"{system} {directive}"},
                                 {"role": "user", "content": user}]})
                r.raise_for_status()
                return str(r.json()["choices"][0]["message"]["content"])

            async def agent(state: dict[str, Any]) -> dict[str, Any]:
                return {"results": [await chat(f"You are agent {state['i']}.",
                                               "benchmark fan-out")]}

            async def synth(state: State) -> dict[str, Any]:
                return {"answer": await chat("You merge results.",
                                             "\n".join(state["results"])[:4000])}

            def fan_out(state: State) -> list[Send]:
                return [Send("agent", {"i": i}) for i in range(state["agents"])]

            g = StateGraph(State)
            g.add_node("agent", agent)
            g.add_node("synth", synth)
            g.add_conditional_edges(START, fan_out, ["agent"])
            g.add_edge("agent", "synth")
            g.add_edge("synth", END)
            graph = g.compile()
            await graph.ainvoke({"agents": 2, "results": [], "answer": ""})  # warm-up
            walls = []
            for _ in range(runs):
                t0 = time.perf_counter()
                await graph.ainvoke({"agents": agents, "results": [], "answer": ""})
                walls.append(time.perf_counter() - t0)
            return walls

    print(json.dumps({"walls": asyncio.run(run())}))


if __name__ == "__main__":
    main()
