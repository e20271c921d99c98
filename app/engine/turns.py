"""The turn loop of a tool-using subtask (SPEC §9).

Each turn is one gateway call (its own slot, reservation sized on the grown conversation,
retries and ledger rows) carrying the agent's tools as OpenAI functions `<server>__<tool>`.
The tool calls it asks for run in parallel through the process's ToolRegistry (per-server and
per-tool slots, critical path first); no gateway slot or reservation is held meanwhile.

Durability: the conversation is appended to `transcript_messages` once, message by message
(`seq` = position in the conversation): the assistant message with its calls as soon as it
arrives, each tool result as soon as it is back, and the turn's end in the commit that writes
the next turn's call ahead, durable before that call is sent. A takeover reloads the
transcript, runs only the calls of the last turn that have no committed result, and goes on
from there (a call in flight at a crash may run twice).
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from typing import Any

from app import tracing
from app.db.queries import get_transcript
from app.db.tables import Subtask
from app.db.types import utcnow
from app.engine.calls import CallMeter
from app.engine.faults import crash_point
from app.engine.lifecycle import CALL_FAILURES, SubtaskSteps
from app.engine.owned_swarm import EventRow, Outcome, OwnedSwarm, TranscriptRow, failure
from app.engine.repair import OutputLadder
from app.engine.writer import retrieve_exception
from app.gateway.chat import ChatResult, ToolCallRequest, Usage
from app.states import Event, ToolCallStatus
from app.tools.arguments import ArgumentsRefused, parse_arguments
from app.tools.model import ToolInfo, ToolOutcome

Message = dict[str, Any]
SEPARATOR = "__"  # <server>__<tool>
CALL_ID_MAX = 128  # tool_calls.call_id


def function_name(tool: ToolInfo) -> str:
    return f"{tool.server}{SEPARATOR}{tool.name}"


def openai_tools(tools: list[ToolInfo]) -> list[dict[str, Any]]:
    """The agent's tools in the OpenAI `tools` format, input schema as `parameters`."""
    return [{"type": "function", "function": {
        "name": function_name(t), "description": t.description,
        "parameters": t.input_schema or {"type": "object", "properties": {}}}} for t in tools]


def agent_tools(owned: OwnedSwarm, sub: Subtask) -> list[ToolInfo]:
    """The tools `sub` offers the model: its selectors over the process's registry now."""
    registry = owned.ctx.tools
    return registry.expand(sub.tools) if registry is not None else []


def assistant_message(content: str, calls: tuple[ToolCallRequest, ...]) -> Message:
    if not calls:
        return {"role": "assistant", "content": content}
    return {"role": "assistant", "content": content or None, "tool_calls": [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for c in calls]}


def ledger_ids(calls: list[ToolCallRequest] | tuple[ToolCallRequest, ...]) -> list[str]:
    """The tool ledger's call id of each call of one turn: the model's id when it is unique in
    the turn and fits the column, else one made unique from it and the call's position. The
    same calls give the same ids (a takeover's rows meet the committed ones); the transcript
    keeps the model's ids."""
    ids = [c.id for c in calls]
    seen = Counter(ids)
    own = {i for i in ids if seen[i] == 1 and len(i) <= CALL_ID_MAX}
    taken = set(own)
    out: list[str] = []
    for pos, cid in enumerate(ids):
        if cid in own:
            out.append(cid)
            continue
        for n in itertools.count(pos, len(ids)):  # past an id the model sent that looks alike
            suffix = f"#{n}"
            made = cid[:CALL_ID_MAX - len(suffix)] + suffix
            if made not in taken:
                break
        taken.add(made)
        out.append(made)
    return out


def _calls_of(message: Message) -> list[ToolCallRequest]:
    return [ToolCallRequest(c["id"], c["function"]["name"], c["function"]["arguments"])
            for c in message.get("tool_calls") or []]


