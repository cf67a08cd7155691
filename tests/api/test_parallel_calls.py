"""Several client calls in one turn (``parallel_tool_calls``).

The scripted model makes one call per ``call:``/``custom:`` directive, in the
text's order; after each call the server asks the model for another one
(`harmony.parallel`), so the client gets every call in one response and sends
every output back at once.
"""

from __future__ import annotations

import json
from typing import Any

from tests.support import MODEL, Server, check_stream, read_sse

WEATHER: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
NOTE: dict[str, Any] = {"type": "custom", "name": "note", "description": "Write a note."}
AGENTS: dict[str, Any] = {
    "type": "namespace",
    "name": "agents",
    "description": "Sub-agents.",
    "tools": [{"type": "function", "name": "spawn", "description": "Start one."}],
}
TWO_CITIES = 'call:get_weather {"city": "Paris"} call:get_weather {"city": "Oslo"}'


def _calls(output: list[Any]) -> list[Any]:
    return [item for item in output if item.type in ("function_call", "custom_tool_call")]


async def test_two_calls_in_one_response_and_both_outputs_back(server: Server) -> None:
    first = await server.client.responses.create(model=MODEL, input=TWO_CITIES, tools=[WEATHER])  # type: ignore[list-item]
    assert first.status == "completed"
    assert first.parallel_tool_calls is True
    calls = _calls(first.output)
    assert [json.loads(c.arguments) for c in calls] == [{"city": "Paris"}, {"city": "Oslo"}]
    assert len({c.call_id for c in calls}) == 2
    assert len({c.id for c in calls}) == 2
    assert first.output[-1].type == "function_call"  # nothing after the calls

    outputs = [
        {"type": "function_call_output", "call_id": c.call_id, "output": f"sunny in {city}"}
        for c, city in zip(calls, ("Paris", "Oslo"), strict=True)
    ]
    second = await server.client.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        input=outputs,
        tools=[WEATHER],  # type: ignore[arg-type,list-item]
    )
    assert second.output_text == "Tool result: sunny in Oslo"

    # The same history sent whole, as a stateless client does.
    history = [
        {"role": "user", "content": TWO_CITIES},
        *[c.model_dump(exclude_none=True) for c in calls],
        *outputs,
    ]
    again = await server.client.responses.create(model=MODEL, input=history, tools=[WEATHER])  # type: ignore[arg-type,list-item]
    assert again.output_text == "Tool result: sunny in Oslo"


async def test_parallel_tool_calls_false_makes_one_call(server: Server) -> None:
    response = await server.client.responses.create(
        model=MODEL,
        input=TWO_CITIES,
        tools=[WEATHER],
        parallel_tool_calls=False,  # type: ignore[list-item]
    )
    assert response.parallel_tool_calls is False
    calls = _calls(response.output)
    assert [json.loads(c.arguments) for c in calls] == [{"city": "Paris"}]


async def test_the_calls_stream_one_after_another(server: Server) -> None:
    status, events, _ = await read_sse(
        server.http,
        "POST",
        "/v1/responses",
        json={"model": MODEL, "input": TWO_CITIES, "tools": [WEATHER], "stream": True},
    )
    assert status == 200
    payloads = [event.json() for event in events[:-1]]
    check_stream(payloads)
    done = [p for p in payloads if p["type"] == "response.function_call_arguments.done"]
    assert [json.loads(p["arguments"]) for p in done] == [{"city": "Paris"}, {"city": "Oslo"}]
    added = [p for p in payloads if p["type"] == "response.output_item.added"]
    assert [p["output_index"] for p in added] == list(range(len(added)))
    final = payloads[-1]["response"]
    assert final["status"] == "completed"
    assert [i["type"] for i in final["output"]][-2:] == ["function_call", "function_call"]


async def test_function_custom_and_namespace_calls_together(server: Server) -> None:
    response = await server.client.responses.create(
        model=MODEL,
        input='custom:note <<<buy milk>>> call:agents.spawn {} call:get_weather {"city": "Rome"}',
        tools=[WEATHER, NOTE, AGENTS],  # type: ignore[list-item]
    )
    calls = _calls(response.output)
    assert [(c.type, c.name) for c in calls] == [
        ("custom_tool_call", "note"),
        ("function_call", "spawn"),
        ("function_call", "get_weather"),
    ]
    assert calls[0].input == "buy milk"
    assert calls[1].namespace == "agents"


async def test_at_most_sixteen_calls_in_one_turn(server: Server) -> None:
    text = " ".join(f'call:get_weather {{"city": "c{i}"}}' for i in range(20))
    response = await server.client.responses.create(model=MODEL, input=text, tools=[WEATHER])  # type: ignore[list-item]
    calls = _calls(response.output)
    assert [json.loads(c.arguments)["city"] for c in calls] == [f"c{i}" for i in range(16)]


async def test_allowed_tools_limit_the_next_calls(server: Server) -> None:
    response = await server.client.responses.create(
        model=MODEL,
        input='call:get_weather {"city": "Paris"} call:agents.spawn {}',
        tools=[WEATHER, AGENTS],  # type: ignore[list-item]
        tool_choice={
            "type": "allowed_tools",
            "mode": "auto",
            "tools": [{"type": "function", "name": "get_weather"}],
        },
    )
    assert [c.name for c in _calls(response.output)] == ["get_weather"]
    assert response.status == "completed"
