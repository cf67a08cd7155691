"""``tool_search`` run by the client, as Codex sends it, and ``defer_loading`` tools.

The model calls ``tool_search`` as a function; the call is a ``tool_search_call``
item the client answers with a ``tool_search_output`` listing the tools it found.
Tools sent with ``defer_loading`` are hidden until such an output loads them.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support import MODEL, Server, check_stream, read_sse

SEARCH: dict[str, Any] = {
    "type": "tool_search",
    "execution": "client",
    "description": "Find more tools.",
    "parameters": {
        "type": "object",
        "properties": {"query": {"type": "string"}},
        "required": ["query"],
    },
}
WEATHER: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
DEFERRED = {**WEATHER, "defer_loading": True}


async def _create(server: Server, **body: Any) -> dict[str, Any]:
    response = await server.http.post("/v1/responses", json={"model": MODEL, **body})
    assert response.status_code == 200, response.text
    data: dict[str, Any] = response.json()
    return data


async def test_search_load_and_call_a_deferred_tool(server: Server) -> None:
    tools = [SEARCH, DEFERRED]
    # Deferred: the model does not see get_weather, so it cannot call it yet.
    hidden = await _create(server, input='call:get_weather {"city": "Paris"}', tools=tools)
    assert [i["type"] for i in hidden["output"]] == ["reasoning", "message"]

    first = await _create(server, input='call:tool_search {"query": "weather"}', tools=tools)
    call = first["output"][-1]
    assert call["type"] == "tool_search_call"
    assert call["execution"] == "client"
    assert call["arguments"] == {"query": "weather"}
    assert call["status"] == "completed"
    assert first["status"] == "completed"
    # The echo keeps the tools as sent.
    assert first["tools"][1]["defer_loading"] is True

    second = await _create(
        server,
        previous_response_id=first["id"],
        input=[
            {
                "type": "tool_search_output",
                "call_id": call["call_id"],
                "execution": "client",
                "status": "completed",
                "tools": [WEATHER],
            }
        ],
        tools=tools,
    )
    assert second["output"][-1]["content"][0]["text"] == (
        "Tool result: Tools now available: get_weather."
    )

    third = await _create(
        server,
        previous_response_id=second["id"],
        input='call:get_weather {"city": "Paris"}',
        tools=tools,
    )
    function_call = third["output"][-1]
    assert function_call["type"] == "function_call"
    assert json.loads(function_call["arguments"]) == {"city": "Paris"}

    items = await server.http.get(f"/v1/responses/{second['id']}/input_items")
    listed = [item["type"] for item in items.json()["data"]]
    assert "tool_search_output" in listed


async def test_the_sdk_reads_the_items(server: Server) -> None:
    first = await server.client.responses.create(
        model=MODEL,
        input='call:tool_search {"query": "weather"}',
        tools=[SEARCH, DEFERRED],  # type: ignore[list-item]
    )
    call = first.output[-1]
    assert call.type == "tool_search_call"
    assert call.arguments == {"query": "weather"}
    # The whole history sent back, as a stateless client does, loads the tool too.
    history = [
        {"role": "user", "content": 'call:tool_search {"query": "weather"}'},
        call.model_dump(exclude_none=True),
        {"type": "tool_search_output", "call_id": call.call_id, "tools": [WEATHER]},
        {"role": "user", "content": 'call:get_weather {"city": "Oslo"}'},
    ]
    again = await server.client.responses.create(
        model=MODEL,
        input=history,
        tools=[SEARCH, DEFERRED],  # type: ignore[arg-type,list-item]
    )
    assert again.output[-1].type == "function_call"


async def test_a_namespace_loaded_by_search(server: Server) -> None:
    namespace = {
        "type": "namespace",
        "name": "mcp_docs",
        "description": "Documentation tools.",
        "tools": [{"type": "function", "name": "lookup", "description": "Look up a page."}],
    }
    deferred = {**namespace, "defer_loading": True}
    first = await _create(
        server, input='call:tool_search {"query": "docs"}', tools=[SEARCH, deferred]
    )
    call = first["output"][-1]
    second = await _create(
        server,
        previous_response_id=first["id"],
        input=[
            {"type": "tool_search_output", "call_id": call["call_id"], "tools": [namespace]},
            {"role": "user", "content": "call:mcp_docs.lookup {}"},
        ],
        tools=[SEARCH, deferred],
    )
    loaded_call = second["output"][-1]
    assert (loaded_call["namespace"], loaded_call["name"]) == ("mcp_docs", "lookup")


async def test_the_call_streams_as_an_item(server: Server) -> None:
    status, events, _ = await read_sse(
        server.http,
        "POST",
        "/v1/responses",
        json={
            "model": MODEL,
            "input": 'call:tool_search {"query": "weather"}',
            "tools": [SEARCH],
            "stream": True,
        },
    )
    assert status == 200
    payloads = [event.json() for event in events[:-1]]
    check_stream(payloads)
    done = [p["item"] for p in payloads if p["type"] == "response.output_item.done"]
    assert done[-1]["type"] == "tool_search_call"
    assert done[-1]["arguments"] == {"query": "weather"}


@pytest.mark.parametrize(
    ("tools", "param"),
    [
        ([{"type": "tool_search"}], "tools[0].execution"),
        ([{"type": "tool_search", "execution": "server"}], "tools[0].execution"),
        ([SEARCH, SEARCH], "tools[1].type"),
        ([SEARCH, {"type": "function", "name": "tool_search"}], "tools[0]"),
    ],
)
async def test_refused_tool_search(server: Server, tools: list[Any], param: str) -> None:
    response = await server.http.post(
        "/v1/responses", json={"model": MODEL, "input": "hi", "tools": tools}
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == param


async def test_a_loaded_tool_must_be_one_the_model_can_call(server: Server) -> None:
    response = await server.http.post(
        "/v1/responses",
        json={
            "model": MODEL,
            "tools": [SEARCH],
            "input": [
                {"type": "tool_search_call", "call_id": "c1", "arguments": {"query": "x"}},
                {
                    "type": "tool_search_output",
                    "call_id": "c1",
                    "tools": [{"type": "code_interpreter", "container": {"type": "auto"}}],
                },
            ],
        },
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "input[1].tools[0].type"
