"""/v1 answers errors in OpenAI's shape with SPEC §3 statuses, so the SDK raises its own
classes; the models list is the price table; the OpenAPI document says all of it."""

from __future__ import annotations

import gzip
import json
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from sqlalchemy import delete

from app.api.openai_swarm import request_field
from app.db.session import make_db_engine, make_session_factory
from app.db.tenant_tables import TenantDailySpend
from app.pricing import BUILTIN_MODELS
from app.schemas import SwarmCreate
from tests.facade.conftest import Facade, start_facade

SWARM = {"model": "kimi-k2.5", "messages": [{"role": "user", "content": "Review the code"}]}


def error_of(r: httpx.Response) -> dict[str, Any]:
    body = r.json()
    assert set(body) == {"error"}, body
    err: dict[str, Any] = body["error"]
    assert {"message", "type", "param", "code"} <= set(err), err
    return err


async def test_models_are_the_priced_models(facade_sqlite: Facade) -> None:
    page = await facade_sqlite.sdk().models.list()
    assert sorted(m.id for m in page.data) == sorted(BUILTIN_MODELS)
    assert {m.object for m in page.data} == {"model"}


async def test_wrong_key_is_the_sdks_authentication_error(facade_sqlite: Facade) -> None:
    wrong = openai.AsyncOpenAI(base_url=f"{facade_sqlite.base_url}/v1", api_key="nope")
    with pytest.raises(openai.AuthenticationError) as caught:
        await wrong.chat.completions.create(**SWARM)  # type: ignore[call-overload]
    assert caught.value.body["type"] == "authentication_error"  # type: ignore[index]
    with pytest.raises(openai.AuthenticationError):
        await wrong.models.list()
    r = await facade_sqlite.http.post("/v1/chat/completions", json=SWARM,
                                      headers={"Authorization": ""})
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert error_of(r)["code"] == "unauthorized"


@pytest.mark.parametrize("auth", [{}, {"Authorization": "Bearer nope"}])
async def test_the_key_is_checked_before_the_body(facade_sqlite: Facade,
                                                  auth: dict[str, str]) -> None:
    """FastAPI reads a body before it resolves dependencies: without a key first, a caller
    with no (or a wrong) key was told its body was malformed (400) or invalid (422)."""
    for body in (b"{not json", b'{"model": 7}'):
        r = await facade_sqlite.http.post("/v1/chat/completions", content=body, headers={
            **auth, "Content-Type": "application/json", "Authorization": auth.get(
                "Authorization", "")})
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", r.text
        assert error_of(r)["code"] == "unauthorized"


async def test_the_routers_own_errors_on_v1_are_in_openais_shape(facade_sqlite: Facade) -> None:
    """A path or method /v1 does not serve is answered by the router, not a route: in
    OpenAI's shape too (it was the SPEC's), its 405 naming the methods served."""
    for method, path, status, code in (
            ("POST", "/v1/models", 405, "method_not_allowed"),
            ("GET", "/v1/chat/completions", 405, "method_not_allowed"),
            ("GET", "/v1/embeddings", 404, "not_found")):
        r = await facade_sqlite.http.request(method, path)
        assert r.status_code == status, (method, path, r.text)
        err = error_of(r)
        assert err["code"] == code and err["type"] in ("invalid_request_error",
                                                       "not_found_error"), err
    r = await facade_sqlite.http.post("/v1/models")
    assert r.headers["allow"] == "GET, HEAD"
    with pytest.raises(openai.NotFoundError):  # the SDK reads it as its own
        await facade_sqlite.sdk().embeddings.create(model="kimi-k2.5", input="x")


async def test_unknown_agent_swarm_key_is_a_400_naming_it(facade_sqlite: Facade) -> None:
    sdk = facade_sqlite.sdk(max_retries=0)
    with pytest.raises(openai.BadRequestError) as caught:
        await sdk.chat.completions.create(  # type: ignore[call-overload]
            **SWARM, extra_body={"agent_swarm": {"enabled": True, "aggregate_tokens": True}})
    body: Any = caught.value.body
    assert body["param"] == "agent_swarm.aggregate_tokens"
    assert body["code"] == "unknown_parameter" and "aggregate_tokens" in body["message"]
    r = await facade_sqlite.http.get("/swarms")
    assert r.json()["items"] == []  # nothing was stored


