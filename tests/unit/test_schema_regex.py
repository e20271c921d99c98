"""The regexes of an output_schema run on RE2: a pattern that makes a backtracking matcher take
exponential time is answered at once, and every keyword that searches a regex keeps the stock
validator's meaning (errors, messages, paths) on patterns both engines read alike."""

from __future__ import annotations

from typing import Any

import pytest
from jsonschema import Draft202012Validator

from app.engine.outputs import validation_errors
from app.engine.schema_regex import LinearValidator, PatternRefused, compiled

# each exponential for a backtracking matcher on its answer (2^40 ways to split the a's)
EVIL = "a" * 40 + "b"
EVIL_SCHEMAS: list[tuple[dict[str, Any], bool]] = [  # (schema, whether EVIL is refused)
    ({"type": "string", "pattern": "^(a+)+$"}, True),
    ({"type": "string", "pattern": "^(a?){40}a{40}$"}, True),
    ({"type": "string", "pattern": "^(a|aa)*$"}, True),
    ({"type": "object", "patternProperties": {"^(a+)+$": {"type": "integer"}}}, False),
    ({"type": "object", "patternProperties": {"^(a+)+$": True},
      "additionalProperties": False}, True),
    ({"type": "object", "allOf": [{"patternProperties": {"^(a+)+$": True}}],
      "unevaluatedProperties": False}, True),
]


@pytest.mark.timeout(5)
@pytest.mark.parametrize(("schema", "refused"), EVIL_SCHEMAS)
def test_a_pattern_that_explodes_when_backtracked_is_answered_at_once(
        schema: dict[str, Any], refused: bool) -> None:
    value: Any = EVIL if schema["type"] == "string" else {EVIL: "not an integer"}
    assert bool(validation_errors(schema, value)) is refused


# (schema, instance): keywords searching regexes, on patterns RE2 and Python's re read alike
CASES: list[tuple[dict[str, Any], Any]] = [
    ({"pattern": "b+"}, "abbc"),  # search, not match: found anywhere
    ({"pattern": "^a"}, "ba"),
    ({"pattern": "^é+$"}, "ééé"),
    ({"pattern": "x"}, 3),  # a pattern says nothing of a non-string
    ({"pattern": "^.a$"}, "\ud800a"),  # a lone surrogate (JSON's "\ud800") is a character
    ({"pattern": "^a"}, "\udc00"),
    ({"patternProperties": {"^.$": {"type": "integer"}}}, {"\ud800": "x"}),
    ({"patternProperties": {"^x-": {"type": "integer"}}}, {"x-a": 1, "x-b": "s", "y": 2}),
    ({"patternProperties": {"a": {"minimum": 2}, "b$": {"maximum": 0}}}, {"ab": 1, "zb": 0}),
    ({"properties": {"id": {}}, "patternProperties": {"^x-": {}},
      "additionalProperties": False}, {"id": 1, "x-a": 1, "zz": 2, "yy": 3}),
    ({"patternProperties": {"^x-": {}}, "additionalProperties": False}, {"q": 1}),
    ({"properties": {"a": {}}, "additionalProperties": False}, {"a": 1, "b": 2, "c": 3}),
    ({"patternProperties": {"^n": {"type": "integer"}}, "additionalProperties":
      {"type": "string"}}, {"n1": 1, "s": "x", "t": 2}),
    ({"allOf": [{"patternProperties": {"^a": {}}}], "unevaluatedProperties": False},
     {"ab": 1, "ba": 2, "ca": 3}),
    ({"patternProperties": {"^a": {}}, "unevaluatedProperties": {"type": "integer"}},
     {"ab": "x", "c": "y", "d": 3, "e": "z"}),
    ({"$defs": {"p": {"patternProperties": {"^p": True}}}, "$ref": "#/$defs/p",
      "unevaluatedProperties": False}, {"pa": 1, "q": 2}),
    ({"if": {"patternProperties": {"^i": {"type": "integer"}}},
      "then": {"patternProperties": {"^t": True}}, "else": {"properties": {"e": True}},
      "unevaluatedProperties": False}, {"i": 1, "t": 1, "e": 1}),
    ({"if": {"patternProperties": {"^i": {"type": "integer"}}},
      "then": {"patternProperties": {"^t": True}}, "else": {"properties": {"e": True}},
      "unevaluatedProperties": False}, {"i": "s", "t": 1, "e": 1}),
    ({"properties": {"k": True}, "dependentSchemas": {"k": {"patternProperties": {"^d": True}}},
      "unevaluatedProperties": False}, {"k": 1, "d1": 2, "z": 3}),
    ({"anyOf": [{"patternProperties": {"^a": True}, "required": ["a"]},
                {"patternProperties": {"^b": True}}], "unevaluatedProperties": False},
     {"b1": 1, "c": 2}),
    ({"properties": {"o": {"patternProperties": {r"\d$": {"maximum": 3}},
                           "additionalProperties": False}}}, {"o": {"a1": 2, "b2": 9, "c": 1}}),
    ({"additionalProperties": {"unevaluatedProperties": False,
                               "patternProperties": {"^[a-z]+$": True}}},
     {"x": {"ok": 1, "Bad": 2}}),
]


def _told(validator: Any, instance: Any) -> list[tuple[list[Any], str, list[Any]]]:
    return sorted(((list(e.path), e.message, list(e.schema_path))
                   for e in validator.iter_errors(instance)), key=repr)


@pytest.mark.parametrize(("schema", "instance"), CASES)
def test_regex_keywords_mean_what_the_stock_validator_says(schema: dict[str, Any],
                                                           instance: Any) -> None:
    stock = _told(Draft202012Validator(schema), instance)
    assert _told(LinearValidator(schema), instance) == stock


def test_the_table_holds_valid_and_invalid_answers() -> None:
    said = [bool(_told(Draft202012Validator(s), i)) for s, i in CASES]
    assert any(said) and not all(said)


def test_a_pattern_refused_since_is_no_crash_but_no_valid_value() -> None:
    """A schema stored before its pattern was refused still answers: nothing is valid."""
    errors = validation_errors({"type": "string", "pattern": "(?=a)a"}, "a")
    assert len(errors) == 1 and errors[0].startswith("the schema cannot be applied: pattern")


def test_a_pattern_too_large_to_compile_is_refused_as_such() -> None:
    with pytest.raises(PatternRefused, match=r"too large: its compiled form passes 2 MiB"):
        compiled(r"^\p{L}{1,1000}$")


def test_a_refused_pattern_is_told_to_the_caller_not_logged(
        capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(PatternRefused, match=r"backreference or lookaround\): invalid escape"):
        compiled(r"(a)\1b")
    assert capfd.readouterr().err == ""
