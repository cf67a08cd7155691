"""``tool_choice: {"type": "allowed_tools"}``: only the listed tools may be called.

The tools left out are not shown to the model; ``mode: "required"`` steers the turn
into a call of one of the listed tools, ``auto`` lets the model answer instead.
"""

from __future__ import annotations

import json
from typing import Any

from tests.api.test_namespace_tools import AGENTS
from tests.api.test_tool_choice import TIME, WEATHER
from tests.support import MODEL, Server


def _allowed(mode: str, *tools: dict[str, Any]) -> dict[str, Any]:
    return {"type": "allowed_tools", "mode": mode, "tools": list(tools)}


async def test_required_calls_one_of_the_listed_tools(server: Server) -> None:
    response = await server.client.responses.create(
        model=MODEL,
        input="what time is it?",
        tools=[WEATHER, TIME],  # type: ignore[list-item]
        tool_choice=_allowed("required", {"type": "function", "name": "get_time"}),  # type: ignore[arg-type]
    )
    call = response.output[-1]
    assert call.type == "function_call" and call.name == "get_time"
    assert isinstance(json.loads(call.arguments), dict)
    assert response.tool_choice.type == "allowed_tools"  # type: ignore[union-attr]


async def test_auto_lets_the_model_call_a_listed_tool(server: Server) -> None:
    response = await server.client.responses.create(
        model=MODEL,
        input='call:get_weather {"city": "Oslo", "unit": "celsius"}',
        tools=[WEATHER, TIME],  # type: ignore[list-item]
        tool_choice=_allowed("auto", {"type": "function", "name": "get_weather"}),  # type: ignore[arg-type]
    )
    call = response.output[-1]
    assert call.type == "function_call" and call.name == "get_weather"


async def test_a_tool_left_out_is_not_called(server: Server) -> None:
    # The scripted model calls get_weather when the prompt declares it: left out of
    # the allowed list, it is not shown, so the model answers instead.
    response = await server.client.responses.create(
        model=MODEL,
        input='call:get_weather {"city": "Oslo", "unit": "celsius"}',
        tools=[WEATHER, TIME],  # type: ignore[list-item]
        tool_choice=_allowed("auto", {"type": "function", "name": "get_time"}),  # type: ignore[arg-type]
    )
    assert [item.type for item in response.output] == ["reasoning", "message"]


async def test_a_namespace_function_can_be_listed(server: Server) -> None:
    response = await server.client.responses.create(
        model=MODEL,
        input="go",
        tools=[AGENTS, WEATHER],  # type: ignore[list-item]
        tool_choice=_allowed(  # type: ignore[arg-type]
            "required", {"type": "function", "namespace": "multi_agent_v1", "name": "wait"}
        ),
    )
    call = response.output[-1]
    assert call.type == "function_call"
    assert (call.namespace, call.name) == ("multi_agent_v1", "wait")


async def test_an_entry_naming_no_tool_is_400(server: Server) -> None:
    body = {
        "model": MODEL,
        "input": "hi",
        "tools": [WEATHER],
        "tool_choice": _allowed(
            "auto", {"type": "function", "name": "get_weather"}, {"type": "function", "name": "x"}
        ),
    }
    response = await server.http.post("/v1/responses", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "tool_choice.tools[1]"