INVALID: list[tuple[dict[str, Any], int, str, str]] = [
    ({**SWARM, "n": 2, "agent_swarm": {"enabled": True}}, 400, "unsupported_parameter", "n"),
    ({**SWARM, "agent_swarm": {"enabled": True, "fan_in_strategy": "best"}}, 422,
     "validation_error", "agent_swarm.fan_in_strategy"),
    ({**SWARM, "agent_swarm": {"enabled": True, "failure_tolerance": 2}}, 422,
     "validation_error", "agent_swarm.failure_tolerance"),
    ({**SWARM, "agent_swarm": {"enabled": True, "max_sub_agents": 0}}, 422,
     "validation_error", "agent_swarm.max_sub_agents"),
    ({**SWARM, "agent_swarm": {"max_sub_agents": 3}}, 422, "validation_error",
     "agent_swarm.enabled"),
    ({**SWARM, "model": "gpt-9", "agent_swarm": {"enabled": True}}, 422, "unknown_model",
     "model"),
    ({**SWARM, "model": "gpt-9"}, 422, "unknown_model", "model"),  # passthrough too
    ({"model": "kimi-k2.5", "messages": []}, 422, "validation_error", "messages"),
    ({"model": "kimi-k2.5", "messages": [{"role": "system", "content": "x"}],
      "agent_swarm": {"enabled": True}}, 422, "validation_error", "messages"),
    ({"model": "kimi-k2.5", "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
      "agent_swarm": {"enabled": True}}, 400, "unsupported_content", "messages.0.content.0"),
    ({**SWARM, "max_tokens": 0}, 422, "validation_error", "max_tokens"),
    # flags are JSON booleans (schemathesis' negative_data_rejection: `"enabled": 0` ran)
    ({**SWARM, "agent_swarm": {"enabled": 0}}, 422, "validation_error", "agent_swarm.enabled"),
    ({**SWARM, "agent_swarm": {"enabled": True, "streaming": "no"}}, 422, "validation_error",
     "agent_swarm.streaming"),
    ({**SWARM, "stream": 1}, 422, "validation_error", "stream"),
    # numbers are JSON numbers: `"max_tokens": "100"` or `true` is refused, as OpenAI does
    ({**SWARM, "max_tokens": "100"}, 422, "validation_error", "max_tokens"),
    ({**SWARM, "temperature": "0.3"}, 422, "validation_error", "temperature"),
    ({**SWARM, "agent_swarm": {"enabled": True, "max_sub_agents": True}}, 422,
     "validation_error", "agent_swarm.max_sub_agents"),
    ({**SWARM, "agent_swarm": {"enabled": True, "failure_tolerance": "0.5"}}, 422,
     "validation_error", "agent_swarm.failure_tolerance"),
    ({**SWARM, "agent_swarm": {"enabled": True, "per_sub_agent_max_tokens": "64"}}, 422,
     "validation_error", "agent_swarm.per_sub_agent_max_tokens"),
    ({**SWARM, "stream": True, "stream_options": {"include_usage": "true"}}, 422,
     "validation_error", "stream_options.include_usage"),
    ({**SWARM, "agent_swarm": {"enabled": True, "concurrency": 0}}, 422, "validation_error",
     "agent_swarm.concurrency"),
    ({**SWARM, "agent_swarm": {"enabled": True, "budget_usd": "-1"}}, 422, "validation_error",
     "agent_swarm.budget_usd"),
    ({**SWARM, "agent_swarm": {"enabled": True, "deadline_s": 0}}, 422, "validation_error",
     "agent_swarm.deadline_s"),
    ({**SWARM, "agent_swarm": {"enabled": True, "routing": "cheapest"}}, 422,
     "validation_error", "agent_swarm.routing"),
]


async def test_invalid_bodies(facade_sqlite: Facade) -> None:
    """400 when the body cannot be understood, 422 when a value is invalid; never stored."""
    tools = {**SWARM, "agent_swarm": {"enabled": True, "tools": ["search"]}}
    # no MCP server is configured: a 422 naming the field once swarms take tools (SPEC §9)
    tool_case = ((tools, 422, "unknown_tool", "agent_swarm.tools.0")
                 if "tools" in SwarmCreate.model_fields
                 else (tools, 400, "unsupported_parameter", "agent_swarm.tools"))
    for body, status, code, param in [*INVALID, tool_case]:
        r = await facade_sqlite.http.post("/v1/chat/completions", json=body)
        assert r.status_code == status, (body, r.text)
        err = error_of(r)
        assert (err["code"], err["param"]) == (code, param), body
        assert err["type"] == "invalid_request_error"
    assert (await facade_sqlite.http.get("/swarms")).json()["items"] == []
    assert (await facade_sqlite.usage())["total"]["gateway_calls"] == 0


