"""Per-request MCP servers (server_url), configured ones (label only), approvals."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from tests.conftest import StartServer
from tests.support import MODEL, Server, check_stream, read_sse
from tests.tools.servers import RunningMcp


@pytest.fixture
async def server(start_server: StartServer) -> Server:
    return await start_server(mcp_allow_hosts=("127.0.0.1",))


def _tool(mcp: RunningMcp, **extra: Any) -> dict[str, Any]:
    return {"type": "mcp", "server_label": "echo", "server_url": mcp.url, **extra}


async def test_list_call_answer(server: Server, mcp_echo: RunningMcp) -> None:
    status, events, _ = await read_sse(
        server.http,
        "POST",
        "/v1/responses",
        json={
            "model": MODEL,
            "input": 'mcp:echo.echo {"text": "hi there"}',
            "tools": [_tool(mcp_echo, require_approval="never")],
            "stream": True,
        },
    )
    assert status == 200
    payloads = [event.json() for event in events[:-1]]
    check_stream(payloads)
    types = [p["type"] for p in payloads]
    assert types.index("response.mcp_list_tools.in_progress") < types.index(
        "response.mcp_list_tools.completed"
    )
    for expected in (
        "response.mcp_call.in_progress",
        "response.mcp_call_arguments.delta",
        "response.mcp_call_arguments.done",
        "response.mcp_call.completed",
    ):
        assert expected in types
    final = payloads[-1]["response"]
    kinds = [item["type"] for item in final["output"]]
    assert kinds[0] == "mcp_list_tools" and "mcp_call" in kinds
    listing = final["output"][0]
    assert {tool["name"] for tool in listing["tools"]} == {"echo", "add", "slow", "stubborn"}
    call = next(item for item in final["output"] if item["type"] == "mcp_call")
    assert call["server_label"] == "echo" and call["name"] == "echo"
    assert json.loads(call["arguments"]) == {"text": "hi there"}
    assert call["output"] == "echo: hi there" and call["status"] == "completed"
    assert final["output"][-1]["content"][0]["text"] == "Tool result: echo: hi there"
    # The session was opened for this response and closed with it.
    with trio.fail_after(10):
        await server.service.wait_idle()
    assert mcp_echo.open_sessions == 0
    # Headers (credentials) are never echoed.
    assert "headers" not in final["tools"][0]


async def test_allowed_tools_hide_the_others(server: Server, mcp_echo: RunningMcp) -> None:
    response = await server.client.responses.create(
        model=MODEL,
        input='mcp:echo.add {"a": 1, "b": 2}',
        tools=[_tool(mcp_echo, allowed_tools=["echo"], require_approval="never")],  # type: ignore[list-item]
    )
    listing = response.output[0]
    assert listing.type == "mcp_list_tools"
    assert [tool.name for tool in listing.tools] == ["echo"]
    # `add` is not in the namespace the model sees, so the scripted model does not call it.
    assert not any(item.type == "mcp_call" for item in response.output)


async def test_headers_reach_the_server_and_are_not_stored(
    server: Server, mcp_echo: RunningMcp
) -> None:
    response = await server.client.responses.create(
        model=MODEL,
        input='mcp:echo.echo {"text": "x"}',
        tools=[  # type: ignore[list-item]
            _tool(mcp_echo, require_approval="never", headers={"Authorization": "Bearer s3cret"})
        ],
    )
    assert response.output_text == "Tool result: echo: x"
    stored = await server.http.get(f"/v1/responses/{response.id}")
    assert "s3cret" not in stored.text


async def test_disallowed_host_is_400(start_server: StartServer, mcp_echo: RunningMcp) -> None:
    closed = await start_server()
    refused = await closed.http.post(
        "/v1/responses",
        json={"model": MODEL, "input": "x", "tools": [_tool(mcp_echo)]},
    )
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["param"] == "tools[0].server_url" and "--mcp-allow-host" in error["message"]

    other = await start_server(mcp_allow_hosts=("127.0.0.1",))
    elsewhere = await other.http.post(
        "/v1/responses",
        json={
            "model": MODEL,
            "input": "x",
            "tools": [{"type": "mcp", "server_label": "x", "server_url": "http://127.0.0.2:9/mcp"}],
        },
    )
    assert elsewhere.status_code == 400
    assert "'127.0.0.2' is not allowed" in elsewhere.json()["error"]["message"]


async def test_approval_flow(server: Server, mcp_echo: RunningMcp) -> None:
    tools = [_tool(mcp_echo)]  # require_approval defaults to "always"
    first = await server.client.responses.create(
        model=MODEL,
        input='mcp:echo.echo {"text": "please"}',
        tools=tools,  # type: ignore[arg-type]
    )
    assert first.status == "completed"
    request = first.output[-1]
    assert request.type == "mcp_approval_request"
    assert request.server_label == "echo" and request.name == "echo"
    assert json.loads(request.arguments) == {"text": "please"}
    assert not any(item.type == "mcp_call" for item in first.output)

    approved = await server.client.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        input=[
            {"type": "mcp_approval_response", "approval_request_id": request.id, "approve": True}
        ],
        tools=tools,  # type: ignore[arg-type]
    )
    assert approved.status == "completed"
    kinds = [item.type for item in approved.output]
    assert "mcp_list_tools" not in kinds  # already listed in the conversation
    call = next(item for item in approved.output if item.type == "mcp_call")
    assert call.approval_request_id == request.id
    assert call.output == "echo: please"
    assert approved.output_text == "Tool result: echo: please"

    denied = await server.client.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        input=[
            {"type": "mcp_approval_response", "approval_request_id": request.id, "approve": False}
        ],
        tools=tools,  # type: ignore[arg-type]
    )
    assert not any(item.type == "mcp_call" for item in denied.output)
    assert "declined" in denied.output_text


async def test_approval_of_an_unknown_request_is_400(server: Server, mcp_echo: RunningMcp) -> None:
    response = await server.http.post(
        "/v1/responses",
        json={
            "model": MODEL,
            "input": [
                {"type": "mcp_approval_response", "approval_request_id": "mcpr_x", "approve": True}
            ],
            "tools": [_tool(mcp_echo)],
        },
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "input[0].approval_request_id"


async def test_per_tool_approval_policy(server: Server, mcp_echo: RunningMcp) -> None:
    policy = {"never": {"tool_names": ["echo"]}}
    free = await server.client.responses.create(
        model=MODEL,
        input='mcp:echo.echo {"text": "free"}',
        tools=[_tool(mcp_echo, require_approval=policy)],  # type: ignore[list-item]
    )
    assert free.output_text == "Tool result: echo: free"
    guarded = await server.client.responses.create(
        model=MODEL,
        input='mcp:echo.add {"a": 1, "b": 1}',
        tools=[_tool(mcp_echo, require_approval=policy)],  # type: ignore[list-item]
    )
    assert guarded.output[-1].type == "mcp_approval_request"


async def test_configured_server_by_label(start_server: StartServer, mcp_echo: RunningMcp) -> None:
    server = await start_server(tool_servers=(f"echo={mcp_echo.url}",))
    response = await server.client.responses.create(
        model=MODEL,
        input='mcp:echo.add {"a": 20, "b": 22}',
        tools=[{"type": "mcp", "server_label": "echo", "require_approval": "never"}],  # type: ignore[list-item]
    )
    assert response.output[0].type == "mcp_list_tools"
    assert response.output_text == "Tool result: 42"
    # One pooled session, kept open for every request.
    assert mcp_echo.open_sessions == 1
    unknown = await server.http.post(
        "/v1/responses",
        json={"model": MODEL, "input": "x", "tools": [{"type": "mcp", "server_label": "nope"}]},
    )
    assert unknown.status_code == 400
    assert "'echo'" in unknown.json()["error"]["message"]


async def test_a_tool_result_with_a_lone_surrogate_is_repaired(
    server: Server, mcp_echo: RunningMcp
) -> None:
    # The model's arguments escape a lone surrogate; the server echoes it back.
    response = await server.client.responses.create(
        model=MODEL,
        input='mcp:echo.echo {"text": "a\\ud800b"}',
        tools=[_tool(mcp_echo, require_approval="never")],  # type: ignore[list-item]
    )
    assert response.status == "completed"
    call = next(item for item in response.output if item.type == "mcp_call")
    assert call.output == "echo: a\ufffdb"
    stored = await server.client.responses.retrieve(response.id)
    assert stored.status == "completed"


async def test_deeply_nested_arguments_are_a_tool_error(
    server: Server, mcp_echo: RunningMcp
) -> None:
    nested = "[" * 600 + "]" * 600
    response = await server.client.responses.create(
        model=MODEL,
        input=f'mcp:echo.echo {{"text": {nested}}}',
        tools=[_tool(mcp_echo, require_approval="never")],  # type: ignore[list-item]
    )
    assert response.status == "completed"
    call = next(item for item in response.output if item.type == "mcp_call")
    assert call.status == "failed"
    assert call.error is not None and "not valid JSON" in str(call.error)
