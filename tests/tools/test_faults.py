"""Faults: a server dying mid-call, a hanging tool. The response always ends properly."""

from __future__ import annotations

import pytest
import trio

from tests.conftest import StartServer
from tests.support import MODEL, check_stream, read_sse
from tests.tools.servers import RunningMcp, stdio_address

NO_APPROVAL = {"require_approval": "never"}


async def test_mcp_server_killed_mid_call(start_server: StartServer) -> None:
    server = await start_server(tool_servers=(f"faulty={stdio_address()}",))
    tools = [{"type": "mcp", "server_label": "faulty", **NO_APPROVAL}]
    status, events, _ = await read_sse(
        server.http,
        "POST",
        "/v1/responses",
        json={"model": MODEL, "input": "mcp:faulty.die {}", "tools": tools, "stream": True},
    )
    assert status == 200
    payloads = [event.json() for event in events[:-1]]
    check_stream(payloads)
    assert "response.mcp_call.failed" in [p["type"] for p in payloads]
    final = payloads[-1]["response"]
    assert final["status"] == "completed"
    call = next(item for item in final["output"] if item["type"] == "mcp_call")
    assert call["status"] == "failed"
    assert call["error"]["type"] == "mcp_protocol_error" and call["error"]["code"] == -32000
    assert "Connection closed" in call["error"]["message"]
    assert "Connection closed" in final["output"][-1]["content"][0]["text"]

    # The pool notices and reconnects; the next call works.
    pooled = server.service.pool.get("faulty")
    assert pooled is not None
    with trio.fail_after(10):
        await pooled.wait_ready()
    assert pooled.connections == 2
    again = await server.client.responses.create(
        model=MODEL,
        input='mcp:faulty.echo {"text": "back"}',
        tools=tools,  # type: ignore[arg-type]
    )
    assert again.output_text == "Tool result: echo: back"


async def test_container_process_killed_mid_call(start_server: StartServer) -> None:
    # Unsandboxed, the container's process is a plain child: it kills itself in the
    # middle of a call; the call fails, the server goes on, the next call of the same
    # container starts a new process (and says its variables are gone).
    server = await start_server(
        code_interpreter=True, python_sandbox="none", python_cpu_s=2, python_wall_s=10
    )
    tools = [{"type": "code_interpreter", "container": {"type": "auto"}}]
    kill = "```python\nimport os, signal\nx = 1\nos.kill(os.getpid(), signal.SIGKILL)\n```"
    response = await server.client.responses.create(model=MODEL, input=kill, tools=tools)  # type: ignore[arg-type]
    assert response.status == "completed"
    call = next(item for item in response.output if item.type == "code_interpreter_call")
    assert call.status == "failed"
    assert "killed by signal SIGKILL" in call.outputs[0].logs  # type: ignore[index, union-attr]
    fine = await server.client.responses.create(
        model=MODEL,
        input="```python\nprint(6*7, 'x' in globals())\n```",
        tools=tools,  # type: ignore[arg-type]
        previous_response_id=response.id,
    )
    again = next(item for item in fine.output if item.type == "code_interpreter_call")
    assert again.container_id == call.container_id
    assert again.outputs[0].logs.endswith("42 False\n")  # type: ignore[index, union-attr]
    assert "started again" in again.outputs[0].logs  # type: ignore[index, union-attr]


@pytest.mark.parametrize("background", [False, True])
async def test_hanging_tool_times_out(
    start_server: StartServer, mcp_echo: RunningMcp, background: bool
) -> None:
    server = await start_server(mcp_allow_hosts=("127.0.0.1",), tool_timeout_s=0.5)
    tools = [{"type": "mcp", "server_label": "echo", "server_url": mcp_echo.url, **NO_APPROVAL}]
    created = await server.client.responses.create(
        model=MODEL,
        input='mcp:echo.slow {"seconds": 60}',
        tools=tools,  # type: ignore[arg-type]
        background=background,
    )
    with trio.fail_after(5):
        response = await server.service.wait(created.id)
    assert response["status"] == "completed"
    call = next(item for item in response["output"] if item["type"] == "mcp_call")
    assert call["status"] == "failed" and call["error"]["code"] == -32001
    assert "timed out after 0.5 s" in call["error"]["message"]
    with trio.fail_after(10):
        await server.service.wait_idle()
    assert mcp_echo.open_sessions == 0
