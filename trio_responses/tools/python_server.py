"""The bundled python tool server: an MCP server with one tool, ``python(code)``.

    trio-responses tool-server python --stdio          (for --tool-server python=stdio:...)
    trio-responses tool-server python --port 8765      (streamable HTTP at /mcp)

Stateless: ``serve --code-interpreter`` runs containers of its own instead
(`tools.containers`); this server is for ``--tool-server python=URL``.

Every call runs the code in a fresh sandboxed process (`tools.sandbox`) and
returns what it printed. Code that fails, runs too long or uses too much
memory gives a tool error (``isError``) whose text is the output plus the
reason; the server itself is never affected. With ``--max-concurrent N`` at
most N runs execute at once; more calls wait for one to end.

Both entry points check the sandbox first (`probe_sandbox`): without a working
bubblewrap they raise `SandboxUnavailable` and serve nothing, unless the mode
is ``none``, which logs a warning.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from functools import partial

import anyio
import hypercorn.trio
import trio
from hypercorn.config import Config as HypercornConfig
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from .sandbox import Limits, Sandbox, SandboxMode, probe_sandbox, run_python

logger = logging.getLogger("trio_responses.python_server")

DESCRIPTION = (
    "Run Python code in a fresh, isolated process and return what it prints "
    "(stdout and stderr). Nothing persists between calls. Print the values you need."
)


def build_server(
    sandbox: Sandbox, limits: Limits | None = None, max_concurrent: int | None = None
) -> MCPServer:
    """The MCP server; with ``max_concurrent``, a call beyond that many waits (first
    come, first served) until a run has ended and everything it started is reaped."""
    limits = limits or Limits()
    server = MCPServer("trio-responses-python", instructions=DESCRIPTION)
    slots = trio.Semaphore(max_concurrent) if max_concurrent is not None else None

    @server.tool(description=DESCRIPTION)
    async def python(code: str) -> str:
        async with slots or contextlib.nullcontext():
            result = await run_python(code, limits, sandbox=sandbox)
        if not result.ok:
            raise ToolError(f"{result.output}\n[{result.problem}]".lstrip("\n"))
        return result.output

    return server


async def checked_sandbox(mode: SandboxMode, bwrap: str, limits: Limits) -> Sandbox:
    """`probe_sandbox` for this server, logging what is in force."""
    sandbox = await probe_sandbox(mode, bwrap=bwrap, flag="--sandbox")
    if sandbox.warning is not None:
        logger.warning("python tool server: %s", sandbox.warning)
    logger.info("python tool server sandbox: %s", sandbox.describe(limits))
    return sandbox


def run_stdio(
    limits: Limits,
    mode: SandboxMode = "auto",
    bwrap: str = "bwrap",
    max_concurrent: int | None = None,
) -> None:
    """Serve MCP on stdin/stdout until the client goes away."""

    async def main() -> None:
        sandbox = await checked_sandbox(mode, bwrap, limits)
        await build_server(sandbox, limits, max_concurrent).run_stdio_async()

    anyio.run(main, backend="trio")


def run_http(
    limits: Limits,
    host: str,
    port: int,
    mode: SandboxMode = "auto",
    bwrap: str = "bwrap",
    max_concurrent: int | None = None,
) -> None:
    """Serve MCP over streamable HTTP at ``http://HOST:PORT/mcp`` until interrupted.

    Prints the bound URL (``--port 0`` picks a free port) on stderr.
    """
    config = HypercornConfig()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None

    async def main() -> None:
        sandbox = await checked_sandbox(mode, bwrap, limits)
        app = build_server(sandbox, limits, max_concurrent).streamable_http_app()
        async with trio.open_nursery() as nursery:
            urls = await nursery.start(partial(hypercorn.trio.serve, app, config))  # type: ignore[arg-type]
            print(f"python tool server: {urls[0]}/mcp", file=sys.stderr, flush=True)

    trio.run(main)
