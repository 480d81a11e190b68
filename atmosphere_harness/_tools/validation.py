"""Argument validation against a tool's JSON schema, before the tool runs.

Models get arguments subtly wrong all the time: a number as a string, an array double-encoded as a
JSON string, a required field sent as `null`. This check coerces the harmless cases and turns the
rest into Atmosphere's `invalid_arguments` result, so the model can fix its call instead of the
tool seeing garbage. Only the top level of the schema is checked here; tools validate nested
structure themselves with messages that fit them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
}


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _coerce(value: Any, expected: str) -> tuple[bool, Any]:
    """(ok, value) after trying the harmless coercions for `expected`."""
    if expected not in _JSON_TYPES:
        return True, value
    if isinstance(value, bool) and expected in ("integer", "number"):
        return False, value
    if isinstance(value, _JSON_TYPES[expected]):
        return True, value
    if isinstance(value, str):
        text = value.strip()
        if expected in ("array", "object") and text[:1] in ("[", "{"):
            try:
                decoded = json.loads(text)
            except ValueError:
                return False, value
            return isinstance(decoded, _JSON_TYPES[expected]), decoded
        if expected == "integer":
            try:
                return True, int(text)
            except ValueError:
                return False, value
        if expected == "number":
            try:
                return True, float(text)
            except ValueError:
                return False, value
        if expected == "boolean" and text.lower() in ("true", "false"):
            return True, text.lower() == "true"
    if expected == "integer" and isinstance(value, float) and value.is_integer():
        return True, int(value)
    if expected == "string" and isinstance(value, int | float):
        return True, str(value)
    return False, value


def _expected_types(prop: Mapping[str, Any]) -> list[str]:
    declared = prop.get("type")
    if isinstance(declared, str):
        return [declared]
    if isinstance(declared, list):
        return [item for item in declared if isinstance(item, str)]
    options = prop.get("anyOf") or prop.get("oneOf")
    if isinstance(options, list):
        found: list[str] = []
        for option in options:
            if isinstance(option, Mapping):
                found.extend(_expected_types(option))
        return found
    return []


def validate_arguments(
    schema: Mapping[str, Any], arguments: object
) -> tuple[dict[str, Any], list[str]]:
    """Return `(arguments, problems)`: coerced arguments and the reasons they are invalid."""
    if not isinstance(arguments, Mapping):
        return {}, [f"arguments must be a JSON object, got {_type_name(arguments)}"]
    properties: Mapping[str, Any] = schema.get("properties") or {}
    required = schema.get("required") or []
    result = dict(arguments)
    problems: list[str] = []
    for name in required:
        if result.get(name) is None:
            problems.append(f"missing required parameter '{name}'")
    if schema.get("additionalProperties") is False:
        for name in result:
            if name not in properties:
                problems.append(f"unexpected parameter '{name}'")
    for name, prop in properties.items():
        if name not in result or result[name] is None or not isinstance(prop, Mapping):
            continue
        expected = _expected_types(prop)
        if expected:
            value = result[name]
            for option in expected:
                ok, coerced = _coerce(value, option)
                if ok:
                    result[name] = coerced
                    break
            else:
                wanted = " or ".join(expected)
                problems.append(f"parameter '{name}' must be {wanted}, got {_type_name(value)}")
                continue
        allowed = prop.get("enum")
        if isinstance(allowed, list) and result[name] not in allowed:
            problems.append(f"parameter '{name}' must be one of {json.dumps(allowed)}")
    return result, problems
