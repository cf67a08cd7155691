"""Request validation without a server."""

from __future__ import annotations

import pytest

from trio_responses import InvalidRequestError
from trio_responses.protocol.request import (
    FunctionCallOutputItem,
    MessageItem,
    parse_create_request,
)


def test_string_input_is_one_user_message() -> None:
    request = parse_create_request({"model": "m", "input": "hello"})
    (item,) = request.input_items
    assert isinstance(item, MessageItem)
    assert item.role == "user" and item.text() == "hello"


def test_items_without_type_are_messages_and_parts_join() -> None:
    request = parse_create_request(
        {
            "model": "m",
            "input": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "a"},
                        {"type": "input_text", "text": "b"},
                    ],
                },
                {"type": "function_call_output", "call_id": "c1", "output": "x"},
            ],
        }
    )
    message, output = request.input_items
    assert isinstance(message, MessageItem) and message.text() == "ab"
    assert isinstance(output, FunctionCallOutputItem) and output.text() == "x"


def test_null_fields_count_as_absent_and_hints_are_accepted() -> None:
    request = parse_create_request(
        {
            "model": "m",
            "instructions": None,
            "temperature": None,
            "service_tier": "auto",
            "prompt_cache_key": "k",
            "safety_identifier": "user-1",
            "stream_options": {"include_obfuscation": False},
        }
    )
    assert request.instructions is None and request.temperature is None


def test_defaults() -> None:
    request = parse_create_request({"model": "m"})
    assert request.store is True and request.stream is False and request.background is False
    assert request.tool_choice == "auto" and request.reasoning_effort == "medium"
    assert request.input_items == []


def test_no_type_coercion() -> None:
    with pytest.raises(InvalidRequestError) as raised:
        parse_create_request({"model": "m", "store": "false"})
    assert raised.value.param == "store"
    assert raised.value.message == "Invalid type for 'store': expected a boolean."


def test_integers_are_accepted_as_numbers() -> None:
    assert parse_create_request({"model": "m", "temperature": 1}).temperature == 1


def test_json_schema_format_uses_the_schema_key() -> None:
    request = parse_create_request(
        {
            "model": "m",
            "text": {
                "format": {"type": "json_schema", "name": "out", "schema": {"type": "object"}}
            },
        }
    )
    assert request.text is not None and request.text.format is not None
    assert request.text.format.model_dump(by_alias=True)["schema"] == {"type": "object"}


def test_duplicate_function_names_and_unknown_tool_choice_are_rejected() -> None:
    tool = {"type": "function", "name": "f"}
    with pytest.raises(InvalidRequestError) as raised:
        parse_create_request({"model": "m", "tools": [tool, tool]})
    assert raised.value.param == "tools[1].name"
    with pytest.raises(InvalidRequestError) as raised:
        parse_create_request(
            {"model": "m", "tools": [tool], "tool_choice": {"type": "function", "name": "g"}}
        )
    assert raised.value.param == "tool_choice"


def test_images_are_rejected_with_a_reason() -> None:
    with pytest.raises(InvalidRequestError) as raised:
        parse_create_request(
            {
                "model": "m",
                "input": [
                    {
                        "role": "user",
                        "content": [{"type": "input_image", "image_url": "http://127.0.0.1/x.png"}],
                    }
                ],
            }
        )
    assert raised.value.param == "input[0].content[0].type"
    assert "text only" in raised.value.message
