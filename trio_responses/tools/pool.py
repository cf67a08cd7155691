"""Configured tool servers (``--tool-server LABEL=ADDRESS``), kept connected.

Each server has a supervisor task in the service nursery. It runs one
`McpSession` at a time: connect, list the tools (kept for prompts and
``mcp_list_tools`` items), serve calls, check the connection every
``health_interval_s`` while idle; when the connection fails it waits (0.5 s,
doubling up to 30 s) and connects again. Calls made while a server is down
fail at once with a message saying so; `/health` shows each server's state.

Labels: ``python`` backs ``code_interpreter``, ``browser`` backs ``web_search``;
any other label is an MCP server requests reach as
``{"type": "mcp", "server_label": LABEL}``.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, final

import trio
from mcp_types import CONNECTION_CLOSED

from ..metrics import IncDec
from .session import Connect, McpSession, ToolError, ToolInfo, ToolResult
from .transport import connect_to

logger = logging.getLogger("trio_responses.tools")

_LABEL = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True)
class ToolServerSpec:
    label: str
    address: str

    @classmethod
    def parse(cls, text: str) -> ToolServerSpec:
        """``LABEL=URL`` or ``LABEL=stdio:COMMAND``.

        Raises:
            ValueError: with a message naming the problem.
        """
        label, sep, address = text.partition("=")
        if not sep or not address:
            raise ValueError(f"tool server {text!r}: expected LABEL=URL or LABEL=stdio:COMMAND")
        if not _LABEL.match(label):
            raise ValueError(f"tool server label {label!r}: use letters, digits, '_' or '-'")
        connect_to(address)  # validates the address
        return cls(label, address)


@final
class ToolServer:
    """One configured server and its supervisor."""

    def __init__(
        self,
        spec: ToolServerSpec,
        *,
        connect: Connect | None = None,
        connect_timeout_s: float = 30.0,
        close_timeout_s: float = 5.0,
        health_interval_s: float = 15.0,
        backoff_s: tuple[float, float] = (0.5, 30.0),
        open_sessions: IncDec | None = None,
    ) -> None:
        self.spec = spec
        self._open_sessions = open_sessions
        self._connect = connect or connect_to(spec.address)
        self._connect_timeout_s = connect_timeout_s
        self._close_timeout_s = close_timeout_s
        self._health_interval_s = health_interval_s
        self._backoff = backoff_s
        self._session: McpSession | None = None
        self._stopping = False
        self._first_attempt = trio.Event()
        self._ready = trio.Event()
        self.tools: list[ToolInfo] = []
        self.connections = 0
        self.last_error: str | None = None

    @property
    def label(self) -> str:
        return self.spec.label

    @property
    def state(self) -> str:
        """``connecting``, ``ready``, ``down`` (waiting to reconnect) or ``closed``."""
        session = self._session
        if self._stopping:
            return "closed"
        if session is None or session.state == "connecting":
            return "connecting"
        if session.state == "ready" and self.tools:
            return "ready"
        if session.state == "ready":
            return "connecting"
        return "down"

    async def wait_ready(self) -> None:
        """Wait until the server is connected (again)."""
        while self.state != "ready":
            await self._ready.wait()  # set (and replaced) at each new connection

    async def wait_first_attempt(self) -> None:
        """Wait until the first connection attempt has succeeded or failed."""
        await self._first_attempt.wait()

    async def run(self) -> None:
        """Supervise connections. Never returns unless `close`d or cancelled."""
        delay = self._backoff[0]
        while not self._stopping:
            session = McpSession(
                self.label,
                self._connect,
                connect_timeout_s=self._connect_timeout_s,
                close_timeout_s=self._close_timeout_s,
                open_sessions=self._open_sessions,
            )
            self._session = session
            healthy_since = math.inf
            async with trio.open_nursery() as nursery:
                await nursery.start(session.run)
                try:
                    self.tools = await session.list_tools(timeout_s=self._connect_timeout_s)
                    self.connections += 1
                    healthy_since = trio.current_time()
                    self._ready.set()
                    self._ready = trio.Event()
                    logger.info("tool server %r ready: %d tools", self.label, len(self.tools))
                    nursery.start_soon(self._watch, session)
                except ToolError as error:
                    self.last_error = str(error)
                    session.close()
                self._first_attempt.set()
                await session.wait_ended()
                nursery.cancel_scope.cancel()
            if self._stopping:
                return
            self.last_error = session.error or self.last_error
            if trio.current_time() - healthy_since > 60:
                delay = self._backoff[0]
            logger.warning(
                "tool server %r is down (%s); reconnecting in %.1f s",
                self.label,
                self.last_error,
                delay,
            )
            await trio.sleep(delay)
            delay = min(delay * 2, self._backoff[1])

    async def _watch(self, session: McpSession) -> None:
        """Notice a dead connection while idle: list the tools now and then."""
        while True:
            await trio.sleep(self._health_interval_s)
            if session.calls_in_flight:
                continue
            try:
                await session.list_tools(timeout_s=self._connect_timeout_s)
            except ToolError as error:
                self.last_error = str(error)
                session.abandon(str(error))
                return

    async def call_tool(
        self, name: str, arguments: dict[str, Any], *, timeout_s: float
    ) -> ToolResult:
        """Call a tool on this server.

        Raises:
            ToolError: the server is down, failed or timed out.
        """
        session = self._session
        if session is None or self.state == "down":
            raise ToolError(
                f"The tool server {self.label!r} is unavailable"
                + (f" ({self.last_error})" if self.last_error else "")
                + "; it is reconnecting.",
                code=CONNECTION_CLOSED,
            )
        return await session.call_tool(name, arguments, timeout_s=timeout_s)

    def close(self) -> None:
        """Stop supervising and disconnect (politely, within the close timeout)."""
        self._stopping = True
        if self._session is not None:
            self._session.close()

    def health(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "tools": len(self.tools),
            "connections": self.connections,
            "error": self.last_error if self.state != "ready" else None,
        }


@final
class ToolServerPool:
    """Every configured tool server, by label."""

    def __init__(self, servers: Sequence[ToolServer]) -> None:
        self._servers = {server.label: server for server in servers}

    def __contains__(self, label: str) -> bool:
        return label in self._servers

    def get(self, label: str) -> ToolServer | None:
        return self._servers.get(label)

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(self._servers)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Supervise every server; reports started once each has tried once."""
        async with trio.open_nursery() as nursery:
            for server in self._servers.values():
                nursery.start_soon(server.run, name=f"tool server {server.label}")
            for server in self._servers.values():
                await server.wait_first_attempt()
            task_status.started()

    def close(self) -> None:
        for server in self._servers.values():
            server.close()

    def health(self) -> dict[str, Any]:
        return {label: server.health() for label, server in self._servers.items()}
