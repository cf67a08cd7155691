"""code_interpreter through HTTP, run in the server's containers (real bubblewrap)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import StartServer
from tests.support import MODEL, RawSSEClient, Server, check_stream, parse_sse, read_sse

CODE = "Compute it.\n```python\nprint(64548*15151)\n```"
TOOLS = [{"type": "code_interpreter", "container": {"type": "auto"}}]


@pytest.fixture
async def server(start_server: StartServer) -> Server:
    return await start_server(
        code_interpreter=True, python_cpu_s=2, python_wall_s=10, python_memory_mb=256
    )


async def test_streamed_code_interpreter_call(server: Server) -> None:
    status, events, _ = await read_sse(
        server.http,
        "POST",
        "/v1/responses",
        json={"model": MODEL, "input": CODE, "tools": TOOLS, "stream": True},
    )
    assert status == 200
    payloads = [event.json() for event in events[:-1]]
    check_stream(payloads)
    call_events = [
        p["type"]
        for p in payloads
        if p.get("item", {}).get("type") == "code_interpreter_call"
        or p["type"].startswith("response.code_interpreter_call")
    ]
    assert call_events[0] == "response.output_item.added"
    assert call_events[1] == "response.code_interpreter_call.in_progress"
    deltas = [t for t in call_events if t == "response.code_interpreter_call_code.delta"]
    assert len(deltas) >= 1
    assert call_events[-4:] == [
        "response.code_interpreter_call_code.done",
        "response.code_interpreter_call.interpreting",
        "response.code_interpreter_call.completed",
        "response.output_item.done",
    ]
    final = payloads[-1]["response"]
    assert final["status"] == "completed"
    call = next(item for item in final["output"] if item["type"] == "code_interpreter_call")
    assert call["code"] == "print(64548*15151)\n"
    assert call["outputs"] == [{"type": "logs", "logs": "977966748\n"}]
    assert call["status"] == "completed"
    answer = final["output"][-1]["content"][0]["text"]
    assert answer.startswith("Tool result: 977966748")
    # Two generation turns: the usage counts both prompts.
    assert final["usage"]["input_tokens"] > 2 * 100


async def test_non_streamed_and_follow_up(server: Server) -> None:
    response = await server.client.responses.create(model=MODEL, input=CODE, tools=TOOLS)  # type: ignore[arg-type]
    assert response.status == "completed"
    assert response.output_text.startswith("Tool result: 977966748")
    call = next(item for item in response.output if item.type == "code_interpreter_call")
    assert call.outputs is not None and call.outputs[0].logs == "977966748\n"  # type: ignore[union-attr]
    follow_up = await server.client.responses.create(
        model=MODEL,
        input="thanks",
        previous_response_id=response.id,
        tools=TOOLS,  # type: ignore[arg-type]
    )
    assert follow_up.output_text == "You said: thanks"


async def test_background_stream_is_resumable(server: Server) -> None:
    body = {"model": MODEL, "input": CODE, "tools": TOOLS, "background": True, "stream": True}
    first = await RawSSEClient.open(server, "POST", "/v1/responses", body)
    whole = parse_sse(await first.read_all())
    response_id = whole[0].json()["response"]["id"]
    again = await RawSSEClient.open(
        server, "GET", f"/v1/responses/{response_id}?stream=true&starting_after=4"
    )
    replay = [e.json() for e in parse_sse(await again.read_all())[:-1]]
    assert replay == [e.json() for e in whole[5:-1]]
    assert any(e["type"] == "response.code_interpreter_call.completed" for e in replay)


@pytest.mark.parametrize(
    ("code", "problem"),
    [
        ("while True: pass", "CPU time limit of 2 s exceeded"),
        ("x = bytearray(10 * 1024**3)", "memory limit of 256 MiB exceeded"),
        ("raise SystemExit(3)", "SystemExit: 3"),
    ],
)
async def test_runaway_code_is_a_tool_error_and_the_server_survives(
    server: Server, code: str, problem: str
) -> None:
    response = await server.client.responses.create(
        model=MODEL,
        input=f"```python\n{code}\n```",
        tools=TOOLS,  # type: ignore[arg-type]
    )
    assert response.status == "completed"
    call = next(item for item in response.output if item.type == "code_interpreter_call")
    assert call.status == "failed"
    logs = call.outputs[0].logs  # type: ignore[index, union-attr]
    assert problem in logs
    assert problem in response.output_text  # the model read the error
    healthy = await server.client.responses.create(
        model=MODEL,
        input="```python\nprint('alive')\n```",
        tools=TOOLS,  # type: ignore[arg-type]
    )
    assert healthy.output_text == "Tool result: alive\n"
    health = (await server.http.get("/health")).json()
    assert "python" not in health["tool_servers"]  # the server runs the code itself
    assert health["sandbox"]["mode"] == "bwrap" and health["containers"]["started"] >= 2


async def test_tool_choice_none_hides_the_tool(server: Server) -> None:
    response = await server.client.responses.create(
        model=MODEL,
        input=CODE,
        tools=TOOLS,
        tool_choice="none",  # type: ignore[arg-type]
    )
    assert [item.type for item in response.output] == ["reasoning", "message"]


async def test_max_tool_calls_makes_the_response_incomplete(server: Server) -> None:
    response = await server.http.post(
        "/v1/responses",
        json={"model": MODEL, "input": CODE, "tools": TOOLS, "max_tool_calls": 0},
    )
    body = response.json()
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_tool_calls"}
    call = next(item for item in body["output"] if item["type"] == "code_interpreter_call")
    assert call["status"] == "incomplete" and call["outputs"] is None


async def test_code_interpreter_without_a_python_server_is_400(start_server: StartServer) -> None:
    plain = await start_server()
    response = await plain.http.post(
        "/v1/responses", json={"model": MODEL, "input": CODE, "tools": TOOLS}
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "tools[0]" and "--code-interpreter" in error["message"]
    assert json.dumps(error)
