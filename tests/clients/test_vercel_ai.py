"""The Vercel AI SDK (``ai`` + ``@ai-sdk/openai``, ``openai.responses(model)``).

``tests/clients/js/vercel_ai.mjs`` runs one scenario per node process against the
test's server and prints what the SDK returned, with the request bodies it sent.
Node and the packages: `tests.clients.node`.
"""

from __future__ import annotations

from typing import Any

from tests.clients.node import run_scenario
from tests.support import MODEL, Server


async def _scenario(node: str, server: Server, name: str) -> dict[str, Any]:
    return await run_scenario(node, "vercel_ai.mjs", server, name, sdk="Vercel AI SDK")


def _input_types(request: dict[str, Any]) -> list[str]:
    return [item.get("type", "message") for item in request["input"]]


async def test_generate_text(node: str, server: Server) -> None:
    result = await _scenario(node, server, "generate")
    assert result["text"] == "You said: hello"
    assert result["finishReason"] == "stop"
    assert result["modelId"] == MODEL
    usage = result["usage"]
    assert usage["totalTokens"] == usage["inputTokens"] + usage["outputTokens"]
    assert usage["outputTokenDetails"]["reasoningTokens"] > 0
    stored = await server.client.responses.retrieve(result["responseId"])
    assert stored.output_text == "You said: hello"


async def test_stream_text(node: str, server: Server) -> None:
    result = await _scenario(node, server, "stream")
    assert len(result["chunks"]) > 1, "the answer arrived in one piece, not streamed"
    assert "".join(result["chunks"]) == result["text"] == "You said: hello stream"
    assert result["finishReason"] == "stop"
    assert result["usage"]["outputTokens"] > 0
    [request] = result["requests"]
    assert request["stream"] is True
    assert request["input"][0] == {"role": "developer", "content": "Be brief."}


def _check_tool_loop(result: dict[str, Any]) -> None:
    """Two steps: two calls of get_weather in one response (run by the SDK), then the
    answer."""
    call, answer = result["steps"]
    assert call["finishReason"] == "tool-calls"
    assert call["toolCalls"] == [
        {"toolName": "get_weather", "input": {"city": "Paris"}},
        {"toolName": "get_weather", "input": {"city": "Oslo"}},
    ]
    assert call["toolResults"] == [
        {"toolName": "get_weather", "output": "sunny in Paris"},
        {"toolName": "get_weather", "output": "sunny in Oslo"},
    ]
    assert answer["finishReason"] == "stop"
    assert answer["toolCalls"] == []
    assert result["text"] == answer["text"] == "Tool result: sunny in Oslo"
    assert len(result["requests"]) == 2


async def test_tool_loop_with_stored_items(node: str, server: Server) -> None:
    # store: true (the default): the SDK refers to the stored reasoning item by id.
    result = await _scenario(node, server, "tools-stored")
    _check_tool_loop(result)
    second = result["requests"][1]
    assert _input_types(second) == [
        "message",
        "item_reference",
        "function_call",
        "function_call",
        "function_call_output",
        "function_call_output",
    ]


async def test_streamed_tool_loop_with_stored_items(node: str, server: Server) -> None:
    result = await _scenario(node, server, "tools-stored-stream")
    _check_tool_loop(result)
    assert "".join(result["chunks"]) == "Tool result: sunny in Oslo"
    assert all(request["stream"] is True for request in result["requests"])
    assert "item_reference" in _input_types(result["requests"][1])


async def test_stateless_tool_loop(node: str, server: Server) -> None:
    # store: false: nothing is kept, the reasoning goes back as encrypted_content.
    result = await _scenario(node, server, "tools-stateless")
    _check_tool_loop(result)
    first, second = result["requests"]
    assert first["store"] is False
    assert first["include"] == ["reasoning.encrypted_content"]
    [reasoning] = [item for item in second["input"] if item.get("type") == "reasoning"]
    assert reasoning["encrypted_content"], "the SDK got no encrypted reasoning to send back"
    assert "item_reference" not in _input_types(second)
