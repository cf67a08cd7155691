"""Custom tools in the prompt: declared among the functions, called with raw text."""

from __future__ import annotations

from typing import Any

import pytest

from trio_responses import InvalidRequestError
from trio_responses.harmony.encoding import get_encoding
from trio_responses.harmony.fit import render_request_prompt
from trio_responses.harmony.prompt import build_conversation, render_prompt
from trio_responses.protocol.request import parse_create_request

TICKET = {
    "type": "custom",
    "name": "ticket",
    "description": "Open a ticket.",
    "format": {"type": "grammar", "syntax": "regex", "definition": r"[A-Z]{3}-\d+"},
}
NOTE = {"type": "custom", "name": "note"}
HISTORY = [
    {"role": "user", "content": "q"},
    {"type": "custom_tool_call", "call_id": "c1", "name": "ticket", "input": "ABC-1"},
    {"type": "custom_tool_call_output", "call_id": "c1", "output": "opened"},
]


def _prompts(**body: Any) -> list[str]:
    """The prompt as built whole and as fitted into the context window."""
    request = parse_create_request({"model": "m", **body})
    whole = render_prompt(build_conversation(request, request.input_items, date="2026-12-01"))
    fitted = render_request_prompt(
        request, request.input_items, date="2026-12-01", max_model_len=8192
    )
    return [get_encoding().decode(tokens) for tokens in (whole, fitted)]


def test_a_custom_tool_is_declared_with_its_grammar_and_raw_input() -> None:
    for text in _prompts(input="hi", tools=[TICKET, NOTE]):
        developer = text.split("<|start|>developer<|message|>")[1].split("<|end|>")[0]
        assert "namespace functions" in developer
        assert "type ticket = () => any;" in developer and "type note = () => any;" in developer
        assert "Open a ticket." in developer and r"[A-Z]{3}-\d+" in developer
        assert "free-form text (not JSON)" in developer


def test_a_custom_call_and_its_output_are_read_back_as_raw_text() -> None:
    for text in _prompts(input=HISTORY, tools=[TICKET]):
        assert "to=functions.ticket<|message|>ABC-1<|call|>" in text
        assert (
            "<|start|>functions.ticket<|channel|>commentary to=assistant<|message|>opened<|end|>"
            in text
        )


def test_tool_choice_custom_is_said() -> None:
    for text in _prompts(
        input="hi", tools=[TICKET], tool_choice={"type": "custom", "name": "ticket"}
    ):
        assert "must call the tool `ticket`" in text


def test_an_output_without_its_call_is_refused() -> None:
    with pytest.raises(InvalidRequestError) as raised:
        _prompts(input=[HISTORY[0], HISTORY[2]], tools=[TICKET])
    assert raised.value.param == "input[1].call_id"
