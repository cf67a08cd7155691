"""Cancelling responses in the middle of tool work, many times over.

After each storm: no error in the logs (no "cancel scope" RuntimeError, no
TrioInternalError), the MCP server has no open session once the job has ended,
and no job task is left. Time bounds are generous (`SETTLE_S`): what they tell
apart is a cancel that waits for the tool (30 s) from one that does not.
"""

from __future__ import annotations

import logging
import time
import traceback
from typing import Any

import pytest
import trio

from tests.conftest import StartServer
from tests.support import MODEL, JobSpy, RawSSEClient, Server
from tests.tools.servers import RunningMcp

REPETITIONS = 100
SETTLE_S = 10.0
"""Generous: a loaded machine takes a while; a leak or a wait for the tool takes for ever."""


@pytest.fixture
async def server(start_server: StartServer) -> Server:
    return await start_server(mcp_allow_hosts=("127.0.0.1",))


def _slow_call(url: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "input": 'mcp:echo.slow {"seconds": 30}',
        "tools": [
            {"type": "mcp", "server_label": "echo", "server_url": url, "require_approval": "never"}
        ],
        **extra,
    }


async def _settled(server: Server, mcp: RunningMcp | None = None) -> None:
    with trio.fail_after(SETTLE_S):
        await server.service.wait_idle()
    stats = server.service.statistics()
    assert stats.running_jobs == 0 and stats.job_tasks == 0 and stats.subscribers == 0
    if mcp is not None:
        assert mcp.open_sessions == 0


def _assert_clean_logs(caplog: pytest.LogCaptureFixture) -> None:
    text = caplog.text
    assert "cancel scope" not in text and "TrioInternalError" not in text
    for record in caplog.records:
        if record.levelno < logging.ERROR:
            continue
        # The test MCP server (mcp SDK on hypercorn) logs client hang-ups as errors;
        # what must stay clean is our server.
        assert not record.name.startswith("trio_responses"), record.getMessage()
        trace = "".join(traceback.format_exception(*record.exc_info)) if record.exc_info else ""
        assert "trio_responses" not in trace, trace


@pytest.mark.slow
async def test_client_disconnect_during_a_tool_call(
    server: Server, mcp_echo: RunningMcp, caplog: pytest.LogCaptureFixture
) -> None:
    for _ in range(REPETITIONS):
        client = await RawSSEClient.open(
            server, "POST", "/v1/responses", _slow_call(mcp_echo.url, stream=True)
        )
        await client.read_until("response.mcp_call_arguments.done")
        await client.aclose()
        await _settled(server, mcp_echo)
    _assert_clean_logs(caplog)


@pytest.mark.slow
async def test_cancel_during_a_tool_call(
    server: Server,
    mcp_echo: RunningMcp,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for _ in range(REPETITIONS):
        created = await server.client.responses.create(**_slow_call(mcp_echo.url, background=True))
        with await server.service.subscribe(created.id) as subscription:
            async for event in subscription:
                if event["type"] == "response.mcp_call_arguments.done":
                    break
        started = time.monotonic()
        cancelled = await server.client.responses.cancel(created.id)
        assert time.monotonic() - started < SETTLE_S  # the tool would take 30 s
        assert cancelled.status == "cancelled"
        await _settled(server, mcp_echo)
    _assert_clean_logs(caplog)


@pytest.mark.slow
async def test_cancel_during_session_start(
    server: Server, nursery: trio.Nursery, caplog: pytest.LogCaptureFixture
) -> None:
    # Accepts TCP connections and never answers: every session is stuck starting.
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    silent = f"http://127.0.0.1:{listener.socket.getsockname()[1]}/mcp"

    async def hold(stream: trio.SocketStream) -> None:
        with trio.CancelScope():
            await trio.sleep_forever()

    nursery.start_soon(trio.serve_listeners, hold, [listener])
    for _ in range(REPETITIONS):
        created = await server.client.responses.create(**_slow_call(silent, background=True))
        with await server.service.subscribe(created.id) as subscription:
            async for event in subscription:
                if event["type"] == "response.mcp_list_tools.in_progress":
                    break
        await server.client.responses.cancel(created.id)
        await _settled(server)
        final = await server.client.responses.retrieve(created.id)
        assert final.status == "cancelled"
    _assert_clean_logs(caplog)


async def test_cancel_returns_at_once_when_the_tool_cleanup_hangs(
    server: Server, mcp_echo: RunningMcp, caplog: pytest.LogCaptureFixture
) -> None:
    body = _slow_call(mcp_echo.url, background=True)
    # The tool ignores cancellation for 8 s; the cancel and its readers must not wait.
    body["input"] = 'mcp:echo.stubborn {"seconds": 8}'
    created = await server.client.responses.create(**body)
    reader = await RawSSEClient.open(server, "GET", f"/v1/responses/{created.id}?stream=true")
    await reader.read_until("response.mcp_call_arguments.done")
    started = time.monotonic()
    cancelled = await server.client.responses.cancel(created.id)
    assert cancelled.status == "cancelled"
    with trio.fail_after(6):
        events = await reader.read_all()
    assert time.monotonic() - started < 6
    assert b'"status":"cancelled"' in events
    _assert_clean_logs(caplog)


async def test_declared_but_unused_code_interpreter_opens_no_sessions(
    start_server: StartServer, mcp_echo: RunningMcp, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The counting server stands in for the python server: it counts MCP sessions.
    server = await start_server(tool_servers=(f"python={mcp_echo.url}",))
    spy = JobSpy(server.service, monkeypatch)
    assert mcp_echo.open_sessions == 1  # the pool's one connection
    tools = [{"type": "code_interpreter", "container": {"type": "auto"}}]

    async def one(index: int) -> None:
        response = await server.client.responses.create(
            model=MODEL,
            input=f"no code here {index}",
            tools=tools,  # type: ignore[arg-type]
        )
        assert response.output_text == f"You said: no code here {index}"

    async with trio.open_nursery() as nursery:
        for index in range(100):
            nursery.start_soon(one, index)
    assert len(spy.jobs) == 100
    assert mcp_echo.open_sessions == 1
    pooled = server.service.pool.get("python")
    assert pooled is not None and pooled.connections == 1
