"""MCP transports by address: streamable HTTP, SSE, or a stdio child process.

Each function returns a *factory* for the transport context; only a session
owner (`tools.session.McpSession.run`) calls it, and the same task exits it.

    http://host:port/mcp         streamable HTTP
    http://host:port/sse         SSE (a path ending in /sse)
    stdio:COMMAND ARGS...        a child process speaking MCP on stdin/stdout

`connect_checked` is for the servers requests name (``server_url``): each
connection resolves the host once, checks the address against
``--mcp-allow-host`` (`tools.hosts`) and sends every HTTP request to that
address, with the URL's name in the ``Host`` header and as the TLS server name.
"""

from __future__ import annotations

import shlex
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, final
from urllib.parse import urlsplit

import httpx2
import trio
from mcp import StdioServerParameters, stdio_client
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import INVALID_REQUEST

from .hosts import AllowedHosts, HostNotAllowed, Target
from .session import Connect, ToolError

STDIO_PREFIX = "stdio:"


def connect_to(
    address: str,
    headers: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
) -> Connect:
    """The transport factory for ``address`` (a URL or ``stdio:COMMAND``).

    A stdio child gets the MCP SDK's short list of safe variables (``PATH``,
    ``HOME``...) and ``env``, nothing else of this process's environment.

    Raises:
        ValueError: the address is neither.
    """
    if address.startswith(STDIO_PREFIX):
        argv = shlex.split(address.removeprefix(STDIO_PREFIX))
        if not argv:
            raise ValueError(f"no command after {STDIO_PREFIX!r} in {address!r}")
        extra_env = dict(env or {})
        return lambda: _stdio(argv, extra_env)
    parts = urlsplit(address)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{address!r} is not an http(s) URL or {STDIO_PREFIX}COMMAND")
    extra = dict(headers or {})
    if parts.path.rstrip("/").endswith("/sse"):
        return lambda: sse_client(address, headers=extra or None)
    return lambda: _streamable(address, extra)


_TIMEOUT = httpx2.Timeout(30.0, read=300.0)


@asynccontextmanager
async def _streamable(url: str, headers: dict[str, str]) -> AsyncIterator[tuple[Any, Any]]:
    async with (
        httpx2.AsyncClient(headers=headers, timeout=_TIMEOUT) as client,
        streamable_http_client(url, http_client=client) as streams,
    ):
        yield streams


def connect_checked(url: str, headers: Mapping[str, str] | None, allowed: AllowedHosts) -> Connect:
    """The transport factory for a request's ``server_url``, pinned to a checked address.

    Each connection resolves the URL's host once and connects to the first
    address ``allowed`` accepts; every HTTP request of the session goes there,
    and a request for any other host or port is refused.

    Raises:
        HostNotAllowed: ``url`` is not an http(s) URL that ``allowed`` may accept
            (at once; an address refused after resolving fails the connection).
    """
    target = allowed.check_url(url)
    extra = dict(headers or {})
    sse = urlsplit(url).path.rstrip("/").endswith("/sse")

    @asynccontextmanager
    async def connect() -> AsyncIterator[tuple[Any, Any]]:
        address = await _checked_address(target, allowed)

        def client(
            headers: dict[str, str] | None = None,
            timeout: httpx2.Timeout | None = None,
            auth: httpx2.Auth | None = None,
        ) -> httpx2.AsyncClient:
            return httpx2.AsyncClient(
                headers=headers,
                timeout=timeout or _TIMEOUT,
                auth=auth,
                transport=PinnedTransport(target, address),
                trust_env=False,  # a proxy from the environment would resolve the name again
            )

        if sse:
            async with sse_client(url, headers=extra or None, httpx_client_factory=client) as s:
                yield s
        else:
            async with (
                client(extra) as http_client,
                streamable_http_client(url, http_client=http_client) as streams,
            ):
                yield streams

    return connect


async def _checked_address(target: Target, allowed: AllowedHosts) -> str:
    """Resolve ``target``'s host (once) and pick the address the patterns allow."""
    if target.address is None:
        try:
            infos = await trio.socket.getaddrinfo(
                target.host, target.port, type=trio.socket.SOCK_STREAM
            )
        except OSError as error:
            raise ToolError(
                f"Could not resolve the MCP server host {target.host!r}: {error}."
            ) from None
        addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    else:
        addresses = []
    try:
        return allowed.allowed_address(target, addresses)
    except HostNotAllowed as refused:
        raise ToolError(str(refused), code=INVALID_REQUEST) from None


@final
class PinnedTransport(httpx2.AsyncBaseTransport):
    """HTTP to one checked address: requests for ``target`` go to ``address``.

    The request keeps its ``Host`` header (set from the URL when the request was
    built) and, for https, the name is the TLS server name, so certificates are
    checked against the name. Requests for another host, port or scheme (a
    redirect, an SSE endpoint elsewhere) are refused: that host was not checked.
    """

    def __init__(self, target: Target, address: str) -> None:
        self._target = target
        self._address = address
        self._inner = httpx2.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        url = request.url
        target = self._target
        port = url.port or (443 if url.scheme == "https" else 80)
        if (url.scheme, url.host.lower(), port) != (target.scheme, target.host, target.port):
            raise httpx2.ConnectError(
                f"Refusing to connect to {url.host}:{port}: this MCP session may only reach "
                f"{target.host}:{target.port}.",
                request=request,
            )
        extensions = dict(request.extensions)
        if url.scheme == "https":
            extensions["sni_hostname"] = target.host
        pinned = httpx2.Request(
            request.method,
            url.copy_with(host=self._address),
            headers=request.headers,
            stream=request.stream,
            extensions=extensions,
        )
        return await self._inner.handle_async_request(pinned)

    async def aclose(self) -> None:
        await self._inner.aclose()


def _stdio(argv: list[str], env: dict[str, str]) -> Any:
    return stdio_client(StdioServerParameters(command=argv[0], args=argv[1:], env=env or None))
