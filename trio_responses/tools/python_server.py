"""The bundled python tool server: an MCP server with one tool, ``python(code)``.

    trio-responses tool-server python --stdio          (what --code-interpreter runs)
    trio-responses tool-server python --port 8765      (streamable HTTP at /mcp)

Every call runs the code in a fresh sandboxed process (`tools.sandbox`) and
returns what it printed. Code that fails, runs too long or uses too much
memory gives a tool error (``isError``) whose text is the output plus the
reason; the server itself is never affected.
"""

from __future__ import annotations

import sys
from functools import partial

import anyio
import hypercorn.trio
import trio
from hypercorn.config import Config as HypercornConfig
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from .sandbox import Limits, run_python

DESCRIPTION = (
    "Run Python code in a fresh, isolated process and return what it prints "
    "(stdout and stderr). Nothing persists between calls. Print the values you need."
)


def build_server(limits: Limits | None = None) -> MCPServer:
    limits = limits or Limits()
    server = MCPServer("trio-responses-python", instructions=DESCRIPTION)

    @server.tool(description=DESCRIPTION)
    async def python(code: str) -> str:
        result = await run_python(code, limits)
        if not result.ok:
            raise ToolError(f"{result.output}\n[{result.problem}]".lstrip("\n"))
        return result.output

    return server


def run_stdio(limits: Limits) -> None:
    """Serve MCP on stdin/stdout until the client goes away."""
    anyio.run(build_server(limits).run_stdio_async, backend="trio")


def run_http(limits: Limits, host: str, port: int) -> None:
    """Serve MCP over streamable HTTP at ``http://HOST:PORT/mcp`` until interrupted.

    Prints the bound URL (``--port 0`` picks a free port) on stderr.
    """
    app = build_server(limits).streamable_http_app()
    config = HypercornConfig()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            urls = await nursery.start(partial(hypercorn.trio.serve, app, config))  # type: ignore[arg-type]
            print(f"python tool server: {urls[0]}/mcp", file=sys.stderr, flush=True)

    trio.run(main)
