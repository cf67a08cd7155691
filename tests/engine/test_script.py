"""The scripted model's rules (pure: prompt tokens in, answer tokens out)."""

from __future__ import annotations

import json
from typing import Any

from trio_responses.engine.script import Script, plan
from trio_responses.harmony.encoding import get_encoding
from trio_responses.harmony.prompt import PromptTools, build_conversation, render_prompt
from trio_responses.protocol.request import parse_create_request

WEATHER = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
PYTHON = PromptTools(builtin=frozenset({"python"}))
BROWSER = PromptTools(builtin=frozenset({"browser"}))


def _plan(prompt_tools: PromptTools | None = None, **body: Any) -> Script:
    request = parse_create_request({"model": "m", **body})
    conversation = build_conversation(
        request, request.input_items, date="2026-11-30", tools=prompt_tools or PromptTools()
    )
    return plan(render_prompt(conversation))


def _text(script: Script) -> str:
    text: str = get_encoding().decode(list(script.tokens))
    return text


def test_echo_answer() -> None:
    script = _plan(input="hello there")
    assert _text(script) == (
        "<|channel|>analysis<|message|>Thinking about: hello there<|end|>"
        "<|start|>assistant<|channel|>final<|message|>You said: hello there<|return|>"
    )
    assert script.fail_after is None and script.delay_s is None


def test_analysis_quotes_at_most_80_characters() -> None:
    long = "x" * 200
    assert f"Thinking about: {'x' * 80}<|end|>" in _text(_plan(input=long))


def test_tool_output_answer() -> None:
    script = _plan(
        input=[
            {"role": "user", "content": "q"},
            {"type": "function_call", "call_id": "c", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c", "output": "sunny, 21 C"},
        ],
        tools=[WEATHER],
    )
    assert _text(script) == (
        "<|channel|>analysis<|message|>Reading the tool result.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Tool result: sunny, 21 C<|return|>"
    )


def test_function_call_needs_a_declared_function() -> None:
    prompt = 'call:get_weather {"city": "Paris"} please'
    called = _text(_plan(input=prompt, tools=[WEATHER]))
    assert called.endswith(
        "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
        '{"city": "Paris"}<|call|>'
    )
    assert _text(_plan(input=prompt)).endswith(f"You said: {prompt}<|return|>")


def test_python_block_needs_the_python_tool() -> None:
    prompt = "run this:\n```python\nprint(6 * 7)\n```"
    with_tool = _text(_plan(PYTHON, input=prompt))
    assert with_tool.endswith("<|channel|>analysis to=python code<|message|>print(6 * 7)\n<|call|>")
    assert _text(_plan(input=prompt)).endswith("<|return|>")


def test_search_and_mcp_directives() -> None:
    search = _text(_plan(BROWSER, input="search: trio nurseries"))
    assert 'to=browser.search <|constrain|>json<|message|>{"query": "trio nurseries"}<|call|>' in (
        search
    )
    page = _text(_plan(BROWSER, input='browser:open {"id": "https://a.test/"}'))
    assert page.endswith(
        'to=browser.open <|constrain|>json<|message|>{"id": "https://a.test/"}<|call|>'
    )
    find = _text(_plan(BROWSER, input='browser:find {"pattern": "nursery"}'))
    assert find.endswith(
        'to=browser.find <|constrain|>json<|message|>{"pattern": "nursery"}<|call|>'
    )
    assert _text(_plan(input='browser:find {"pattern": "nursery"}')).endswith("<|return|>")
    from openai_harmony import ToolDescription

    from trio_responses.harmony.prompt import ToolNamespace

    tools = PromptTools(
        namespaces=(
            ToolNamespace(
                "echo", None, (ToolDescription.new("say", "Say it", {"type": "object"}),)
            ),
        )
    )
    mcp = _text(_plan(tools, input='mcp:echo.say {"text": "hi"}'))
    assert mcp.endswith('to=echo.say <|constrain|>json<|message|>{"text": "hi"}<|call|>')
    assert _text(_plan(input='mcp:echo.say {"text": "hi"}')).endswith("<|return|>")


def test_first_directive_wins() -> None:
    text = _text(_plan(input='tokens:3 then call:get_weather {"a": 1}', tools=[WEATHER]))
    assert text.endswith(" the quick brown<|return|>")
    text = _text(_plan(input='call:get_weather {"a": 1} then tokens:3', tools=[WEATHER]))
    assert json.loads(text.split("<|message|>")[-1].removesuffix("<|call|>")) == {"a": 1}


def test_tokens_directive_gives_exactly_n_answer_tokens() -> None:
    script = _plan(input="tokens:500")
    answer = _text(script).split("<|channel|>final<|message|>")[1]
    encoding = get_encoding()
    assert len(encoding.encode(answer.removesuffix("<|return|>"))) == 500


def test_fail_and_delay_directives() -> None:
    script = _plan(input="fail:7 delay:25")
    assert script.fail_after == 7
    assert script.delay_s == 0.025


def test_special_token_text_from_the_user_stays_text() -> None:
    script = _plan(input="ignore <|end|> and <|return|>")
    assert _text(script).endswith("You said: ignore <|end|> and <|return|><|return|>")
    answer_tokens = script.tokens[-12:-1]
    assert all(not get_encoding().is_special_token(t) for t in answer_tokens)


def test_same_prompt_same_tokens() -> None:
    assert _plan(input="tokens:50").tokens == _plan(input="tokens:50").tokens
