"""Whether a structured answer follows its JSON schema, for the trace's "answers valid".

The check covers the keywords the trace's schemas use (types, enums, object properties,
required and additional properties, array items and sizes, string lengths, number bounds)
and refuses a schema with any other validation keyword rather than call an answer valid
without checking it. The `jsonschema` package is a test dependency only: `reame bench` runs
from an installed Reame, and must count valid answers the same way in the repository's
benchmarks and on a user's host.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_TYPES: Mapping[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "number": (int, float),
    "integer": (int,),
    "boolean": (bool,),
    "null": (type(None),),
}
# Keywords that say what a value must be, checked below; annotations are ignored.
_CHECKED = {
    "type", "enum", "const", "properties", "required", "additionalProperties", "items",
    "minItems", "maxItems", "minLength", "maxLength", "minimum", "maximum",
}  # fmt: skip
_UNCHECKED = {
    "anyOf", "oneOf", "allOf", "not", "$ref", "pattern", "patternProperties", "format",
    "prefixItems", "uniqueItems", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
    "if", "then", "else", "dependentRequired", "dependentSchemas", "minProperties",
    "maxProperties", "contains", "propertyNames", "unevaluatedProperties",
}  # fmt: skip


class UncheckedSchema(ValueError):
    """The schema uses a validation keyword this module does not check."""


def is_valid(value: Any, schema: Mapping[str, Any]) -> bool:
    """Whether `value` (parsed JSON) follows `schema`."""
    unchecked = _UNCHECKED.intersection(schema)
    if unchecked:
        raise UncheckedSchema(f"schema keywords not checked: {', '.join(sorted(unchecked))}")
    return all(_check(keyword, schema, value) for keyword in _CHECKED.intersection(schema))


def _is_type(value: Any, name: str) -> bool:
    if isinstance(value, bool) and name in ("number", "integer"):
        return False  # JSON's true is no number, though Python's bool is an int
    if name == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, _TYPES[name])


def _check(keyword: str, schema: Mapping[str, Any], value: Any) -> bool:
    rule = schema[keyword]
    if keyword == "type":
        names = [rule] if isinstance(rule, str) else list(rule)
        return any(_is_type(value, name) for name in names)
    if keyword == "enum":
        return any(value == option and type(value) is type(option) for option in rule)
    if keyword == "const":
        return bool(value == rule and type(value) is type(rule))
    if isinstance(value, dict):
        return _check_object(keyword, schema, value)
    if isinstance(value, list):
        if keyword == "items":
            return all(is_valid(item, rule) for item in value)
        if keyword == "minItems":
            return bool(len(value) >= rule)
        if keyword == "maxItems":
            return bool(len(value) <= rule)
    if isinstance(value, str):
        if keyword == "minLength":
            return bool(len(value) >= rule)
        if keyword == "maxLength":
            return bool(len(value) <= rule)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if keyword == "minimum":
            return bool(value >= rule)
        if keyword == "maximum":
            return bool(value <= rule)
    return True  # the keyword does not apply to this type of value


def _check_object(keyword: str, schema: Mapping[str, Any], value: dict[str, Any]) -> bool:
    properties: Mapping[str, Any] = schema.get("properties", {})
    if keyword == "properties":
        return all(is_valid(value[name], sub) for name, sub in properties.items() if name in value)
    if keyword == "required":
        return all(name in value for name in schema["required"])
    if keyword == "additionalProperties":
        extra = [name for name in value if name not in properties]
        rule = schema["additionalProperties"]
        if rule is False:
            return not extra
        if isinstance(rule, Mapping):
            return all(is_valid(value[name], rule) for name in extra)
    return True
