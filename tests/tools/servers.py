"""Small MCP servers for the tests, written with the mcp SDK.

Served in-process over streamable HTTP on port 0 (`serve_mcp`), or as a stdio
child process (``stdio_server.py`` next to this file).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import anyio
import hypercorn.trio
import trio
from hypercorn.config import Config as HypercornConfig
from mcp.server.mcpserver import MCPServer

STDIO_SERVER = Path(__file__).with_name("stdio_server.py")

SEARCH_RESULTS = "【0†Trio nurseries†trio.readthedocs.io】 A nursery supervises child tasks."


def echo_server() -> MCPServer:
    """echo, add, slow (cooperative sleep), stubborn (ignores cancellation)."""
    server = MCPServer("echo")

    @server.tool(description="Say the text back.")
    def echo(text: str) -> str:
        return f"echo: {text}"

    @server.tool(description="Add two integers.")
    def add(a: int, b: int) -> int:
        return a + b

    @server.tool(description="Sleep, then answer.")
    async def slow(seconds: float) -> str:
        await anyio.sleep(seconds)
        return "slept"

    @server.tool(description="Sleep and refuse to be interrupted.")
    async def stubborn(seconds: float) -> str:
        with anyio.CancelScope(shield=True):
            await anyio.sleep(seconds)
        return "finally"

    return server


def browser_server() -> MCPServer:
    """A stand-in for the gpt-oss browser tool with fixed results."""
    server = MCPServer("browser")

    @server.tool(description="Search the web.")
    def search(query: str, topn: int = 5) -> str:
        return f"{SEARCH_RESULTS} (query: {query})"

    @server.tool(description="Open a page.")
    def open(id: str | int = -1, cursor: int = -1, loc: int = -1) -> str:
        return f"Page {id}: nurseries own their tasks."

    @server.tool(description="Find text in the current page.")
    def find(pattern: str, cursor: int = -1) -> str:
        return f"Found {pattern!r} on line 3."

    return server


@dataclass
class RunningMcp:
    server: MCPServer
    url: str

    @property
    def open_sessions(self) -> int:
        """Streamable HTTP sessions initialized and not yet ended."""
        return len(self.server.session_manager._server_instances)


async def serve_mcp(
    server: MCPServer, *, task_status: trio.TaskStatus[RunningMcp] = trio.TASK_STATUS_IGNORED
) -> None:
    """Serve ``server`` at ``http://127.0.0.1:PORT/mcp`` until cancelled."""
    app = server.streamable_http_app()
    config = HypercornConfig()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.graceful_timeout = 0.1
    async with trio.open_nursery() as nursery:
        urls = await nursery.start(partial(hypercorn.trio.serve, app, config))  # type: ignore[arg-type]
        task_status.started(RunningMcp(server, urls[0] + "/mcp"))


def stdio_address(*flags: str) -> str:
    return f"stdio:{sys.executable} {STDIO_SERVER} {' '.join(flags)}".strip()
