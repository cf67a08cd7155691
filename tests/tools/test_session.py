"""The MCP session owner: one task enters and exits; callers only send requests."""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any

import pytest
import trio

from tests.tools.servers import RunningMcp, stdio_address
from trio_responses.tools.session import McpSession, ToolError, Transport
from trio_responses.tools.transport import connect_to


async def _open(nursery: trio.Nursery, address: str, **options: float) -> McpSession:
    session = McpSession("test", connect_to(address), **options)
    await nursery.start(session.run)
    return session


async def test_list_and_call(nursery: trio.Nursery, mcp_echo: RunningMcp) -> None:
    session = await _open(nursery, mcp_echo.url)
    tools = await session.list_tools()
    assert {tool.name for tool in tools} == {"echo", "add", "slow", "stubborn"}
    echo = next(tool for tool in tools if tool.name == "echo")
    assert echo.description == "Say the text back." and "text" in echo.input_schema["properties"]
    result = await session.call_tool("add", {"a": 2, "b": 40})
    assert result.text == "42" and not result.is_error
    bad = await session.call_tool("add", {"a": "x"})
    assert bad.is_error
    assert session.state == "ready" and mcp_echo.open_sessions == 1


async def test_a_cancelled_caller_cancels_only_its_call(
    nursery: trio.Nursery, mcp_echo: RunningMcp
) -> None:
    session = await _open(nursery, mcp_echo.url)
    results: list[str] = []

    async def patient() -> None:
        results.append((await session.call_tool("slow", {"seconds": 0.3})).text)

    async with trio.open_nursery() as callers:
        callers.start_soon(patient)
        with trio.move_on_after(0.1) as impatient:
            await session.call_tool("slow", {"seconds": 30})
        assert impatient.cancelled_caught
    assert results == ["slept"]
    assert (await session.call_tool("echo", {"text": "still here"})).text == "echo: still here"
    assert session.calls_in_flight == 0


async def test_call_timeout_is_a_tool_error(nursery: trio.Nursery, mcp_echo: RunningMcp) -> None:
    session = await _open(nursery, mcp_echo.url)
    with pytest.raises(ToolError, match=r"'slow' on MCP server 'test' timed out after 0.2 s"):
        await session.call_tool("slow", {"seconds": 30}, timeout_s=0.2)
    assert (await session.call_tool("echo", {"text": "ok"})).text == "echo: ok"


async def test_close_says_goodbye(nursery: trio.Nursery, mcp_echo: RunningMcp) -> None:
    session = await _open(nursery, mcp_echo.url)
    await session.list_tools()
    assert mcp_echo.open_sessions == 1
    session.close()
    with trio.fail_after(5):
        await session.wait_ended()
    assert session.state == "closed"
    assert mcp_echo.open_sessions == 0
    with pytest.raises(ToolError, match=r"not connected|closed"):
        await session.call_tool("echo", {"text": "late"})


async def test_close_while_connecting(nursery: trio.Nursery) -> None:
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    port = listener.socket.getsockname()[1]
    # Accepts connections and never answers: the session cannot start.
    session = await _open(nursery, f"http://127.0.0.1:{port}/mcp")
    await trio.sleep(0.05)
    assert session.state == "connecting"
    session.close()
    with trio.fail_after(10):
        await session.wait_ended()
    assert session.state == "closed"
    await listener.aclose()


async def test_connect_timeout(nursery: trio.Nursery) -> None:
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    port = listener.socket.getsockname()[1]
    session = await _open(nursery, f"http://127.0.0.1:{port}/mcp", connect_timeout_s=0.3)
    with trio.fail_after(10), pytest.raises(ToolError, match=r"within 0\.3 s"):
        await session.list_tools()
    assert session.state == "failed"
    await listener.aclose()


async def test_server_dying_mid_call_fails_the_call_and_the_session(
    nursery: trio.Nursery,
) -> None:
    session = await _open(nursery, stdio_address())
    assert (await session.call_tool("echo", {"text": "a"})).text == "echo: a"
    with trio.fail_after(5), pytest.raises(ToolError, match="Connection closed"):
        await session.call_tool("die", {})
    with trio.fail_after(5):
        await session.wait_ended()
    assert session.state == "failed"
    with pytest.raises(ToolError):
        await session.call_tool("echo", {"text": "b"})


async def test_bundled_python_server_over_http(nursery: trio.Nursery) -> None:
    import os
    import re
    import subprocess
    import sys

    process = await trio.lowlevel.open_process(
        [
            sys.executable,
            "-m",
            "trio_responses",
            "tool-server",
            "python",
            "--port",
            "0",
            "--cpu-seconds",
            "2",
        ],
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert process.stderr is not None
    try:
        log = b""
        with trio.fail_after(30):
            while not (match := re.search(rb"python tool server: (\S+)", log)):
                chunk = await process.stderr.receive_some()
                assert chunk, log.decode()
                log += chunk
        session = await _open(nursery, match.group(1).decode())
        (tool,) = await session.list_tools()
        assert tool.name == "python" and "code" in tool.input_schema["properties"]
        result = await session.call_tool(
            "python", {"code": "import sys; print(sys.flags.isolated)"}
        )
        assert result.text == "1\n" and not result.is_error
        failed = await session.call_tool("python", {"code": "1/0"})
        assert failed.is_error and "ZeroDivisionError" in failed.text
        assert "exit status 1" in failed.text
        session.close()
    finally:
        process.kill()
        await process.wait()


class _FailsWhenCancelled:
    """A transport with a request in flight that fails when its task is cancelled, as
    a streamable-HTTP client's does when the server goes away during a shutdown: the
    cancellation and the failure come out together, in one exception group."""

    def __init__(self, inner: Transport) -> None:
        self._inner = inner
        self._stack = AsyncExitStack()

    async def __aenter__(self) -> tuple[Any, Any]:
        async with AsyncExitStack() as stack:
            # The request's nursery outside the streams, as in the HTTP client.
            nursery = await stack.enter_async_context(trio.open_nursery())
            nursery.start_soon(self._request_in_flight)
            streams = await stack.enter_async_context(self._inner)
            self._stack = stack.pop_all()
        return streams

    async def __aexit__(self, *exc: Any) -> bool:
        return await self._stack.__aexit__(*exc)

    @staticmethod
    async def _request_in_flight() -> None:
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            raise OSError("all attempts to connect to the MCP server failed") from None


async def test_a_transport_failing_as_its_owner_is_cancelled_stays_in_the_session(
    mcp_echo: RunningMcp,
) -> None:
    session = McpSession("test", lambda: _FailsWhenCancelled(connect_to(mcp_echo.url)()))
    with trio.CancelScope() as owner:
        async with trio.open_nursery() as nursery:
            await nursery.start(session.run)
            await session.list_tools()
            owner.cancel()  # the owner goes (a shutdown) while the transport fails
    assert owner.cancelled_caught  # nothing but the cancellation left the session
    assert session.state == "failed"
    assert session.error is not None and "all attempts to connect" in session.error
