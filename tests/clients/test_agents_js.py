"""The JS Agents SDK (``@openai/agents``, its Responses model).

``tests/clients/js/agents.mjs`` runs one scenario per node process against the
test's server and prints what the SDK returned. Its packages come from
``tests/clients/js/package-lock.json`` (the ``node`` fixture runs ``npm ci``).
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import trio

from tests.clients.test_vercel_ai import node  # noqa: F401  (the shared fixture)
from tests.support import MODEL, Server

SCRIPT = pathlib.Path(__file__).parent / "js" / "agents.mjs"


async def _scenario(node: str, server: Server, name: str) -> dict[str, Any]:  # noqa: F811
    with trio.fail_after(60):
        done = await trio.run_process(
            [node, str(SCRIPT), server.base_url, MODEL, name],
            cwd=SCRIPT.parent,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    stderr = done.stderr.decode(errors="replace")
    assert done.returncode == 0, f"the Agents SDK failed ({name}):\n{stderr}"
    result: dict[str, Any] = json.loads(done.stdout)
    return result


async def test_run(node: str, server: Server) -> None:  # noqa: F811
    result = await _scenario(node, server, "run")
    assert result["output"] == "You said: hello"
    stored = await server.client.responses.retrieve(result["responseId"])
    assert stored.output_text == "You said: hello"


async def test_stream(node: str, server: Server) -> None:  # noqa: F811
    result = await _scenario(node, server, "stream")
    assert len(result["chunks"]) > 1
    assert "".join(result["chunks"]) == result["output"] == "You said: hello"


async def test_function_tool(node: str, server: Server) -> None:  # noqa: F811
    result = await _scenario(node, server, "tools")
    assert result["toolOutputs"] == ["sunny in Paris"]
    assert result["output"] == "Tool result: sunny in Paris"


async def test_structured_output(node: str, server: Server) -> None:  # noqa: F811
    result = await _scenario(node, server, "structured")
    assert result["output"] == {"name": "Paris", "population": 2100000}


async def test_multi_turn_with_previous_response_id(node: str, server: Server) -> None:  # noqa: F811
    result = await _scenario(node, server, "multi-turn")
    assert result["first"] == "You said: first"
    assert result["output"] == "You said: second"


async def test_reasoning_effort_minimal(node: str, server: Server) -> None:  # noqa: F811
    result = await _scenario(node, server, "reasoning-minimal")
    stored = await server.client.responses.retrieve(result["responseId"])
    assert stored.output_text == "You said: hello"
    assert stored.reasoning is not None
    assert stored.reasoning.effort == "low"
