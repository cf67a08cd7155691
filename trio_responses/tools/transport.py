"""MCP transports by address: streamable HTTP, SSE, or a stdio child process.

Each function returns a *factory* for the transport context; only a session
owner (`tools.session.McpSession.run`) calls it, and the same task exits it.

    http://host:port/mcp         streamable HTTP
    http://host:port/sse         SSE (a path ending in /sse)
    stdio:COMMAND ARGS...        a child process speaking MCP on stdin/stdout
"""

from __future__ import annotations

import shlex
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit

import httpx2
from mcp import StdioServerParameters, stdio_client
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client

from .session import Connect

STDIO_PREFIX = "stdio:"


def connect_to(address: str, headers: Mapping[str, str] | None = None) -> Connect:
    """The transport factory for ``address`` (a URL or ``stdio:COMMAND``).

    Raises:
        ValueError: the address is neither.
    """
    if address.startswith(STDIO_PREFIX):
        argv = shlex.split(address.removeprefix(STDIO_PREFIX))
        if not argv:
            raise ValueError(f"no command after {STDIO_PREFIX!r} in {address!r}")
        return lambda: _stdio(argv)
    parts = urlsplit(address)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{address!r} is not an http(s) URL or {STDIO_PREFIX}COMMAND")
    extra = dict(headers or {})
    if parts.path.rstrip("/").endswith("/sse"):
        return lambda: sse_client(address, headers=extra or None)
    return lambda: _streamable(address, extra)


@asynccontextmanager
async def _streamable(url: str, headers: dict[str, str]) -> AsyncIterator[tuple[Any, Any]]:
    timeout = httpx2.Timeout(30.0, read=300.0)
    async with (
        httpx2.AsyncClient(headers=headers, timeout=timeout) as client,
        streamable_http_client(url, http_client=client) as streams,
    ):
        yield streams


def _stdio(argv: list[str]) -> Any:
    return stdio_client(StdioServerParameters(command=argv[0], args=argv[1:]))
