"""Request -> harmony conversation -> prompt tokens."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest

from trio_responses import InvalidRequestError
from trio_responses.harmony.encoding import get_encoding
from trio_responses.harmony.fit import (
    DEFAULT_RESERVE_TOKENS,
    output_reserve,
    render_request_prompt,
)
from trio_responses.harmony.prompt import PromptTools, build_conversation, render_prompt
from trio_responses.protocol.request import (
    CreateRequest,
    FunctionCallOutputItem,
    InputItem,
    McpApprovalResponseItem,
    parse_create_request,
    parse_input_item,
)

DATE = "2026-11-30"

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


# -- fitting into the context window ------------------------------------------------------


def _reference_fit(
    request: CreateRequest,
    items: Sequence[InputItem],
    *,
    max_model_len: int,
    tools: PromptTools,
    approval_results: Mapping[str, str],
) -> list[int]:
    """The plain algorithm `render_request_prompt` must agree with: render the whole
    conversation, and while it does not leave room for output (with truncation: the
    reserve; the newest item alone, or without truncation: any room), drop the oldest
    item (and any tool outputs left at the front without their call) and render it
    all again."""
    truncate = request.truncation == "auto"
    reserve = output_reserve(request, max_model_len) if truncate else 0
    while True:
        prompt = render_prompt(
            build_conversation(
                request, items, date=DATE, tools=tools, approval_results=approval_results
            )
        )
        last = not truncate or len(items) <= 1
        if len(prompt) + reserve <= max_model_len or (last and len(prompt) < max_model_len):
            return prompt
        if last:
            raise InvalidRequestError("too long", param="input", code="context_length_exceeded")
        rest = list(items[1:])
        while rest and isinstance(rest[0], FunctionCallOutputItem | McpApprovalResponseItem):
            rest = rest[1:]
        items = rest or list(items[-1:])


def _outcome(function: Callable[..., list[int]], *args: Any, **kwargs: Any) -> tuple[Any, ...]:
    try:
        return ("prompt", function(*args, **kwargs))
    except InvalidRequestError as error:
        return ("error", error.code, error.param)


WORDS = ["alpha", "beta", "gamma", "delta", "x", "42", "naïve", "日本", "\n", "  ", "{}"]


ANY_ITEM = (
    *("user", "assistant", "assistant", "system", "developer", "reasoning"),
    *("function_call", "function_call_output", "code", "mcp_call", "request"),
    *("response", "list", "search"),
)
TOOL_ITEM = (
    *("assistant", "reasoning", "reasoning", "code", "function_call", "function_call_output"),
    *("mcp_call", "request", "request", "response", "response", "response"),
)


def _random_item(rng: random.Random, index: int, kinds: Sequence[str]) -> dict[str, Any]:
    def text() -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 30)))

    call_id = f"c{rng.randint(0, 3)}"
    request_id = f"mcpr_{rng.randint(0, 1 if kinds is TOOL_ITEM else 3)}"
    kind = rng.choice(kinds)
    if kind in ("user", "assistant", "system", "developer"):
        if rng.random() < 0.5:
            return {"role": kind, "content": text()}
        part = "output_text" if kind == "assistant" else "input_text"
        return {"type": "message", "role": kind, "content": [{"type": part, "text": text()}]}
    if kind == "reasoning":
        return {
            "type": "reasoning",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": text()}],
        }
    if kind == "function_call":
        return {
            "type": "function_call",
            "call_id": call_id,
            "name": rng.choice(["f", "g"]),
            "arguments": '{"q": "' + text() + '"}',
        }
    if kind == "function_call_output":
        return {"type": "function_call_output", "call_id": call_id, "output": text()}
    if kind == "code":
        return {
            "type": "code_interpreter_call",
            "id": f"ci_{index}",
            "code": text(),
            "outputs": [{"type": "logs", "logs": text()}],
        }
    if kind == "mcp_call":
        call: dict[str, Any] = {
            "type": "mcp_call",
            "id": f"mcp_{index}",
            "server_label": "s",
            "name": "t",
            "arguments": "{}",
            "output": text(),
        }
        if rng.random() < 0.5:
            call["approval_request_id"] = request_id
        return call
    if kind == "request":
        return {
            "type": "mcp_approval_request",
            "id": request_id,
            "server_label": "s",
            "name": "t",
            "arguments": '{"a": "' + text() + '"}',
        }
    if kind == "response":
        return {
            "type": "mcp_approval_response",
            "approval_request_id": request_id,
            "approve": rng.random() < 0.5,
        }
    if kind == "list":
        return {"type": "mcp_list_tools", "id": f"mcpl_{index}", "server_label": "s", "tools": []}
    return {"type": "web_search_call", "id": f"ws_{index}", "status": "completed"}


@pytest.mark.slow
def test_fitting_gives_what_rendering_each_state_in_turn_gives() -> None:
    rng = random.Random(20261130)
    outcomes: set[str] = set()
    for case in range(2000):
        # Half the cases mix every item type; half are mostly tool calls and approvals.
        kinds = rng.choice([ANY_ITEM, TOOL_ITEM])
        count = rng.randint(0, 12)
        items = [parse_input_item(_random_item(rng, i, kinds)) for i in range(count)]
        body: dict[str, Any] = {
            "model": "m",
            "input": "hi",
            "truncation": rng.choice(["auto", "auto", "disabled"]),
        }
        if rng.random() < 0.5:
            body["tools"] = [FUNCTION]
        if rng.random() < 0.3:
            body["tool_choice"] = "none"
        if rng.random() < 0.5:
            body["instructions"] = "Be brief. " * rng.randint(1, 20)
        if rng.random() < 0.3:
            body["max_output_tokens"] = rng.choice([16, 50, 100, 1000, 10_000])
        request = parse_create_request(body)
        tools = PromptTools(builtin=frozenset({"python"} if rng.random() < 0.3 else ()))
        results = {f"mcpr_{n}": f"ran {n}" for n in range(4) if rng.random() < 0.2}
        max_model_len = rng.choice([20, 60, 120, 200, 300, 500, 800, 5000])
        history: dict[str, Any] = {"tools": tools, "approval_results": results}
        expected = _outcome(_reference_fit, request, items, max_model_len=max_model_len, **history)
        got = _outcome(
            render_request_prompt,
            request,
            items,
            date=DATE,
            max_model_len=max_model_len,
            **history,
        )
        assert got == expected, (case, [item.type for item in items], max_model_len)
        if expected[0] == "prompt":
            whole = _outcome(
                lambda *args, **kwargs: render_prompt(build_conversation(*args, **kwargs)),
                request,
                items,
                date=DATE,
                **history,
            )
            truncated = whole[0] == "error" or len(whole[1]) >= max_model_len
            outcomes.add("truncated" if truncated else "whole")
        else:
            outcomes.add(str(expected[1]))
    # The cases cover every outcome: the whole conversation, a truncated one, too
    # long, and an orphaned output.
    assert outcomes == {"whole", "truncated", "context_length_exceeded", "invalid_request"}


def _fit_tokens(max_model_len: int, **body: Any) -> list[int]:
    request = parse_create_request({"model": "m", **body})
    tokens = render_request_prompt(
        request, request.input_items, date=DATE, max_model_len=max_model_len
    )
    assert len(tokens) < max_model_len
    return tokens


def _fit(max_model_len: int, **body: Any) -> str:
    text: str = get_encoding().decode(_fit_tokens(max_model_len, **body))
    return text


def _turns(count: int) -> list[dict[str, str]]:
    return [
        {"role": "user" if n % 2 == 0 else "assistant", "content": f"turn {n} " + "word " * 20}
        for n in range(count)
    ]


def test_truncation_drops_the_oldest_items_and_keeps_the_instructions() -> None:
    text = _fit(300, input=_turns(40), instructions="Be brief.", truncation="auto")
    assert text.startswith("<|start|>system<|message|>")
    assert "Be brief." in text.split("<|start|>developer<|message|>")[1].split("<|end|>")[0]
    assert "turn 39 " in text and "turn 0 " not in text
    kept = [n for n in range(40) if f"turn {n} " in text]
    assert kept == list(range(kept[0], 40)) and len(kept) < 40


@pytest.mark.parametrize(
    ("max_output_tokens", "reserve"), [(None, 8192 // 4), (300, 300), (5000, 5000)]
)
def test_truncation_leaves_room_for_the_answer(max_output_tokens: int | None, reserve: int) -> None:
    body: dict[str, Any] = {"input": _turns(2000), "truncation": "auto"}
    if max_output_tokens is not None:
        body["max_output_tokens"] = max_output_tokens
    tokens = _fit_tokens(8192, **body)
    assert len(tokens) + reserve <= 8192
    # No more dropped than that: one more item would not have left the room.
    assert len(tokens) + reserve + 40 > 8192


def test_the_default_reserve_is_a_quarter_of_the_window_up_to_a_limit() -> None:
    request = parse_create_request({"model": "m", "input": "hi"})
    assert output_reserve(request, 8192) == 2048
    assert output_reserve(request, 131_072) == DEFAULT_RESERVE_TOKENS == 16_384
    bounded = parse_create_request({"model": "m", "input": "hi", "max_output_tokens": 100})
    assert output_reserve(bounded, 131_072) == 100


def test_the_newest_item_is_kept_when_it_fits_without_the_reserve() -> None:
    newest = {"role": "user", "content": "word " * 300}
    tokens = _fit_tokens(400, input=[*_turns(5), newest], truncation="auto")
    assert 300 < len(tokens) < 400
    assert "turn 4 " not in get_encoding().decode(tokens)


def test_truncation_drops_a_call_with_its_output() -> None:
    items: list[dict[str, Any]] = [
        {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "found " * 50},
        {"role": "user", "content": "and now?"},
    ]
    whole = _fit_tokens(5000, input=items, tools=[FUNCTION], truncation="auto")
    assert "<|start|>functions.lookup" in get_encoding().decode(whole)
    text = _fit(len(whole) - 10, input=items, tools=[FUNCTION], truncation="auto")
    assert "functions.lookup" not in text.split("<|start|>user")[-1] and "found" not in text
    assert text.endswith("<|start|>user<|message|>and now?<|end|><|start|>assistant")


def test_the_newest_item_alone_not_fitting_is_context_length_exceeded() -> None:
    for truncation in ("auto", "disabled"):
        with pytest.raises(InvalidRequestError) as raised:
            _fit(
                200,
                input=[*_turns(5), {"role": "user", "content": "word " * 400}],
                truncation=truncation,
            )
        assert (raised.value.code, raised.value.param) == ("context_length_exceeded", "input")
        assert "The input is " in raised.value.message and "200 tokens" in raised.value.message


def test_an_input_that_cannot_fit_is_refused_before_it_is_tokenized() -> None:
    # Tokenizing a 2 MB word takes minutes (the tokenizer is quadratic in the
    # length of a word); its lower bound alone is over 70,000 tokens.
    start = time.monotonic()
    for truncation in ("auto", "disabled"):
        with pytest.raises(InvalidRequestError) as raised:
            _fit(
                8192,
                input=[*_turns(3), {"role": "user", "content": "a" * 2_000_000}],
                truncation=truncation,
            )
        assert raised.value.code == "context_length_exceeded"
        assert "The input is at least " in raised.value.message
    assert time.monotonic() - start < 20


def test_an_input_that_panics_the_tokenizer_in_one_call_renders() -> None:
    # A million spaces in one tokenizer call overflow its regex's stack (a panic);
    # rendered in bounded pieces they reach the model like any other text.
    assert " " * 1_000_000 in _fit(131_072, input=" " * 1_000_000)


def test_remembered_system_messages_render_as_harmony_does() -> None:
    """The system and developer messages are rendered once and remembered: each
    request still gets exactly what harmony renders for it, date and effort included."""
    for effort in ("low", "high", "low"):
        for date in ("2026-11-30", "2026-12-01", "2026-11-30"):
            body: dict[str, Any] = {
                "model": "m",
                "input": "hi",
                "instructions": "Be brief.",
                "reasoning": {"effort": effort},
            }
            request = parse_create_request(body)
            fitted = render_request_prompt(
                request, request.input_items, date=date, max_model_len=4096
            )
            reference = render_prompt(build_conversation(request, request.input_items, date=date))
            assert fitted == reference
            text = get_encoding().decode(fitted)
            assert f"Reasoning: {effort}" in text and f"Current date: {date}" in text


def test_remembered_system_messages_follow_tools_and_tool_choice() -> None:
    """The system message is remembered by what it says: built-in tools shown or hidden
    by ``tool_choice``, and whether functions are declared (harmony then names their
    channel in it). Each combination, in an order that revisits them, renders as
    harmony does."""
    combinations = [
        (python, browser, choice, functions)
        for python in (False, True)
        for browser in (False, True)
        for choice in ("auto", "none")
        for functions in (False, True)
    ]
    seen_system: set[str] = set()
    for python, browser, choice, functions in combinations + combinations[::-1]:
        body: dict[str, Any] = {"model": "m", "input": "hi", "tool_choice": choice}
        if functions:
            body["tools"] = [FUNCTION]
        request = parse_create_request(body)
        tools = PromptTools(
            builtin=frozenset(
                name for name, shown in (("python", python), ("browser", browser)) if shown
            )
        )
        fitted = render_request_prompt(
            request, request.input_items, date=DATE, max_model_len=4096, tools=tools
        )
        conversation = build_conversation(request, request.input_items, date=DATE, tools=tools)
        assert fitted == render_prompt(conversation), (python, browser, choice, functions)
        text = get_encoding().decode(fitted)
        seen_system.add(text.split("<|end|>")[0])
    # The system messages told apart: each tool shown or not, and the functions'
    # channel named or not.
    assert len(seen_system) == 8
