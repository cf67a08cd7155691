"""Fixtures: test MCP servers on loopback."""

from __future__ import annotations

import pytest
import trio

from tests.tools.servers import RunningMcp, browser_server, echo_server, serve_mcp


@pytest.fixture
async def mcp_echo(nursery: trio.Nursery) -> RunningMcp:
    running: RunningMcp = await nursery.start(serve_mcp, echo_server())
    return running


@pytest.fixture
async def mcp_browser(nursery: trio.Nursery) -> RunningMcp:
    running: RunningMcp = await nursery.start(serve_mcp, browser_server())
    return running
