"""Fan-in without an LLM (concatenate, vote) and the synthesizer's prompt."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from app.engine.context import fit_outputs

_WS = re.compile(r"\s+")


@dataclass(frozen=True, slots=True)
class WorkerResult:
    name: str
    output: str
    weight: float = 1.0
    truncated: bool = False


def concatenate(results: Sequence[WorkerResult]) -> str:
    """Results in the given (topological) order, each under its name."""
    return "\n\n".join(f"## {r.name}\n\n{r.output}" for r in results)


def normalise_answer(text: str) -> str:
    """Case-, whitespace- and trailing-punctuation-insensitive form of an answer."""
    return _WS.sub(" ", text).strip().strip(".!").strip().casefold()


@dataclass(frozen=True, slots=True)
class Tally:
    """A vote's count (SPEC §3): `outcome` majority (the winner holds more than half the
    weight), plurality (the most, agreed by two agents or more, not more than half) or
    no_majority (no two answers agree: the result is synthesized instead); `weights`, each
    distinct answer's total weight under the earliest agent that gave it."""

    outcome: str
    winner: str | None  # the earliest agent of the winning answer (None: no majority)
    weights: dict[str, float]
    answer: str | None

    def block(self) -> dict[str, object]:
        """The swarm's `vote`."""
        return {"outcome": self.outcome, "winner": self.winner, "weights": self.weights}


def tally(results: Sequence[WorkerResult]) -> Tally | None:
    """The answer with the largest total weight; ties go to the earliest agent's answer.
    None: no result to vote on."""
    totals: dict[str, float] = {}
    first: dict[str, int] = {}
    for i, r in enumerate(results):
        key = normalise_answer(r.output)
        totals[key] = totals.get(key, 0.0) + r.weight
        first.setdefault(key, i)
    if not totals:
        return None
    weights = {results[first[k]].name: total for k, total in totals.items()}
    if len(results) > 1 and len(totals) == len(results):
        return Tally("no_majority", None, weights, None)
    winner = max(totals, key=lambda k: (totals[k], -first[k]))
    outcome = "majority" if totals[winner] * 2 > sum(totals.values()) else "plurality"
    best = results[first[winner]]
    return Tally(outcome, best.name, weights, best.output.strip())


def synthesis_prompt(task: str, results: Sequence[WorkerResult], missing: Sequence[str],
                     budget_chars: int | None = None) -> str:
    """The synthesizer's user message: the task, every result under its name (truncated
    visibly only past `budget_chars` in total), and what is absent."""
    outputs = fit_outputs([r.output for r in results], budget_chars)
    parts = [f"Task:\n{task}", "", f"Results of {len(results)} sub-agents follow."]
    for r, out in zip(results, outputs, strict=True):
        note = " (truncated: the agent hit its token limit)" if r.truncated else ""
        parts.append(f"\n### {r.name}{note}\n{out}")
    if missing:
        parts.append("\nNo result from: " + ", ".join(missing) + " (failed or skipped).")
    parts.append("\nMerge these into one coherent answer to the task. Name the agents whose "
                 "contributions you use.")
    return "\n".join(parts)


SYNTHESIZER_SYSTEM = (
    "You are the lead of a team of sub-agents. You receive their results and write the final "
    "answer for the person who asked."
)
