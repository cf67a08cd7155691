"""The MCP boundary: sessions that fail under a call, and which hosts requests may reach.

- A call in flight (or just sent) when its session fails or closes ends as a
  tool error the model reads; the response goes on.
- ``--mcp-allow-host`` takes names, addresses and networks; a name is resolved
  once per connection and the connection goes to the address that was checked.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import hypercorn.trio
import pytest
import trio
from hypercorn.config import Config as HypercornConfig
from mcp.server.transport_security import TransportSecuritySettings

from tests.conftest import StartServer
from tests.support import MODEL, Server, check_stream, read_sse
from tests.tools.servers import RunningMcp, echo_server, serve_mcp
from trio_responses.tools.hosts import HostNotAllowed, allowed_hosts
from trio_responses.tools.session import McpSession, ToolError
from trio_responses.tools.transport import connect_to

NO_APPROVAL = {"require_approval": "never"}


def _output(response: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(item for item in response["output"] if item["type"] == kind)


# -- sessions that fail or close under a call ------------------------------------------------


@pytest.mark.parametrize("when", ["just before the call", "during the call"])
async def test_call_to_a_tool_server_that_died_is_a_failed_item(
    start_server: StartServer, nursery: trio.Nursery, when: str
) -> None:
    """Kill a ``--tool-server`` and call it at once: before the pool notices, and mid-call."""
    mcp_scope = trio.CancelScope()

    async def run_mcp(*, task_status: trio.TaskStatus[RunningMcp]) -> None:
        with mcp_scope:
            await serve_mcp(echo_server(), task_status=task_status)

    mcp: RunningMcp = await nursery.start(run_mcp)
    server = await start_server(tool_servers=(f"echo={mcp.url}",), tool_timeout_s=30)
    pooled = server.service.pool.get("echo")
    assert pooled is not None and pooled.state == "ready"

    async def kill_after(seconds: float) -> None:
        await trio.sleep(seconds)
        mcp_scope.cancel()

    if when == "just before the call":
        mcp_scope.cancel()
        await trio.lowlevel.checkpoint()  # let the MCP server go
    else:
        nursery.start_soon(kill_after, 0.5)
    tools = [{"type": "mcp", "server_label": "echo", **NO_APPROVAL}]
    with trio.fail_after(20):
        status, events, _ = await read_sse(
            server.http,
            "POST",
            "/v1/responses",
            json={
                "model": MODEL,
                "input": 'mcp:echo.slow {"seconds": 5}',
                "tools": tools,
                "stream": True,
            },
        )
    assert status == 200
    payloads = [event.json() for event in events[:-1]]
    check_stream(payloads)
    assert "response.mcp_call.failed" in [p["type"] for p in payloads]
    final = payloads[-1]["response"]
    assert final["status"] == "completed", final.get("error")
    call = _output(final, "mcp_call")
    assert call["status"] == "failed"
    assert call["error"]["type"] == "mcp_protocol_error"
    message = call["error"]["message"]
    assert "'echo'" in message
    # The model read the error and answered with it.
    assert final["output"][-1]["content"][0]["text"] == f"Tool result: {message}"
    with trio.fail_after(5):
        await server.service.wait_idle()
    assert server.service.statistics().job_tasks == 0


async def test_closing_a_session_fails_its_calls_in_flight(
    nursery: trio.Nursery, mcp_echo: RunningMcp
) -> None:
    session = McpSession("test", connect_to(mcp_echo.url), close_timeout_s=2)
    await nursery.start(session.run)
    await session.list_tools()
    outcome: list[BaseException] = []

    async def call() -> None:
        try:
            await session.call_tool("slow", {"seconds": 30})
        except ToolError as error:
            outcome.append(error)

    async with trio.open_nursery() as callers:
        callers.start_soon(call)
        with trio.fail_after(5):
            while not session.calls_in_flight:  # noqa: ASYNC110 (no event for it)
                await trio.sleep(0.01)
        session.close()
    assert len(outcome) == 1
    assert str(outcome[0]) == (
        "The call to 'slow' on MCP server 'test' did not finish: the connection was closed."
    )
    with trio.fail_after(5):
        await session.wait_ended()
    assert session.state == "closed"


# -- allowed hosts ---------------------------------------------------------------------------


def _tool(url: str) -> dict[str, Any]:
    return {"type": "mcp", "server_label": "echo", "server_url": url, **NO_APPROVAL}


async def _ask(server: Server, url: str, text: str = "hi") -> dict[str, Any]:
    """A create whose model calls ``echo.echo``; returns the finished response."""
    response = await server.http.post(
        "/v1/responses",
        json={
            "model": MODEL,
            "input": f'mcp:echo.echo {{"text": "{text}"}}',
            "tools": [_tool(url)],
        },
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


@pytest.mark.parametrize("pattern", ["127.0.0.1", "127.0.0.0/8", "127.0.0.1:{port}", "[127.0.0.1]"])
async def test_address_patterns_allow_their_addresses(
    start_server: StartServer, mcp_echo: RunningMcp, pattern: str
) -> None:
    port = mcp_echo.url.split(":")[2].split("/")[0]
    server = await start_server(mcp_allow_hosts=(pattern.format(port=port),))
    answer = await _ask(server, mcp_echo.url)
    assert answer["output"][-1]["content"][0]["text"] == "Tool result: echo: hi"


@pytest.mark.parametrize(
    ("pattern", "url"),
    [
        ("127.0.0.1", "http://127.0.0.2:{port}/mcp"),
        ("127.0.0.1/32", "http://127.0.0.2:{port}/mcp"),
        ("127.0.0.1:1", "http://127.0.0.1:{port}/mcp"),
        ("10.0.0.0/8", "http://127.0.0.1:{port}/mcp"),
        ("::1", "http://127.0.0.1:{port}/mcp"),
        ("127.0.0.1:1", "http://localhost:{port}/mcp"),  # no pattern could allow its port
    ],
)
async def test_other_hosts_are_refused_with_400(
    start_server: StartServer, mcp_echo: RunningMcp, pattern: str, url: str
) -> None:
    port = mcp_echo.url.split(":")[2].split("/")[0]
    server = await start_server(mcp_allow_hosts=(pattern,))
    response = await server.http.post(
        "/v1/responses",
        json={"model": MODEL, "input": "hi", "tools": [_tool(url.format(port=port))]},
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "tools[0].server_url" and error["code"]
    assert "--mcp-allow-host" in error["message"]
    assert mcp_echo.open_sessions == 0


async def test_ipv6_address_patterns(start_server: StartServer, nursery: trio.Nursery) -> None:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("this machine has no IPv6 loopback")
    mcp: RunningMcp = await nursery.start(
        partial(_serve_mcp, bind="[::1]:0", allowed_hosts=["[::1]:*"])
    )
    server = await start_server(mcp_allow_hosts=("::1",))
    answer = await _ask(server, mcp.url)
    assert answer["output"][-1]["content"][0]["text"] == "Tool result: echo: hi"
    refused = await start_server(mcp_allow_hosts=("fd00::/8",))
    response = await refused.http.post(
        "/v1/responses", json={"model": MODEL, "input": "hi", "tools": [_tool(mcp.url)]}
    )
    assert response.status_code == 400


async def test_a_name_is_checked_by_the_address_it_resolves_to(
    start_server: StartServer, mcp_echo: RunningMcp
) -> None:
    """``localhost`` is 127.0.0.1 here: a network holding it allows it, another does not."""
    url = mcp_echo.url.replace("127.0.0.1", "localhost")
    allowed = await start_server(mcp_allow_hosts=("127.0.0.0/8",))
    answer = await _ask(allowed, url)
    assert answer["output"][-1]["content"][0]["text"] == "Tool result: echo: hi"

    refused = await start_server(mcp_allow_hosts=("127.0.0.2",))
    response = await _ask(refused, url)
    listing = _output(response, "mcp_list_tools")
    assert "resolves to 127.0.0.1" in listing["error"]
    assert "no --mcp-allow-host pattern allows" in listing["error"]
    assert not any(item["type"] == "mcp_call" and "output" in item for item in response["output"])
    with trio.fail_after(5):
        await refused.service.wait_idle()
    assert mcp_echo.open_sessions == 0  # nothing connected to it


class _RebindingResolver(trio.abc.HostnameResolver):
    """Answers ``rebind.test`` with 127.0.0.1 once, then with 127.0.0.2 (DNS rebinding)."""

    def __init__(self) -> None:
        self.answers = 0

    async def getaddrinfo(
        self, host: bytes | None, port: bytes | str | int | None, *args: Any
    ) -> Any:
        if host == b"rebind.test":
            self.answers += 1
            address = "127.0.0.1" if self.answers == 1 else "127.0.0.2"
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, int(port or 0)))]
        return await trio.to_thread.run_sync(socket.getaddrinfo, host, port, *args)

    async def getnameinfo(self, sockaddr: Any, flags: int) -> tuple[str, str]:
        return await trio.to_thread.run_sync(socket.getnameinfo, sockaddr, flags)


@asynccontextmanager
async def _resolver(resolver: trio.abc.HostnameResolver) -> AsyncIterator[None]:
    previous = trio.socket.set_custom_hostname_resolver(resolver)
    try:
        yield
    finally:
        trio.socket.set_custom_hostname_resolver(previous)


async def _serve_mcp(
    *,
    bind: str,
    allowed_hosts: list[str],
    sse: bool = False,
    task_status: trio.TaskStatus[RunningMcp] = trio.TASK_STATUS_IGNORED,
) -> None:
    """The echo server, answering only requests whose ``Host`` is in ``allowed_hosts``
    (streamable HTTP at ``/mcp``, or SSE at ``/sse``)."""
    server = echo_server()
    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=True, allowed_hosts=allowed_hosts
    )
    if sse:
        app = server.sse_app(transport_security=security)
    else:
        app = server.streamable_http_app(transport_security=security)
    config = HypercornConfig()
    config.bind = [bind]
    config.accesslog = None
    config.graceful_timeout = 0.1
    async with trio.open_nursery() as nursery:
        urls = await nursery.start(partial(hypercorn.trio.serve, app, config))  # type: ignore[arg-type]
        task_status.started(RunningMcp(server, urls[0] + ("/sse" if sse else "/mcp")))


@pytest.mark.parametrize("sse", [False, True], ids=["streamable-http", "sse"])
async def test_the_connection_goes_to_the_address_checked(
    start_server: StartServer, nursery: trio.Nursery, sse: bool
) -> None:
    """The name is resolved once: every request of the session goes to that address, with
    the name as ``Host`` (the MCP server refuses any other ``Host``)."""
    mcp: RunningMcp = await nursery.start(
        partial(_serve_mcp, bind="127.0.0.1:0", allowed_hosts=["rebind.test:*"], sse=sse)
    )
    url = mcp.url.replace("127.0.0.1", "rebind.test")
    server = await start_server(mcp_allow_hosts=("127.0.0.1",))
    resolver = _RebindingResolver()
    async with _resolver(resolver):
        answer = await _ask(server, url, "pinned")
    # Listing, the call and the goodbye all went to 127.0.0.1: nothing listens on 127.0.0.2.
    assert answer["output"][-1]["content"][0]["text"] == "Tool result: echo: pinned"
    assert _output(answer, "mcp_list_tools").get("error") is None
    assert resolver.answers == 1


def test_a_glob_of_digits_allows_addresses_not_names() -> None:
    hosts = allowed_hosts(("127.0.0.*",))
    assert hosts.check_url("http://127.0.0.1:9/mcp").address is not None
    # A name that merely starts like an allowed address could resolve anywhere.
    with pytest.raises(HostNotAllowed):
        hosts.check_url("http://127.0.0.1.attacker.example/mcp")
