"""The regexes of an `output_schema` matched in linear time (SPEC §15). jsonschema searches
`pattern` and `patternProperties` (and, through them, `additionalProperties` and
`unevaluatedProperties`) with Python's backtracking `re`, where a caller's `^(a+)+$` against a
40-character answer holds the engine's loop for minutes; here those keywords search with RE2,
whose time is linear in the answer. A pattern RE2 cannot compile (a backreference, a
lookaround) is refused when the schema is checked, so it never reaches an answer."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Mapping
from typing import Any

import re2
from jsonschema import Draft202012Validator, FormatChecker, validators
from jsonschema.exceptions import ValidationError
from jsonschema.protocols import Validator

PATTERN_SHOWN = 100  # characters of a refused pattern told back
# a pattern's program and DFA cache stay within this: the cached patterns bound the memory
# (512 x 2 MiB) whatever callers write
PATTERN_MEMORY = 2 << 20

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # a refused pattern is the caller's answer, not a line on stderr
_OPTIONS.max_mem = PATTERN_MEMORY
_SURROGATE = re.compile("[\ud800-\udfff]")


class PatternRefused(ValueError):
    """A pattern without a linear-time match, or no regular expression at all."""


@functools.lru_cache(maxsize=512)
def compiled(pattern: str) -> Any:
    """`pattern` compiled by RE2 (ECMA-262's `search` semantics: found anywhere unless
    anchored); raises PatternRefused saying why it cannot be."""
    try:
        return re2.compile(pattern, _OPTIONS)
    except re2.error as exc:
        said = exc.args[0] if exc.args else ""
        detail = said.decode("utf-8", "replace") if isinstance(said, bytes) else str(said)
    shown = pattern[:PATTERN_SHOWN]
    if "too large" in detail:
        raise PatternRefused(f"pattern {shown!r} is too large: its compiled form passes "
                             f"{PATTERN_MEMORY >> 20} MiB ({detail})")
    try:
        re.compile(pattern)
    except (re.error, OverflowError, RecursionError):
        raise PatternRefused(f"pattern {shown!r} is not a regular expression: "
                             f"{detail}") from None
    raise PatternRefused(f"pattern {shown!r} uses a construct without a linear-time match "
                         f"(backreference or lookaround): {detail}")


def _found(pattern: str, text: str) -> bool:
    try:
        return compiled(pattern).search(text) is not None
    except UnicodeEncodeError:  # a lone surrogate (JSON's "\ud800"): RE2 reads UTF-8 only
        return compiled(pattern).search(_SURROGATE.sub("\ufffd", text)) is not None


def _is_regex(instance: object) -> bool:
    if isinstance(instance, str):
        compiled(instance)
    return True


# the metaschema's `format: regex` (on `pattern` and `patternProperties`' names) read by RE2
META_FORMATS = FormatChecker(())
META_FORMATS.checkers = {**Draft202012Validator.FORMAT_CHECKER.checkers,
                         "regex": (_is_regex, PatternRefused)}

Errors = Iterator[ValidationError]


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Errors:
    if validator.is_type(instance, "string") and not _found(pattern, instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(validator: Any, patterns: Mapping[str, Any], instance: Any,
                        schema: Any) -> Errors:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if _found(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _extras(extras: list[Any]) -> str:
    return f"{', '.join(repr(e) for e in extras)} {'was' if len(extras) == 1 else 'were'}"


def _additional(instance: Mapping[str, Any], schema: Mapping[str, Any]) -> Iterator[str]:
    """The names neither `properties` nor a `patternProperties` regex covers."""
    properties = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    for name in instance:
        if name not in properties and not any(_found(p, name) for p in patterns):
            yield name


def _additional_properties(validator: Any, additional: Any, instance: Any,
                           schema: Any) -> Errors:
    if not validator.is_type(instance, "object"):
        return
    extras = set(_additional(instance, schema))
    if validator.is_type(additional, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif not additional and extras:
        if "patternProperties" in schema:
            verb = "does" if len(extras) == 1 else "do"
            joined = ", ".join(repr(each) for each in sorted(extras))
            patterns = ", ".join(repr(each) for each in sorted(schema["patternProperties"]))
            yield ValidationError(f"{joined} {verb} not match any of the regexes: {patterns}")
        else:
            yield ValidationError("Additional properties are not allowed "
                                  f"({_extras(sorted(extras, key=str))} unexpected)")


def _valid(errors: Errors) -> bool:
    return next(errors, None) is None


def _by_reference(validator: Any, instance: Any, ref: str) -> list[str]:
    resolved = validator._resolver.lookup(ref)
    inner = validator.evolve(schema=resolved.contents, _resolver=resolved.resolver)
    return _evaluated_keys(inner, instance, resolved.contents)


def _evaluated_keys(validator: Any, instance: Any, schema: Any) -> list[str]:
    """The names of `instance` that `schema` evaluates, as jsonschema finds them for
    `unevaluatedProperties`, with `patternProperties` searched by RE2."""
    if validator.is_type(schema, "boolean"):
        return []
    keys: list[str] = []
    for keyword in ("$ref", "$dynamicRef"):
        if (ref := schema.get(keyword)) is not None:
            keys += _by_reference(validator, instance, ref)
    properties = schema.get("properties")
    if validator.is_type(properties, "object"):
        keys += properties.keys() & instance.keys()
    for keyword in ("additionalProperties", "unevaluatedProperties"):
        if (subschema := schema.get(keyword)) is not None:
            keys += (key for key, value in instance.items()
                     if _valid(validator.descend(value, subschema)))
    for pattern in schema.get("patternProperties", {}):
        keys += (name for name in instance if _found(pattern, name))
    return keys + _keys_of_applied(validator, instance, schema)


def _keys_of_applied(validator: Any, instance: Any, schema: Any) -> list[str]:
    """The names evaluated by the subschemas that apply: dependentSchemas, allOf, oneOf and
    anyOf's valid ones, if with then or else."""
    keys: list[str] = []
    for name, subschema in schema.get("dependentSchemas", {}).items():
        if name in instance:
            keys += _evaluated_keys(validator, instance, subschema)
    for keyword in ("allOf", "oneOf", "anyOf"):
        for subschema in schema.get(keyword, []):
            if _valid(validator.descend(instance, subschema)):
                keys += _evaluated_keys(validator, instance, subschema)
    if "if" not in schema:
        return keys
    if validator.evolve(schema=schema["if"]).is_valid(instance):
        keys += _evaluated_keys(validator, instance, schema["if"])
        if "then" in schema:
            keys += _evaluated_keys(validator, instance, schema["then"])
    elif "else" in schema:
        keys += _evaluated_keys(validator, instance, schema["else"])
    return keys


def _unevaluated_properties(validator: Any, unevaluated: Any, instance: Any,
                            schema: Any) -> Errors:
    if not validator.is_type(instance, "object"):
        return
    evaluated = _evaluated_keys(validator, instance, schema)
    refused: list[str] = []  # a name per error, as jsonschema tells them
    for name in instance:
        if name not in evaluated:
            refused += (name for _ in validator.descend(instance[name], unevaluated,
                                                        path=name, schema_path=name))
    if refused and unevaluated is False:
        yield ValidationError("Unevaluated properties are not allowed "
                              f"({_extras(sorted(refused, key=str))} unexpected)")
    elif refused:
        yield ValidationError("Unevaluated properties are not valid under the given schema "
                              f"({_extras(refused)} unevaluated and invalid)")


# draft 2020-12 with every keyword that searches a schema's regex running on RE2 (the
# stubs leave `extend` untyped; it returns a validator class as `create` does)
LinearValidator: type[Validator] = validators.extend(  # type: ignore[no-untyped-call]
    Draft202012Validator, {"pattern": _pattern,
                           "patternProperties": _pattern_properties,
                           "additionalProperties": _additional_properties,
                           "unevaluatedProperties": _unevaluated_properties})
