"""`schema_instance.instance` builds values that validate, and keeps hints that fit."""

from __future__ import annotations

import enum
import json
import time
from datetime import date, datetime
from typing import Any, Literal
from uuid import UUID

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.lib._pydantic import to_strict_json_schema
from pydantic import BaseModel, Field

from trio_responses.engine.schema_instance import (
    SchemaInstanceError,
    SchemaTooLargeError,
    dumps,
    instance,
)

SCHEMAS: list[dict[str, Any]] = [
    {},
    {"type": "object"},
    {"type": "string"},
    {"type": "string", "minLength": 30, "maxLength": 31},
    {"type": "string", "maxLength": 2},
    {"type": "string", "format": "date-time"},
    {"type": "string", "format": "email"},
    {"type": "string", "format": "uuid"},
    {"type": "string", "pattern": "^[0-9]+$"},
    {"type": "integer", "minimum": 5, "maximum": 7},
    {"type": "integer", "exclusiveMinimum": 10},
    {"type": "integer", "minimum": 3, "multipleOf": 4},
    {"type": "integer", "maximum": -3},
    {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
    {"type": "number", "minimum": 0.5, "multipleOf": 0.25},
    {"type": "boolean"},
    {"type": "null"},
    {"type": ["null", "integer"]},
    {"enum": ["a", 1, None]},
    {"const": {"x": [1, 2]}},
    {"type": "array", "items": {"type": "integer"}, "minItems": 3, "uniqueItems": True},
    {"type": "array", "items": {"enum": ["x", "y", "z"]}, "minItems": 2, "uniqueItems": True},
    {"type": "array", "maxItems": 0},
    {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": False},
    {"anyOf": [{"type": "string", "minLength": 3}, {"type": "null"}]},
    {"oneOf": [{"type": "integer"}, {"type": "string"}]},
    {"allOf": [{"properties": {"a": {"type": "string"}}, "required": ["a"]}, {"type": "object"}]},
    {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
        "required": ["b"],
        "minProperties": 2,
        "additionalProperties": False,
    },
    {"type": "object", "additionalProperties": {"type": "integer"}},
    {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "value": {"type": "integer"},
                    "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]},
                },
                "required": ["value", "next"],
            }
        },
        "$ref": "#/$defs/node",
    },
    {
        "definitions": {"leaf": {"type": "string", "enum": ["l"]}},
        "type": "object",
        "properties": {"leaf": {"$ref": "#/definitions/leaf"}},
        "required": ["leaf"],
    },
]


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class Item(BaseModel):
    sku: str = Field(pattern=r"^[A-Z]{3}$")
    quantity: int = Field(gt=0, le=99)
    price: float = Field(ge=0)


class Order(BaseModel):
    id: UUID
    placed: datetime
    due: date | None
    color: Color
    status: Literal["open", "closed"]
    items: list[Item] = Field(min_length=1)
    notes: dict[str, str]
    rush: bool = False


class Tree(BaseModel):
    name: str
    children: list[Tree] = []


MODELS: list[type[BaseModel]] = [Order, Item, Tree]


@pytest.mark.parametrize("schema", SCHEMAS, ids=[json.dumps(s)[:50] for s in SCHEMAS])
def test_instances_validate(schema: dict[str, Any]) -> None:
    value = instance(schema)
    jsonschema.validate(value, schema)
    assert instance(schema) == value  # deterministic
    assert json.loads(dumps(value)) == value


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_pydantic_schemas_give_models(model: type[BaseModel]) -> None:
    for schema in (model.model_json_schema(), to_strict_json_schema(model)):
        value = instance(schema, text="hello")
        jsonschema.validate(value, schema)
        model.model_validate(value)


def test_object_keys_follow_the_schema_order() -> None:
    schema = to_strict_json_schema(Order)
    value = instance(schema, hint={"status": "closed", "color": "green"})
    assert list(value) == list(schema["properties"])
    assert value["status"] == "closed" and value["color"] == "green"