async def test_compressed_body_is_a_415_in_openais_shape(facade_sqlite: Facade) -> None:
    raw = gzip.compress(json.dumps({**SWARM, "agent_swarm": {"enabled": True}}).encode())
    r = await facade_sqlite.http.post("/v1/chat/completions", content=raw, headers={
        "content-type": "application/json", "content-encoding": "gzip"})
    assert r.status_code == 415 and r.headers["accept-encoding"] == "identity"
    err = error_of(r)
    assert err["type"] == "invalid_request_error" and err["code"] == "unsupported_media_type"
    assert "gzip" in err["message"]
    assert (await facade_sqlite.http.get("/swarms")).json()["items"] == []


async def test_body_that_is_not_json_or_too_large(facade_sqlite: Facade) -> None:
    r = await facade_sqlite.http.post("/v1/chat/completions", content=b"{nope",
                                      headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and error_of(r)["code"] == "invalid_json"
    huge = {**SWARM, "messages": [{"role": "user", "content": "x" * (4 * 1024 * 1024)}]}
    r = await facade_sqlite.http.post("/v1/chat/completions", json=huge)
    assert r.status_code == 413 and error_of(r)["code"] == "payload_too_large"


async def test_failed_swarm_is_an_error_the_sdk_does_not_retry(facade_sqlite: Facade) -> None:
    body = {"model": "kimi-k2.5", "messages": [
        {"role": "user", "content": "Plan it [[sim plan=cyclic]]"}],
            "agent_swarm": {"enabled": True}}
    r = await facade_sqlite.http.post("/v1/chat/completions", json=body)
    assert r.status_code == 502 and r.headers["x-should-retry"] == "false"
    err = error_of(r)
    assert err["code"] == "plan_invalid" and err["type"] == "server_error"
    swarm = await facade_sqlite.swarm(err["swarm_id"])
    assert swarm["status"] == "failed" and swarm["error"]["code"] == "plan_invalid"
    with pytest.raises(openai.InternalServerError):  # default retries: still one swarm per call
        await facade_sqlite.sdk().chat.completions.create(  # type: ignore[call-overload]
            model=body["model"], messages=body["messages"],
            extra_body={"agent_swarm": body["agent_swarm"]})
    listed = (await facade_sqlite.http.get("/swarms")).json()["items"]
    assert len(listed) == 2


async def test_openapi_documents_the_facade(facade_sqlite: Facade) -> None:
    doc = (await facade_sqlite.http.get("/openapi.json")).json()
    create = doc["paths"]["/v1/chat/completions"]["post"]
    assert create["operationId"] == "createChatCompletion"
    assert {"400", "401", "409", "413", "422", "429", "502", "503"} <= set(create["responses"])
    for status, response in create["responses"].items():
        if int(status) >= 400:
            schema = response["content"]["application/json"]["schema"]
            assert schema == {"$ref": "#/components/schemas/OpenAIError"}, status
    ok = create["responses"]["200"]["content"]
    assert ok["application/json"]["schema"] == {"$ref": "#/components/schemas/ChatCompletion"}
    assert "chat.completion.chunk" in str(ok["text/event-stream"]["schema"])
    request = create["requestBody"]["content"]["application/json"]["schema"]
    assert request == {"$ref": "#/components/schemas/ChatCompletionCreate"}
    assert "agent_swarm" in doc["components"]["schemas"]["ChatCompletionCreate"]["properties"]
    models = doc["paths"]["/v1/models"]["get"]
    assert models["operationId"] == "listModels" and "401" in models["responses"]


async def test_idempotency_key_answers_from_the_same_swarm(facade_sqlite: Facade) -> None:
    sdk = facade_sqlite.sdk()
    kw: Any = {**SWARM, "extra_body": {"agent_swarm": {"enabled": True}},
               "extra_headers": {"Idempotency-Key": "review-1"}}
    first = await sdk.chat.completions.create(**kw)
    again = await sdk.chat.completions.create(**kw)
    assert first.id == again.id and first.choices[0].message.content == \
        again.choices[0].message.content
    assert len((await facade_sqlite.http.get("/swarms")).json()["items"]) == 1


async def test_a_swarm_failing_mid_stream_ends_it_with_an_error(facade_sqlite: Facade) -> None:
    stream = await facade_sqlite.sdk().chat.completions.create(  # type: ignore[call-overload]
        model="kimi-k2.5", messages=[{"role": "user", "content": "Go [[sim plan=cyclic]]"}],
        extra_body={"agent_swarm": {"enabled": True}}, stream=True)
    chunks = []
    with pytest.raises(openai.APIError) as caught:
        async for c in stream:
            chunks.append(c)
    assert chunks and chunks[0].choices[0].delta.role == "assistant"  # the stream had begun
    body: Any = caught.value.body
    assert body["code"] == "plan_invalid" and body["swarm_id"]
    assert (await facade_sqlite.swarm(body["swarm_id"]))["status"] == "failed"


def test_swarm_fields_are_named_as_the_request_names_them() -> None:
    assert request_field("orchestrator.max_subtasks") == "agent_swarm.max_sub_agents"
    assert request_field("tools.0") == "agent_swarm.tools.0"
    assert request_field("max_tokens") == "agent_swarm.per_sub_agent_max_tokens"
    assert request_field("synthesis.max_tokens") == "max_tokens"
    assert request_field("task") == "messages" and request_field("model") == "model"
    assert request_field("tools_x") == "tools_x"  # a prefix only at a dot


async def test_the_tenants_bucket_is_a_429_with_retry_after(database_url: str,
                                                           tmp_path: Path) -> None:
    tenants = tmp_path / "tenants.toml"
    tenants.write_text("[defaults]\nrequests_per_minute = 1\nburst = 1\n")
    async with start_facade(database_url, tenants_file=str(tenants)) as facade:
        sdk = facade.sdk(max_retries=0)
        plain = {"model": "deepseek-v3.2", "max_tokens": 20,
                 "messages": [{"role": "user", "content": "hi"}]}
        assert (await sdk.chat.completions.create(**plain)).choices  # type: ignore[call-overload]
        with pytest.raises(openai.RateLimitError) as caught:
            await sdk.chat.completions.create(**plain)  # type: ignore[call-overload]
        body: Any = caught.value.body
        assert body["code"] == "rate_limited" and body["type"] == "rate_limit_error"
        assert int(caught.value.response.headers["retry-after"]) >= 1
        assert (await facade.usage())["total"]["gateway_calls"] == 1  # refused: not sent


async def test_a_spent_tenant_day_is_a_429_before_the_call(database_url: str,
                                                          tmp_path: Path) -> None:
    """SPEC §8's daily cap at the facade's admission (on PostgreSQL `tenant_admit` alone, in
    autocommit): a tenant whose day is spent is refused before anything is sent; another
    tenant is not."""
    tenants = tmp_path / "tenants.toml"
    tenants.write_text('[defaults]\ndaily_budget_usd = "0.5"\n')
    db = make_db_engine(database_url)
    try:
        async with make_session_factory(db)() as s, s.begin():
            await s.execute(delete(TenantDailySpend))  # the table outlives the truncation
            s.add(TenantDailySpend(tenant="t1", day=datetime.now(UTC).date(),
                                   spent_usd=Decimal("0.5")))
    finally:
        await db.dispose()
    async with start_facade(database_url, tenants_file=str(tenants)) as facade:
        plain = {"model": "deepseek-v3.2", "max_tokens": 20,
                 "messages": [{"role": "user", "content": "hi"}]}
        with pytest.raises(openai.RateLimitError) as caught:
            await facade.sdk(max_retries=0).chat.completions.create(**plain)  # type: ignore[call-overload]
        body: Any = caught.value.body
        assert body["code"] == "quota_exceeded" and body["type"] == "rate_limit_error"
        # admission's refusal, not the call's daily-cap reservation (which would refuse too)
        assert body["message"] == "today's budget of 0.5 USD is spent"
        assert 1 <= int(caught.value.response.headers["retry-after"]) <= 86_400
        assert (await facade.usage())["total"]["gateway_calls"] == 0  # refused: not sent
        other = await facade.http.post("/v1/chat/completions", json=plain,
                                       headers={"Authorization": "Bearer k2"})
        assert other.status_code == 200, other.text


async def test_an_agent_swarm_takes_one_token_of_the_bucket(sqlite_url: str,
                                                             tmp_path: Path) -> None:
    """The facade admits an `agent_swarm` request once: the swarm it creates through
    `POST /swarms`' code does not take a second token (burst 1 lets exactly one in)."""
    tenants = tmp_path / "tenants.toml"
    tenants.write_text("[defaults]\nrequests_per_minute = 1\nburst = 1\n")
    async with start_facade(sqlite_url, tenants_file=str(tenants)) as facade:
        sdk = facade.sdk(max_retries=0)
        kw: Any = {**SWARM, "extra_body": {"agent_swarm": {"enabled": True}}}
        assert (await sdk.chat.completions.create(**kw)).choices
        with pytest.raises(openai.RateLimitError):
            await sdk.chat.completions.create(**kw)
