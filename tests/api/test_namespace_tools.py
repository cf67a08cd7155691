"""Namespace tools: functions grouped under a namespace, as Codex's multi-agent tools are.

The namespace is rendered as its own harmony namespace, the model calls
``NAMESPACE.NAME``, and the ``function_call`` item names its ``namespace``; the
output goes back to the model from that function.
"""

from __future__ import annotations

import json
from typing import Any

from tests.support import MODEL, Server, check_stream, read_sse

AGENTS: dict[str, Any] = {
    "type": "namespace",
    "name": "multi_agent_v1",
    "description": "Run sub-agents.",
    "tools": [
        {
            "type": "function",
            "name": "spawn_agent",
            "description": "Start a sub-agent with a message.",
            "parameters": {
                "type": "object",
                "properties": {"message": {"type": "string"}},
                "required": ["message"],
            },
        },
        {"type": "function", "name": "wait", "description": "Wait for agents."},
    ],
}
WEATHER: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


async def test_a_namespace_call_round_trip(server: Server) -> None:
    first = await server.client.responses.create(
        model=MODEL,
        input='call:multi_agent_v1.spawn_agent {"message": "look around"}',
        tools=[AGENTS, WEATHER],  # type: ignore[list-item]
    )
    call = first.output[-1]
    assert call.type == "function_call"
    assert (call.namespace, call.name) == ("multi_agent_v1", "spawn_agent")
    assert json.loads(call.arguments) == {"message": "look around"}

    second = await server.client.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "agent-1"}],
        tools=[AGENTS, WEATHER],  # type: ignore[list-item]
    )
    assert second.output_text == "Tool result: agent-1"

    # The same history sent whole, as a stateless client (Codex) does.
    history = [
        {"role": "user", "content": "start"},
        call.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": call.call_id, "output": "agent-2"},
    ]
    third = await server.client.responses.create(
        model=MODEL,
        input=history,  # type: ignore[arg-type]
        tools=[AGENTS],  # type: ignore[list-item]
        store=False,
    )
    assert third.output_text == "Tool result: agent-2"


async def test_a_namespace_call_streams_as_a_function_call(server: Server) -> None:
    status, events, _ = await read_sse(
        server.http,
        "POST",
        "/v1/responses",
        json={
            "model": MODEL,
            "input": "call:multi_agent_v1.wait {}",
            "tools": [AGENTS],
            "stream": True,
        },
    )
    assert status == 200
    payloads = [event.json() for event in events[:-1]]
    check_stream(payloads)
    done = [p["item"] for p in payloads if p["type"] == "response.output_item.done"]
    assert done[-1]["type"] == "function_call"
    assert done[-1]["namespace"] == "multi_agent_v1" and done[-1]["name"] == "wait"


async def test_a_function_outside_the_namespace_is_not_called_through_it(server: Server) -> None:
    response = await server.client.responses.create(
        model=MODEL,
        input='call:multi_agent_v1.get_weather {"city": "Oslo"}',
        tools=[AGENTS, WEATHER],  # type: ignore[list-item]
    )
    assert [item.type for item in response.output] == ["reasoning", "message"]


async def test_a_namespace_name_already_taken_is_400(server: Server) -> None:
    for name in ("functions", "python", "browser"):
        body = {"model": MODEL, "input": "hi", "tools": [{**AGENTS, "name": name}]}
        response = await server.http.post("/v1/responses", json=body)
        assert response.status_code == 400, name
        assert response.json()["error"]["param"] == "tools[0].name"
    twice = {"model": MODEL, "input": "hi", "tools": [AGENTS, AGENTS]}
    response = await server.http.post("/v1/responses", json=twice)
    assert response.status_code == 400 and response.json()["error"]["param"] == "tools[1].name"


async def test_duplicate_functions_and_bad_schemas_in_a_namespace_are_400(
    server: Server,
) -> None:
    duplicate = {**AGENTS, "tools": [AGENTS["tools"][1], AGENTS["tools"][1]]}
    response = await server.http.post(
        "/v1/responses", json={"model": MODEL, "input": "hi", "tools": [duplicate]}
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "tools[0].tools[1].name"
    bad = {**AGENTS, "tools": [{**AGENTS["tools"][1], "parameters": {"type": 7}}]}
    response = await server.http.post(
        "/v1/responses", json={"model": MODEL, "input": "hi", "tools": [bad]}
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "tools[0].tools[0].parameters"


async def test_required_tool_choice_can_be_met_by_a_namespace_function(server: Server) -> None:
    # Only namespace tools: "required" steers the turn into a call of one of them,
    # its arguments constrained to that function's schema.
    response = await server.client.responses.create(
        model=MODEL,
        input="just answer",
        tools=[AGENTS],  # type: ignore[list-item]
        tool_choice="required",
    )
    call = response.output[-1]
    assert call.type == "function_call" and call.namespace == "multi_agent_v1"
    assert call.name in {"spawn_agent", "wait"}
    if call.name == "spawn_agent":
        assert isinstance(json.loads(call.arguments)["message"], str)
