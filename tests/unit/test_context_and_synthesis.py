"""Fitting text to a window (context.py) and fan-in without an LLM (synthesis.py)."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from app.engine.context import (
    estimate_prompt_tokens,
    fair_shares,
    fit_outputs,
    truncate_marked,
    with_dependencies,
)
from app.engine.synthesis import WorkerResult, concatenate, normalise_answer, tally


@given(st.lists(st.integers(0, 10_000), max_size=20), st.integers(0, 50_000))
def test_fair_shares_never_exceed_the_total_nor_an_item(sizes: list[int], total: int) -> None:
    shares = fair_shares(sizes, total)
    assert sum(shares) <= total
    assert all(0 <= s <= size for s, size in zip(shares, sizes, strict=True))
    if sum(sizes) <= total:
        assert shares == sizes  # everything fits: nothing is cut


def test_fair_shares_keep_small_items_whole_and_split_the_rest() -> None:
    assert fair_shares([10, 1000, 1000], 410) == [10, 200, 200]


def test_truncation_is_visible_and_fits() -> None:
    assert truncate_marked("short", 100) == "short"
    cut = truncate_marked("x" * 1000, 200)
    assert cut.startswith("x" * 120) and "[... truncated: 880 characters omitted" in cut
    assert fit_outputs(["a" * 50, "b" * 50], None) == ["a" * 50, "b" * 50]
    fitted = fit_outputs(["a" * 10, "b" * 1000], 300)
    assert fitted[0] == "a" * 10 and "truncated" in fitted[1]


def test_prompt_token_bound_is_bytes_plus_overhead() -> None:
    msgs = [{"role": "system", "content": "héllo"}, {"role": "user", "content": "abc"}]
    assert estimate_prompt_tokens(msgs) == 8 + (6 + 8) + (3 + 8)


def test_prompt_token_bound_takes_any_message_shape() -> None:
    """Null content with tool calls, content parts, tool results: each bounded by its JSON
    bytes (a tool-using conversation sent without tools, its tools gone from the listing)."""
    calls = [{"id": "c1", "type": "function",
              "function": {"name": "srv__tool", "arguments": '{"q": "x"}'}}]
    msgs = [{"role": "user", "content": "go"},
            {"role": "assistant", "content": None, "tool_calls": calls},
            {"role": "tool", "tool_call_id": "c1", "content": "result"},
            {"role": "user", "content": [{"type": "text", "text": "part"}]},
            {"role": "assistant", "content": "said", "tool_calls": calls}]
    bound = estimate_prompt_tokens(msgs)
    for m in msgs[1:]:  # every byte the gateway may tokenize is under the bound
        assert estimate_prompt_tokens([m]) >= len(json.dumps(m).encode())
    assert bound == 8 + sum(estimate_prompt_tokens([m]) - 8 for m in msgs)


def test_dependencies_follow_the_prompt_under_their_names() -> None:
    assert with_dependencies("do it", []) == "do it"
    text = with_dependencies("do it", [("a", "out a"), ("b", "out b")])
    assert text.index("do it") < text.index("### a\nout a") < text.index("### b\nout b")


def test_vote_weights_normalisation_and_ties() -> None:
    assert tally([]) is None
    rs = [WorkerResult("a", "Paris."), WorkerResult("b", "london"),
          WorkerResult("c", "  paris "), WorkerResult("d", "London", weight=1.5)]
    t = tally(rs)
    assert t is not None and t.answer == "london"  # 2.5 against 2.0, the earliest's words
    assert (t.outcome, t.winner, t.weights) == ("majority", "b", {"a": 2.0, "b": 2.5})
    tie = [WorkerResult("a", "yes"), WorkerResult("b", "no"), WorkerResult("c", "No"),
           WorkerResult("d", "yes")]
    t = tally(tie)
    assert t is not None and (t.answer, t.outcome) == ("yes", "plurality")  # earliest wins
    assert normalise_answer("  Hello   World!! ") == "hello world"


def test_a_vote_where_no_two_answers_agree_has_no_majority() -> None:
    t = tally([WorkerResult(n, f"answer {n}") for n in "abcde"])
    assert t is not None and (t.outcome, t.winner, t.answer) == ("no_majority", None, None)
    assert t.weights == dict.fromkeys("abcde", 1.0)
    assert t.block() == {"outcome": "no_majority", "winner": None, "weights": t.weights}
    one = tally([WorkerResult("a", "alone")])  # one answer agrees with itself
    assert one is not None and (one.outcome, one.answer) == ("majority", "alone")


def test_concatenate_keeps_order_and_names() -> None:
    out = concatenate([WorkerResult("b", "2"), WorkerResult("a", "1")])
    assert out == "## b\n\n2\n\n## a\n\n1"
