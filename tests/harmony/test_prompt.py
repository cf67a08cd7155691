"""Request -> harmony conversation -> prompt tokens."""

from __future__ import annotations

from typing import Any

import pytest

from trio_responses import InvalidRequestError
from trio_responses.harmony.encoding import get_encoding
from trio_responses.harmony.prompt import build_conversation, render_prompt
from trio_responses.protocol.request import parse_create_request

FUNCTION = {
    "type": "function",
    "name": "lookup",
    "description": "Look it up",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
}


def _prompt(**body: Any) -> str:
    request = parse_create_request({"model": "m", **body})
    conversation = build_conversation(request, request.input_items, date="2026-11-30")
    tokens = render_prompt(conversation)
    text: str = get_encoding().decode(tokens)
    return text


def test_system_message_has_effort_and_date() -> None:
    text = _prompt(input="hi", reasoning={"effort": "high"})
    assert text.startswith("<|start|>system<|message|>")
    assert "Reasoning: high" in text and "Current date: 2026-11-30" in text
    assert "<|start|>developer" not in text
    assert text.endswith("<|start|>user<|message|>hi<|end|><|start|>assistant")


def test_developer_message_has_instructions_and_functions() -> None:
    text = _prompt(input="hi", instructions="Be brief.", tools=[FUNCTION])
    developer = text.split("<|start|>developer<|message|>")[1].split("<|end|>")[0]
    assert "Be brief." in developer
    assert "namespace functions" in developer and "type lookup" in developer


def test_tool_choice_none_hides_functions_and_required_is_said() -> None:
    hidden = _prompt(input="hi", tools=[FUNCTION], tool_choice="none")
    assert "namespace functions" not in hidden
    required = _prompt(input="hi", tools=[FUNCTION], tool_choice="required")
    assert "must call one of the available tools" in required
    named = _prompt(
        input="hi", tools=[FUNCTION], tool_choice={"type": "function", "name": "lookup"}
    )
    assert "must call the function `lookup`" in named


def test_json_schema_format_is_given_to_the_model() -> None:
    text = _prompt(
        input="hi",
        text={"format": {"type": "json_schema", "name": "answer", "schema": {"type": "object"}}},
    )
    assert "# Response Formats" in text and "## answer" in text


def test_history_items_become_harmony_messages() -> None:
    text = _prompt(
        input=[
            {"role": "system", "content": "extra rules"},
            {"role": "user", "content": "q"},
            {
                "type": "reasoning",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": "thinking"}],
            },
            {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "found"},
            {"role": "assistant", "content": "answer"},
            {"role": "user", "content": "again"},
        ],
        tools=[FUNCTION],
    )
    assert "<|start|>developer<|message|>extra rules<|end|>" in text
    assert "to=functions.lookup <|constrain|>json<|message|>{}<|call|>" in text
    assert "<|start|>functions.lookup" in text and "found<|end|>" in text
    assert "<|channel|>final<|message|>answer<|end|>" in text


def test_output_without_its_call_is_rejected() -> None:
    with pytest.raises(InvalidRequestError) as raised:
        _prompt(input=[{"type": "function_call_output", "call_id": "nope", "output": "x"}])
    assert raised.value.param == "input[0].call_id"
