"""Requests without `agent_swarm` go to the gateway unchanged, streamed or not, and are metered:
the gateway's content and usage come back, every attempt is a ledger row (so `/usage` shows
it), a 429 after our retries is the caller's 429, and the daily cap holds."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import openai
import pytest

from tests.facade.conftest import Facade, start_facade
from tests.helpers import until

PLAIN = {"model": "deepseek-v3.2", "max_tokens": 300,
         "messages": [{"role": "system", "content": "Be brief."},
                      {"role": "user", "content": "Name three risks of a schema migration"}]}


def ledger(usage: dict[str, Any], model: str = "deepseek-v3.2") -> dict[str, Any]:
    items = {i["key"]: i for i in usage["items"]}
    return items.get(model) or {"gateway_calls": 0, "prompt_tokens": 0,
                                "completion_tokens": 0, "cost_usd": "0"}


async def test_plain_call_relays_the_gateways_answer(facade: Facade) -> None:
    expected = (await facade.direct(PLAIN)).json()
    completion = await facade.sdk().chat.completions.create(**PLAIN)  # type: ignore[call-overload]
    assert completion.choices[0].message.content == expected["choices"][0]["message"]["content"]
    assert completion.usage.model_dump(exclude_none=True)["prompt_tokens"] == \
        expected["usage"]["prompt_tokens"]
    assert completion.usage.completion_tokens == expected["usage"]["completion_tokens"]
    assert getattr(completion, "swarm_id", None) is None
    row = ledger(await facade.usage())
    assert row["gateway_calls"] == 1
    assert (row["prompt_tokens"], row["completion_tokens"]) == (
        expected["usage"]["prompt_tokens"], expected["usage"]["completion_tokens"])
    # priced like any call: deepseek-v3.2 costs 0.27 / 0.42 USD per 1M tokens
    cost = (Decimal(row["prompt_tokens"]) * Decimal("0.27")
            + Decimal(row["completion_tokens"]) * Decimal("0.42")) / 1_000_000
    assert Decimal(row["cost_usd"]) == cost


async def test_streamed_call_relays_chunks_and_usage(facade: Facade) -> None:
    expected = (await facade.direct(PLAIN)).json()
    stream = await facade.sdk().chat.completions.create(  # type: ignore[call-overload]
        **PLAIN, stream=True, stream_options={"include_usage": True})
    chunks = [c async for c in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected["choices"][0]["message"]["content"]
    assert len([c for c in chunks if c.choices]) > 2  # relayed chunk by chunk, not as one
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (
        expected["usage"]["prompt_tokens"], expected["usage"]["completion_tokens"])
    row = ledger(await facade.usage())
    assert (row["gateway_calls"], row["prompt_tokens"], row["completion_tokens"]) == (
        1, usage.prompt_tokens, usage.completion_tokens)


async def test_stream_without_include_usage_is_still_billed(facade_sqlite: Facade) -> None:
    facade = facade_sqlite
    expected = (await facade.direct(PLAIN)).json()["usage"]
    stream = await facade.sdk().chat.completions.create(  # type: ignore[call-overload]
        **PLAIN, stream=True)
    chunks = [c async for c in stream]
    assert all(c.choices and c.usage is None for c in chunks)  # no usage chunk: not asked
    row = ledger(await facade.usage())
    assert (row["prompt_tokens"], row["completion_tokens"]) == (
        expected["prompt_tokens"], expected["completion_tokens"])


async def test_over_reported_usage_is_billed_the_requests_bounds(facade_sqlite: Facade) -> None:
    """A gateway claiming a million completion tokens for `max_tokens: 20` is relayed as it
    said, and billed the 20 the request allowed: the daily cap holds in real money."""
    body = {**PLAIN, "max_tokens": 20, "messages": [
        {"role": "user", "content": "[[sim completion_tokens=1000000]] Name a risk"}]}
    completion = await facade_sqlite.sdk().chat.completions.create(  # type: ignore[call-overload]
        **body)
    assert completion.usage.completion_tokens == 1_000_000  # the gateway's answer, unchanged
    row = ledger(await facade_sqlite.usage())
    assert row["completion_tokens"] == 20
    assert Decimal(row["cost_usd"]) == (Decimal(row["prompt_tokens"]) * Decimal("0.27")
                                        + 20 * Decimal("0.42")) / 1_000_000


async def test_gateway_429_after_retries_is_a_429(facade: Facade) -> None:
    body = {**PLAIN, "messages": [{"role": "user",
                                   "content": "hi [[sim fail=429 retry_after_ms=10]]"}]}
    with pytest.raises(openai.RateLimitError) as caught:
        await facade.sdk(max_retries=0).chat.completions.create(**body)
    response = caught.value.response
    assert response.status_code == 429 and int(response.headers["retry-after"]) >= 1
    assert caught.value.body["code"] == "rate_limited"  # type: ignore[index]
    assert caught.value.body["type"] == "rate_limit_error"  # type: ignore[index]
    row = ledger(await facade.usage())
    assert row["gateway_calls"] == 3 and row["cost_usd"] == "0"  # every attempt is a row


async def test_gateway_400_is_not_retried(facade_sqlite: Facade) -> None:
    body = {**PLAIN, "messages": [{"role": "user", "content": "hi [[sim fail=400]]"}]}
    with pytest.raises(openai.BadRequestError) as caught:
        await facade_sqlite.sdk(max_retries=0).chat.completions.create(**body)
    assert caught.value.body["code"] == "gateway_rejected"  # type: ignore[index]
    assert ledger(await facade_sqlite.usage())["gateway_calls"] == 1


async def test_streamed_429_before_the_first_event_is_a_429(facade_sqlite: Facade) -> None:
    body = {**PLAIN, "messages": [{"role": "user",
                                   "content": "hi [[sim fail=429 times=1 retry_after_ms=5]]"}]}
    # the first attempt's 429 is retried before anything reached the caller
    stream = await facade_sqlite.sdk(max_retries=0).chat.completions.create(
        **body, stream=True)  # type: ignore[call-overload]
    assert "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert ledger(await facade_sqlite.usage())["gateway_calls"] == 2
    body["messages"] = [{"role": "user", "content": "hi [[sim fail=429 retry_after_ms=5]]"}]
    with pytest.raises(openai.RateLimitError):
        await facade_sqlite.sdk(max_retries=0).chat.completions.create(
            **body, stream=True)  # type: ignore[call-overload]


def metric(text: str, sample: str) -> float:
    for line in text.splitlines():
        if line.startswith(sample + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


DENIED = 'swarm_budget_denials_total{scope="daily"}'
OK_CALLS = 'swarm_gateway_requests_total{model="deepseek-v3.2",outcome="ok"}'


async def test_daily_cap_refuses_what_it_cannot_cover(sqlite_url: str) -> None:
    async with start_facade(sqlite_url, daily_budget_usd=Decimal("0.0005")) as facade:
        before = (await facade.http.get("/metrics")).text
        small = await facade.sdk().chat.completions.create(**PLAIN)  # type: ignore[call-overload]
        assert small.choices[0].message.content
        big = {**PLAIN, "model": "claude-sonnet-4.5", "max_tokens": 64_000}  # 0.96 USD worst
        with pytest.raises(openai.RateLimitError) as caught:
            await facade.sdk(max_retries=0).chat.completions.create(**big)
        assert caught.value.body["code"] == "quota_exceeded"  # type: ignore[index]
        assert int(caught.value.response.headers["retry-after"]) >= 1
        usage = await facade.usage()
        assert usage["total"]["gateway_calls"] == 1  # the refused call never reached it
        after = (await facade.http.get("/metrics")).text
        assert metric(after, DENIED) - metric(before, DENIED) == 1
        assert metric(after, OK_CALLS) - metric(before, OK_CALLS) == 1


async def test_a_streaming_caller_that_leaves_is_still_billed(facade_sqlite: Facade) -> None:
    stream = await facade_sqlite.sdk().chat.completions.create(  # type: ignore[call-overload]
        **PLAIN, stream=True)
    await anext(aiter(stream))
    await stream.close()  # gone after the first chunk

    async def billed() -> dict[str, Any] | None:
        row = ledger(await facade_sqlite.usage())
        return row if row["gateway_calls"] else None

    row = await until(billed, 10, "the abandoned stream's ledger row")
    assert row["gateway_calls"] == 1 and row["prompt_tokens"] > 0
