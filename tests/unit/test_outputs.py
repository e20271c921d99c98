"""The pure part of structured outputs: schema checks, reading an answer (whole, fenced, in
prose), the messages of the json_object fallback and of the repair turn; and the simulator's
minimal instances, which must be valid for the schemas they are made from."""

from __future__ import annotations

import json
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from app.engine.outputs import (
    SchemaInvalid,
    check_schema,
    judge,
    repair_messages,
    response_format,
    validation_errors,
    with_schema,
)
from app.simulator.structured import answer, asked_schema, instance

OBJ: dict[str, Any] = {"type": "object", "properties": {"n": {"type": "integer"}},
                       "required": ["n"]}


def test_a_whole_answer_is_valid() -> None:
    got = judge(OBJ, ' {"n": 1}\n')
    assert (got.value, got.how, got.errors) == ({"n": 1}, "whole", [])


@pytest.mark.parametrize("text", [
    'Sure:\n```json\n{"n": 2}\n```\nDone.',
    'Here it is ```\n{"n": 2}``` bye',
    'The result is {"n": 2}, as asked.',
    'A note [not json] then {"n": 2}',
])
def test_the_one_value_in_a_fence_or_in_prose_is_taken(text: str) -> None:
    got = judge(OBJ, text)
    assert (got.value, got.how) == ({"n": 2}, "extracted")


@pytest.mark.parametrize("text", [
    'two values: {"n": 1} and {"n": 2}',
    '```json\n{"n": 1}\n```\n```json\n{"n": 2}\n```',
    "no json at all",
    '{"n": "one"}',
    "[" * 5000 + '{"n": 1}',  # unclosed brackets: the scan gives up, no quadratic parse
])
def test_no_single_valid_value_is_no_value(text: str) -> None:
    got = judge(OBJ, text)
    assert got.how is None and got.value is None and got.errors


def test_errors_name_where_the_value_is_wrong() -> None:
    assert validation_errors(OBJ, {"n": "x"}) == ["n: 'x' is not of type 'integer'"]
    assert judge(OBJ, "prose").errors == ["the answer is not JSON"]


@pytest.mark.parametrize(("schema", "why"), [
    ([], "JSON Schema object"),
    ({"type": 3}, "not a valid JSON Schema"),
    ({"$ref": "other.json#/x"}, "outside the schema"),
    ({"$defs": {"a": {"$dynamicRef": "http://x/y"}}}, "outside the schema"),
    ({"description": "\x00"}, "NUL"),
    ({"type": "string", "pattern": r"^(a)\1$"}, "without a linear-time match"),
    ({"properties": {"a": {"pattern": "(?!x)y"}}}, r"lookaround\): .* \(at properties/a/pattern\)"),
    ({"patternProperties": {"(?<=a)b": {}}}, r"without a linear-time .* \(at patternProperties\)"),
    ({"pattern": "(unclosed"}, "not a regular expression"),
    ({"description": "é" * 40_000}, "bytes"),
])
def test_unusable_schemas_are_refused(schema: Any, why: str) -> None:
    with pytest.raises(SchemaInvalid, match=why):
        check_schema(schema)


@pytest.mark.parametrize("pattern", [r"^[a-z]+$", r"^\d{3}-\d{4}$", r"^(ab)?c+$",
                                     r"^[(+)]*$", r"^\(\d+\)+$", r"^(?:foo|bar)$",
                                     r"^(a+)+$", r"(x|xy)*z", r"^\p{L}+$"])
def test_patterns_re2_matches_in_linear_time_are_taken(pattern: str) -> None:
    check_schema({"type": "string", "pattern": pattern})


def test_local_references_are_kept_and_followed() -> None:
    schema = {"$defs": {"n": {"type": "integer"}}, "type": "object",
              "properties": {"n": {"$ref": "#/$defs/n"}}, "required": ["n"]}
    check_schema(schema)
    assert judge(schema, '{"n": 1}').how == "whole"
    assert validation_errors({"$ref": "#/$defs/missing"}, 1)[0].startswith("the schema cannot")


def test_the_response_format_is_strict_and_named_after_the_subtask() -> None:
    fmt = response_format(OBJ, "@synthesizer")
    assert fmt == {"type": "json_schema", "json_schema": {"name": "synthesizer",
                                                          "schema": OBJ, "strict": True}}


def test_the_fallback_puts_the_schema_in_the_system_message() -> None:
    asked = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Go"}]
    out = with_schema(asked, OBJ)
    assert out[0]["content"].startswith("Be brief.\n\n") and json.dumps(OBJ) in out[0]["content"]
    assert asked[0]["content"] == "Be brief."  # the caller's messages are left alone
    assert with_schema(asked[1:], OBJ)[0]["role"] == "system"
    # and the simulator reads it back from there
    assert asked_schema({"type": "json_object"}, out) == OBJ


def test_the_repair_turn_replays_the_answer_and_the_errors() -> None:
    out = repair_messages([{"role": "user", "content": "Go"}], "nope", ["(root): bad"])
    assert out[1] == {"role": "assistant", "content": "nope"}
    assert out[2]["role"] == "user" and "- (root): bad" in out[2]["content"]


@pytest.mark.parametrize("schema", [
    OBJ,
    {"type": "array", "items": {"type": "string", "minLength": 3}, "minItems": 2},
    {"type": "number", "exclusiveMinimum": 5},
    {"type": "string", "maxLength": 1},
    {"type": ["null", "boolean"]},
    {"anyOf": [{"const": "a"}, {"type": "integer"}]},
    {"type": "object", "properties": {"x": {"$ref": "#/$defs/x"}}, "required": ["x"],
     "$defs": {"x": {"enum": [3, 4]}}, "additionalProperties": False},
])
def test_the_simulators_instances_are_valid(schema: dict[str, Any]) -> None:
    value = instance(schema, schema)
    assert not list(Draft202012Validator(schema).iter_errors(value)), value
    assert json.loads(answer(schema, None, [])) == value
    assert list(Draft202012Validator(schema).iter_errors(
        json.loads(answer(schema, "invalid", [])))) if "type" in schema else True


def test_a_schema_nested_past_any_recursion_limit_is_refused_not_crashed() -> None:
    deep: dict[str, Any] = {}
    for _ in range(5000):
        deep = {"items": deep}
    with pytest.raises(SchemaInvalid, match="nested deeper"):
        check_schema(deep)
