"""Hypothesis strategies from JSON Schema, for the subset our OpenAPI document uses (object,
string, integer, const, enum, properties, required, additionalProperties, allOf with if/then).
Every drawn value is checked against the schema itself with jsonschema, so the generator can
only be too narrow, never wrong."""

from __future__ import annotations

import re
from typing import Any

import jsonschema
from hypothesis import strategies as st


def _long(shape: int) -> str:
    """A few long values at the limit: random text of 20,000 characters is slow to draw."""
    return ["x" * 20000, "é" * 19999 + "!", " " * 19999 + "y"][shape]


_LONG = st.integers(0, 2).map(_long)


def from_schema(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    validator = jsonschema.Draft202012Validator(schema)
    return _draw(schema).filter(validator.is_valid)


def _draw(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if kind == "object":
        properties = schema.get("properties", {})
        required = set(schema.get("required", ()))
        return st.fixed_dictionaries(
            {k: _draw(v) for k, v in properties.items() if k in required},
            optional={k: _draw(v) for k, v in properties.items() if k not in required},
        )
    if kind == "string":
        low, high = schema.get("minLength", 0), schema.get("maxLength", 10_000)
        text = st.text(min_size=low, max_size=min(high, 60))
        if high >= 20000:
            text = st.one_of(text, _LONG)
        pattern = schema.get("pattern")
        if pattern:
            text = text.filter(lambda s: re.search(pattern, s) is not None)
        return text
    if kind == "integer":
        return st.integers(schema.get("minimum"), schema.get("maximum"))
    if kind == "null":
        return st.none()
    raise NotImplementedError(f"schema shape not covered: {sorted(schema)}")