def test_hints_are_kept_where_they_fit() -> None:
    schema = to_strict_json_schema(Item)
    assert instance(schema, hint={"sku": "ABC", "quantity": 3, "price": 1.5}) == {
        "sku": "ABC",
        "quantity": 3,
        "price": 1.5,
    }
    repaired = instance(schema, hint={"sku": "lowercase", "quantity": 500, "price": -1})
    Item.model_validate(repaired)
    schema_with_null = {"anyOf": [{"type": "string"}, {"type": "null"}]}
    assert instance(schema_with_null, hint=None) is None
    assert instance(schema_with_null) == "text"


def test_strings_use_the_text() -> None:
    assert instance({"type": "string"}, text="You said: hi") == "You said: hi"
    assert instance({"type": "string", "maxLength": 3}, text="You said: hi") == "You"


def test_impossible_schemas_raise() -> None:
    with pytest.raises(SchemaInstanceError):
        instance(False)
    with pytest.raises(SchemaInstanceError):
        instance({"$ref": "#/$defs/missing"})
    with pytest.raises(SchemaInstanceError):
        instance({"enum": []})


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-1000, 1000) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from(["sku", "quantity", "price", "name", "x"]), children)
    ),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(hint=json_values, index=st.integers(0, len(SCHEMAS) - 1))
def test_any_hint_still_validates(hint: Any, index: int) -> None:
    schema = SCHEMAS[index]
    jsonschema.validate(instance(schema, hint=hint), schema)


@settings(max_examples=100, deadline=None)
@given(hint=json_values)
def test_any_hint_still_validates_for_models(hint: Any) -> None:
    for model in MODELS:
        schema = to_strict_json_schema(model)
        model.model_validate(instance(schema, hint=hint))


@pytest.mark.parametrize(
    "schema",
    [
        {
            "$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"$ref": "#/$defs/a"}]}},
            "$ref": "#/$defs/a",
        },
        {
            "type": "array",
            "minItems": 2000,
            "items": {
                "type": "array",
                "minItems": 2000,
                "items": {"type": "array", "minItems": 2000},
            },
        },
        {"type": "string", "minLength": 3_000_000_000},
        {"type": "object", "minProperties": 10**9, "additionalProperties": True},
    ],
)
def test_schemas_too_costly_to_answer_raise_quickly(schema: dict[str, Any]) -> None:
    started = time.perf_counter()
    with pytest.raises(SchemaTooLargeError):
        instance(schema)
    assert time.perf_counter() - started < 5


def test_patterns_with_huge_repeats_and_backtracking_stay_cheap() -> None:
    started = time.perf_counter()
    repeated = {"type": "string", "pattern": "^(?:(?:a{60000}){60000})$"}
    assert len(instance(repeated)) < 100_000
    nested = {"type": "string", "pattern": "^(a+)+$"}
    assert instance(nested, hint="a" * 40 + "!") == "a"  # the hint is not matched, not used
    assert instance(nested, hint="aaaa") == "aaaa"  # a short hint still is
    assert time.perf_counter() - started < 5


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [("^(?>ab)+c$", "abc"), ("^(?>a|b)[^\\d]x{2}(?=y)y$", "aaxxy"), ("^(?!z)[a-c]{2}$", "aa")],
)
def test_patterns_with_atomic_groups_and_lookarounds_get_matching_strings(
    pattern: str, expected: str
) -> None:
    schema = {"type": "string", "pattern": pattern}
    value = instance(schema)
    jsonschema.validate(value, schema)
    assert value == expected


def test_a_pattern_that_backtracks_polynomially_is_bounded() -> None:
    # Repeats one after another: Python's re takes minutes on 60 letters.
    schema = {
        "type": "object",
        "properties": {
            f"p{n}": {"type": "string", "pattern": "a*a*a*a*a*a*a*b"} for n in range(50)
        },
        "required": [f"p{n}" for n in range(50)],
    }
    started = time.perf_counter()
    value = instance(schema, hint={f"p{n}": "a" * 60 for n in range(50)})
    assert time.perf_counter() - started < 5  # generous: the matching shares 0.1 s
    assert set(value) == set(schema["properties"])  # type: ignore[arg-type]
    assert instance({"type": "string", "pattern": "^[a-z]{3}-\\d+$"}, hint="abc-12") == "abc-12"
