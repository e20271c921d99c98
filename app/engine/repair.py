"""The repair ladder of structured outputs (SPEC §15): from a schema subtask's first answer to
its end — valid; repaired without a call (a fence, prose) or with one repair turn (a gateway
call like any: slots, ledger, budget); else failed `output_invalid`. A gateway that refuses
`json_schema` is asked once more with `json_object` and the schema in the system message."""

from __future__ import annotations

from typing import Any

from app import metrics, tracing
from app.db.tables import Subtask
from app.engine.lifecycle import CALL_FAILURES, SubtaskSteps
from app.engine.outputs import (
    JSON_OBJECT,
    json_text,
    judge,
    refuses_format,
    repair_messages,
    response_format,
    with_schema,
)
from app.engine.owned_swarm import LedgerRow, Outcome, OwnedSwarm, failure
from app.gateway.chat import ChatResult


class OutputLadder:
    """Settles the answers of one swarm's subtasks that carry an output schema."""

    def __init__(self, owned: OwnedSwarm, steps: SubtaskSteps) -> None:
        self.owned = owned
        self.steps = steps

    def schema(self, sub: Subtask) -> dict[str, Any] | None:
        return self.steps.schemas.get(sub.name)

    def refused(self, sub: Subtask, exc: Exception) -> bool:
        """The call failed only because the gateway takes no `json_schema`: asked again."""
        return refuses_format(exc) and self.schema(sub) is not None

    async def settle(self, sub: Subtask, t0: float, messages: list[dict[str, Any]],
                     answer: ChatResult | None, rows: list[LedgerRow], call_no: int = 1
                     ) -> Outcome:
        """From the answer of call `call_no` (None: the gateway refused json_schema) to the
        subtask's end: valid, repaired (without a call, or after one repair turn), or
        failed `output_invalid`. Later calls take the next numbers."""
        schema = self.schema(sub)
        assert schema is not None
        fmt = response_format(schema, sub.name)
        sub.output_format = "json_schema"
        if answer is None:  # asked once more as json_object, the schema in the system message
            messages, fmt, call_no = with_schema(messages, schema), JSON_OBJECT, call_no + 1
            sub.output_format = "json_object"
            tracing.event("response_format_fallback", to="json_object")
            got = await self._ask(sub, t0, messages, call_no, fmt)
            if isinstance(got, Outcome):
                return got
            answer, rows = got
        judged = judge(schema, answer.content)
        status = {"whole": "valid", "extracted": "repaired"}.get(judged.how or "")
        if status is None:
            # the first answer is billed either way
            self.owned.journal.commit_soon([sub], ledger=rows)
            repair = repair_messages(messages, answer.content, judged.errors)
            got = await self._ask(sub, t0, repair, call_no + 1, fmt)
            if isinstance(got, Outcome):
                return got
            answer, rows = got
            judged = judge(schema, answer.content)
            status = "repaired" if judged.how is not None else None
        sub.truncated = answer.finish_reason == "length"
        sub.sanitized = sub.sanitized or answer.sanitized
        if status is None:
            sub.output_status = "invalid"
            metrics.structured_outputs.labels("invalid").inc()
            err = failure("output_invalid", "the answer is not valid for the output schema "
                          "after one repair turn", errors=judged.errors)
            self.owned.failing(sub.name, err)
            return await self.steps.fail(sub, t0, err, rows)
        sub.output_json, sub.output_status = judged.value, status
        metrics.structured_outputs.labels(status).inc()
        return await self.steps.succeed(sub, t0, json_text(judged.value), rows)

    async def _ask(self, sub: Subtask, t0: float, messages: list[dict[str, Any]],
                   call_no: int, fmt: dict[str, Any]
                   ) -> tuple[ChatResult, list[LedgerRow]] | Outcome:
        """One more call of the subtask (slots, ledger, budget like any); an Outcome when it
        ended the subtask instead."""
        steps = self.steps
        try:
            async with steps.slots(sub):
                if self.owned.stopping:
                    return Outcome.swarm_stopping
                return await steps.gateway(sub, messages, call_no, fmt)
        except CALL_FAILURES as exc:
            steps.failing(sub, exc)
            return await steps.call_failed(sub, t0, exc)
