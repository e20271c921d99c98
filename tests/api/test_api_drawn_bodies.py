"""Bodies drawn by hypothesis against `POST /swarms`: no body, however malformed, makes a 5xx,
and every valid body is accepted with its agents in order."""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.conftest import Harness
from tests.helpers import error_of, fields_named, stored_swarms

# ---- property: no body makes a 5xx -------------------------------------------------------------

_scalars = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-(10**40), max_value=10**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.text(alphabet=st.characters(categories=["Cs", "Cc", "So", "Lo"]), max_size=8),
    st.sampled_from(["NaN", "Infinity", "-0", "1e309", "", " ", "kimi-k2.5", "a", "\x00"]),
    # what breaks renderers and databases rather than validators
    st.sampled_from([math.nan, math.inf, -math.inf, 1e308, -0.0, 2**63, -(2**63) - 1,
                     "\ud800", "a\x00b", "\u202e", "\U0001f600"]),
)
_json = st.recursive(
    _scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12,
)
_deep = st.integers(min_value=1, max_value=60).map(
    lambda n: json.loads("[" * n + "]" * n))
_garbage = st.one_of(_json, _deep)
_names = st.sampled_from(["a", "b", "c", "a b", "", "x" * 65, "é", "A-z_0.9"])
_models = st.sampled_from(["kimi-k2.5", "deepseek-v3.2", "gpt-4.1", "nope", ""])


def _maybe(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly the plausible value, sometimes anything at all."""
    return st.one_of(*[valid] * 6, _garbage)


def _with_extra(d: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    extra = st.dictionaries(st.text(min_size=1, max_size=8), _garbage, max_size=2)
    return st.one_of(d, st.tuples(d, extra).map(lambda t: {**t[1], **t[0]}))


_agent_st = _with_extra(st.fixed_dictionaries({"name": _maybe(_names)}, optional={
    "system_prompt": _maybe(st.text(max_size=20)),
    "prompt": _maybe(st.text(max_size=20)),
    "model": _maybe(_models),
    "max_tokens": _maybe(st.integers(min_value=-5, max_value=200_000)),
    "temperature": _maybe(st.floats(min_value=-1, max_value=3)),
    "depends_on": _maybe(st.lists(_names, max_size=3)),
    "weight": _maybe(st.floats(min_value=-1, max_value=10)),
}))
_limits_st = _with_extra(st.fixed_dictionaries({}, optional={
    "concurrency": _maybe(st.integers(min_value=-1, max_value=2000)),
    "budget_usd": _maybe(st.one_of(st.floats(min_value=-1, max_value=100),
                                   st.decimals(allow_nan=True).map(str))),
    "failure_tolerance": _maybe(st.floats(min_value=-0.5, max_value=1.5)),
    "max_attempts": _maybe(st.integers(min_value=-1, max_value=20)),
    "subtask_timeout_s": _maybe(st.floats(min_value=-1, max_value=5000)),
    "deadline_s": _maybe(st.floats(min_value=-1, max_value=100_000)),
}))
_synthesis_st = _with_extra(st.fixed_dictionaries({}, optional={
    "strategy": _maybe(st.sampled_from(["synthesize", "concatenate", "vote", "none", "x"])),
    "model": _maybe(_models),
    "max_tokens": _maybe(st.integers(min_value=-5, max_value=200_000)),
    "compress": _maybe(st.sampled_from(["auto", "always", "never", "x"])),
}))
_orchestrator_st = _with_extra(st.fixed_dictionaries({}, optional={
    "model": _maybe(_models),
    "max_subtasks": _maybe(st.integers(min_value=-1, max_value=2000)),
    "max_depth": _maybe(st.integers(min_value=-1, max_value=30)),
}))


@st.composite
def _valid_body(draw: st.DrawFn) -> dict[str, Any]:
    """A body that must be accepted: unique names, dependencies on earlier agents only."""
    names = draw(st.lists(st.from_regex(r"[A-Za-z0-9_.\-]{1,64}", fullmatch=True),
                          min_size=1, max_size=4, unique=True))
    agents = [{"name": n, "depends_on": draw(st.lists(st.sampled_from(names[:i]), unique=True))
               if i else [], "model": draw(st.sampled_from(["kimi-k2.5", "deepseek-v3.2"]))}
              for i, n in enumerate(names)]
    # valid text is what UTF-8 can carry (lone surrogates are refused on purpose) minus NUL
    valid_text = st.characters(codec="utf-8", exclude_characters="\x00")
    return {"task": draw(st.text(valid_text, min_size=1, max_size=30).filter(str.strip)),
            "agents": agents,
            "max_tokens": draw(st.integers(min_value=1, max_value=128_000)),
            "limits": {"budget_usd": draw(st.decimals(min_value="0.01", max_value="100",
                                                      places=2).map(float)),
                       "failure_tolerance": draw(st.floats(min_value=0, max_value=1))},
            # NUL is rejected on purpose (Postgres cannot store it): valid keys exclude it
            "metadata": draw(st.dictionaries(st.text(valid_text, max_size=8), st.integers(),
                                             max_size=2))}


_body_st = st.one_of(
    _valid_body(),
    _with_extra(st.fixed_dictionaries(
        {"task": _maybe(st.text(max_size=30)),
         "agents": _maybe(st.lists(_agent_st, min_size=1, max_size=4))},
        optional={
            "limits": _maybe(_limits_st),
            "synthesis": _maybe(_synthesis_st),
            "orchestrator": _maybe(_orchestrator_st),
            "model": _maybe(_models),
            "max_tokens": _maybe(st.integers(min_value=-5, max_value=200_000)),
            "temperature": _maybe(st.floats(min_value=-1, max_value=3)),
            "metadata": _maybe(st.dictionaries(st.text(max_size=8), _json, max_size=3)),
        })),
    _garbage,
)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(body=_body_st)
async def test_no_body_makes_a_5xx(api: Harness, body: Any) -> None:
    raw = json.dumps(body, allow_nan=True)  # NaN/Infinity literals too: Python parsers take them
    before = await stored_swarms(api)
    r = await api.client.post("/swarms", content=raw,
                              headers={"content-type": "application/json"})
    assert r.status_code < 500, r.text
    event(f"status {r.status_code}")
    if r.status_code == 202:
        data = r.json()
        assert r.headers["location"] == f"/swarms/{data['id']}"
        assert data["task"] == body["task"]
        assert await stored_swarms(api) == before + 1
    else:
        assert 400 <= r.status_code < 500
        err = error_of(r, r.status_code)
        if r.status_code == 422 and err["code"] != "planning_not_available":
            assert fields_named(err)
        assert await stored_swarms(api) == before


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(body=_valid_body())
async def test_valid_bodies_are_accepted(api: Harness, body: dict[str, Any]) -> None:
    r = await api.client.post("/swarms", json=body)
    assert r.status_code == 202, r.text
    assert [s["name"] for s in r.json()["subtasks"]][:len(body["agents"])] == [
        a["name"] for a in body["agents"]]
