"""The JS Agents SDK (``@openai/agents``, its Responses model).

``tests/clients/js/agents.mjs`` runs one scenario per node process against the
test's server and prints what the SDK returned. Its packages come from
``tests/clients/js/package-lock.json``; node and the packages: `tests.clients.node`.
"""

from __future__ import annotations

from typing import Any

from tests.clients.node import run_scenario
from tests.support import Server


async def _scenario(node: str, server: Server, name: str) -> dict[str, Any]:
    return await run_scenario(node, "agents.mjs", server, name, sdk="Agents SDK")


async def test_run(node: str, server: Server) -> None:
    result = await _scenario(node, server, "run")
    assert result["output"] == "You said: hello"
    stored = await server.client.responses.retrieve(result["responseId"])
    assert stored.output_text == "You said: hello"


async def test_stream(node: str, server: Server) -> None:
    result = await _scenario(node, server, "stream")
    assert len(result["chunks"]) > 1
    assert "".join(result["chunks"]) == result["output"] == "You said: hello"


async def test_function_tool(node: str, server: Server) -> None:
    result = await _scenario(node, server, "tools")
    # Two calls in one response, both run by the SDK.
    assert sorted(result["toolOutputs"]) == ["sunny in Oslo", "sunny in Paris"]
    assert result["output"] == "Tool result: sunny in Oslo"


async def test_structured_output(node: str, server: Server) -> None:
    result = await _scenario(node, server, "structured")
    assert result["output"] == {"name": "Paris", "population": 2100000}


async def test_multi_turn_with_previous_response_id(node: str, server: Server) -> None:
    result = await _scenario(node, server, "multi-turn")
    assert result["first"] == "You said: first"
    assert result["output"] == "You said: second"


async def test_reasoning_effort_minimal(node: str, server: Server) -> None:
    result = await _scenario(node, server, "reasoning-minimal")
    stored = await server.client.responses.retrieve(result["responseId"])
    assert stored.output_text == "You said: hello"
    assert stored.reasoning is not None
    assert stored.reasoning.effort == "low"