class TurnLoop:
    """Runs the tool-using subtasks of one swarm; counts the swarm's tool calls."""

    def __init__(self, owned: OwnedSwarm, steps: SubtaskSteps) -> None:
        self.owned = owned
        self.steps = steps
        self.used = sum(s.tool_calls for s in owned.subs.values())
        self.outputs = OutputLadder(owned, steps)

    async def run(self, sub: Subtask, first: list[Message], *, written: CallMeter | None = None,
                  tools: list[ToolInfo] | None = None) -> Outcome:
        """Never raises but for cancellation and a lost lease. `written`: the first turn's
        meter, its attempt written with the swarm's creation, sized on `tools` (the tools the
        subtask offers then)."""
        steps, owned = self.steps, self.owned
        if tools is None:
            tools = agent_tools(owned, sub)
        offered = {function_name(t): t for t in tools}
        spec = openai_tools(tools)
        priority = self._priority(sub)
        t0 = steps.begin(sub)
        convo = await self._history(sub, first)
        ended: asyncio.Future[None] | None = None  # the last turn's end, being committed
        asked = max((k for k, m in convo.items() if m["role"] == "assistant"), default=None)
        if sub.turns and asked is not None:  # taken over after turn `sub.turns` began
            last = convo[asked]
            if not last.get("tool_calls"):  # the answer was committed, the success was not
                return await self._answered(sub, t0, convo, asked, ChatResult(
                    last.get("content") or "", "stop", Usage(), ()), sub.turns)
            # only the calls without a committed result run again: call i's result is the
            # message after the assistant's i-th (its id may repeat)
            calls = _calls_of(last)
            pending = [(asked + 1 + i, c, key) for i, (c, key)
                       in enumerate(zip(calls, ledger_ids(calls), strict=True))
                       if asked + 1 + i not in convo]
            ended = self._end_turn(sub, convo, await self._run_calls(
                sub, sub.turns, pending, offered, priority), sub.turns)
        while True:
            turn = sub.turns + 1
            messages = [convo[k] for k in sorted(convo)]
            meter = written or steps.meter(sub, messages, turn, spec or None)
            written = None
            try:
                async with steps.slots(sub):
                    if ended is not None:
                        # the call's attempt is written ahead while the last turn's end is
                        # queued: one commit for both on every agent's path from its tool
                        # results to its next call, not one each; the end is durable before
                        # the call is sent (its budget reserved in its slots, as every retry's)
                        await meter.prepare()
                        await ended
                        ended = None
                        crash_point("between_turns", sub.name)
                    crash_point("before_call", sub.name)
                    result, rows = await steps.gateway(sub, messages, turn, tools=spec or None,
                                                       meter=meter)
            except CALL_FAILURES as exc:
                return await steps.call_failed(sub, t0, exc)
            finally:
                await meter.release()  # written ahead but never sent: no cost
            sub.turns = turn
            sub.sanitized = sub.sanitized or result.sanitized
            seq = max(convo) + 1
            reply = assistant_message(result.content, result.tool_calls)
            # new transcript rows: the opening messages go with the first turn's answer
            rows_t = [self._row(sub, k, 0, convo[k]) for k in sorted(convo)] if turn == 1 else []
            rows_t.append(self._row(sub, seq, turn, reply))
            convo[seq] = reply
            if not result.tool_calls:
                sub.truncated = result.finish_reason == "length"
                owned.journal.commit_soon([sub], ledger=rows, tools=([], rows_t),
                                   events=[self._event(sub, turn, [])])
                return await self._answered(sub, t0, convo, seq, result, turn)
            if turn >= sub.max_turns:
                owned.journal.commit_soon([sub], ledger=rows, tools=([], rows_t))
                return await steps.fail(sub, t0, failure(
                    "max_turns_exceeded", f"still calling tools after {turn} turns "
                    f"(max_turns {sub.max_turns})", max_turns=sub.max_turns))
            limit = int(owned.limits.get("max_tool_calls", 1000))
            if self.used + len(result.tool_calls) > limit:
                owned.journal.commit_soon([sub], ledger=rows, tools=([], rows_t))
                return steps.stop_swarm(sub, failure(
                    "tool_budget_exceeded", f"the swarm reached max_tool_calls ({limit})",
                    max_tool_calls=limit))
            self.used += len(result.tool_calls)
            owned.journal.commit_soon([sub], ledger=rows, tools=([], rows_t))
            pending = [(seq + 1 + i, c, key) for i, (c, key) in enumerate(
                zip(result.tool_calls, ledger_ids(result.tool_calls), strict=True))]
            ended = self._end_turn(sub, convo, await self._run_calls(
                sub, turn, pending, offered, priority), turn)

    async def _answered(self, sub: Subtask, t0: float, convo: dict[int, Message], seq: int,
                        result: ChatResult, turn: int) -> Outcome:
        """The final answer (message `seq`): as it is, or through the output schema's
        ladder, whose repair turn (no tools) is numbered after this turn."""
        if self.outputs.schema(sub) is None:
            return await self.steps.succeed(sub, t0, result.content, [])
        before = [convo[k] for k in sorted(convo) if k < seq]
        return await self.outputs.settle(sub, t0, before, result, [], call_no=turn)

    async def _history(self, sub: Subtask, first: list[Message]) -> dict[int, Message]:
        """seq -> message: the committed transcript after a takeover, else the opening."""
        if sub.turns:
            async with self.owned.ctx.writer.sessions() as session, session.begin():
                rows = await get_transcript(session, sub.swarm_id, sub.name)
            if rows:
                return {m.seq: m.message for m in rows}
            sub.turns = 0  # counted but nothing durable: start over
        return dict(enumerate(first))

    def _end_turn(self, sub: Subtask, convo: dict[int, Message],
                  done: list[tuple[int, Message, dict[str, str]]], turn: int
                  ) -> asyncio.Future[None]:
        """The turn's results in the conversation and its end queued for the next commit
        (awaited before the next turn's call is sent)."""
        for seq, message, _ in done:
            convo[seq] = message
        ended = self.owned.journal.queue(
            [sub], events=[self._event(sub, turn, [d for *_, d in done])])
        ended.add_done_callback(retrieve_exception)  # a call failing first never awaits it
        return ended

    def _priority(self, sub: Subtask) -> int:
        """The length of the dependency chain behind `sub` (its calls' slot priority): the
        swarm's, computed once per change of its graph (`RunnerState.chain_below`)."""
        return self.owned.chain_below().get(sub.name, 1)

    async def _run_calls(self, sub: Subtask, turn: int,
                         pending: list[tuple[int, ToolCallRequest, str]],
                         offered: dict[str, ToolInfo], priority: int,
                         ) -> list[tuple[int, Message, dict[str, str]]]:
        """Every call in parallel (each with its seq and ledger id); each result committed
        (soon) as it comes back."""

        async def one(seq: int, call: ToolCallRequest, key: str
                      ) -> tuple[int, Message, dict[str, str]]:
            tool = offered.get(call.name)
            server, _, name = call.name.partition(SEPARATOR)
            # the MCP SDK sends this span's traceparent in the request's _meta (SEP-414)
            with tracing.tool_span(server[:64], name[:128], key):
                if tool is None:
                    outcome = ToolOutcome(ToolCallStatus.error,
                                          f"error: unknown tool {call.name!r}", 0.0, 0)
                else:
                    server, name = tool.server, tool.name
                    outcome = await self._call(tool, call.arguments, priority)
                if outcome.status is not ToolCallStatus.ok:
                    tracing.record_error(outcome.status)
            message = {"role": "tool", "tool_call_id": call.id, "content": outcome.text}
            sub.tool_calls += 1
            ledger = {"swarm_id": sub.swarm_id, "subtask_name": sub.name, "turn": turn,
                      "call_id": key, "server": server[:64], "tool": name[:128],
                      "status": outcome.status, "latency_ms": round(outcome.latency_s * 1000, 3),
                      "result_bytes": outcome.result_bytes, "created_at": utcnow()}
            self.owned.journal.commit_soon(
                [sub], tools=([ledger], [self._row(sub, seq, turn, message)]))
            return seq, message, {"name": call.name, "status": outcome.status}

        return list(await asyncio.gather(*(one(*p) for p in pending)))

    async def _call(self, tool: ToolInfo, arguments: str, priority: int) -> ToolOutcome:
        registry = self.owned.ctx.tools
        assert registry is not None  # offered tools come from it
        try:  # the model's arguments are outside text: bounded, parsed, cleaned
            args = parse_arguments(arguments, registry.args_max_bytes)
        except ArgumentsRefused as exc:
            return ToolOutcome(ToolCallStatus.error, f"error: {exc}", 0.0, 0)
        return await registry.call(tool.server, tool.name, args, priority)

    def _row(self, sub: Subtask, seq: int, turn: int, message: Message) -> TranscriptRow:
        return {"swarm_id": sub.swarm_id, "subtask_name": sub.name, "seq": seq, "turn": turn,
                "message": message, "created_at": utcnow()}

    def _event(self, sub: Subtask, turn: int, calls: list[dict[str, str]]) -> EventRow:
        return self.owned.event(Event("subtask.turn",
                                       {"name": sub.name, "turn": turn, "tools": calls}))
