"""One MCP connection, owned by exactly one task.

`McpSession.run` is the owner task: it enters the transport and the
`ClientSession`, initializes, then serves `list_tools` / `call_tool` requests
that arrive over a memory channel, each in its own task under its own cancel
scope and timeout. It exits the contexts itself, in the task that entered them
— never from a caller's task, never from a garbage-collected generator — which
is what keeps anyio's cancel scopes (and trio) happy.

Callers use `list_tools` and `call_tool` from any task. A caller that is
cancelled (or times out) cancels only its own call; the connection and the
other calls go on. `close` asks the owner to leave: it stops taking requests,
exits its contexts normally (an HTTP transport says goodbye to the server), and
is cancelled if that takes longer than ``close_timeout_s``.

A transport that fails (the server died, the network went away) ends the
owner with `state` ``"failed"``; calls in flight, pending and later calls
fail with `ToolError` (calls in flight once the owner has left, so that their
message says why the connection failed). Closing fails the calls in flight
the same way. Every call ends with a result or a `ToolError`, never without
either. Reconnecting is the pool's job (`tools.pool`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Literal, final

import trio
from mcp import ClientSession
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, INTERNAL_ERROR, REQUEST_TIMEOUT, PaginatedRequestParams

from ..metrics import IncDec

logger = logging.getLogger("trio_responses.tools")

Transport = AbstractAsyncContextManager[tuple[Any, Any]]
"""An MCP transport context: yields the (read, write) stream pair."""

Connect = Callable[[], Transport]

SessionState = Literal["connecting", "ready", "closing", "closed", "failed"]


class ToolError(Exception):
    """A tool call (or listing) failed: the message is what the model gets to read.

    ``code`` is the JSON-RPC error code (``CONNECTION_CLOSED``, ``REQUEST_TIMEOUT``…).
    """

    def __init__(self, message: str, *, code: int = INTERNAL_ERROR) -> None:
        super().__init__(strict_text(message))
        self.code = code


@dataclass(frozen=True)
class ToolInfo:
    name: str
    description: str | None
    input_schema: dict[str, Any]
    annotations: dict[str, Any] | None = None


@dataclass(frozen=True)
class ToolResult:
    text: str
    """The result's text content, joined."""
    is_error: bool
    outputs: tuple[dict[str, Any], ...] = ()
    """Outputs of the call item besides its text (the code interpreter's images)."""
    citations: tuple[tuple[dict[str, Any], tuple[str, ...]], ...] = ()
    """Files later answers may cite: (the annotation, the texts naming the file);
    see `protocol.builder.ResponseBuilder.cite`."""


@dataclass
class _Request:
    kind: Literal["list", "call"]
    name: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)
    timeout_s: float = math.inf
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    done: trio.Event = field(default_factory=trio.Event)
    tools: list[ToolInfo] | None = None
    result: ToolResult | None = None
    error: str | None = None
    error_code: int = INTERNAL_ERROR

    @property
    def answered(self) -> bool:
        return self.error is not None or self.tools is not None or self.result is not None


@final
class McpSession:
    """A handle to one MCP connection; `run` is its owner task."""

    def __init__(
        self,
        label: str,
        connect: Connect,
        *,
        connect_timeout_s: float = 30.0,
        close_timeout_s: float = 5.0,
        open_sessions: IncDec | None = None,
    ) -> None:
        """``open_sessions`` (a gauge) counts this session while it is connected."""
        self.label = label
        self._connect = connect
        self._open_sessions = open_sessions
        self._counted = False
        self._connect_timeout_s = connect_timeout_s
        self._close_timeout_s = close_timeout_s
        self._send, self._receive = trio.open_memory_channel[_Request](math.inf)
        self._ready = trio.Event()
        self._ended = trio.Event()
        self._scope = trio.CancelScope()
        self.state: SessionState = "connecting"
        self.error: str | None = None
        self.calls_in_flight = 0
        self._interrupted: list[_Request] = []
        """Calls cut off by the connection ending: answered when the owner leaves."""

    # -- owner -------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Connect, serve requests until `close` (or failure), disconnect.

        Reports started at once (connecting happens in the background; callers
        wait for it). Never raises for connection problems: they end up in
        `state`/`error` and in the callers' `ToolError`.
        """
        task_status.started()
        try:
            with self._scope:
                self._scope.deadline = trio.current_time() + self._connect_timeout_s
                await self._serve()
            if self._scope.cancelled_caught and not self._ready.is_set() and self.state != "closed":
                self._fail(
                    f"Could not connect to the MCP server {self.label!r} within "
                    f"{self._connect_timeout_s:g} s."
                )
        except* Exception as failures:
            # anyio wraps transport errors in groups, and one may fail as the owner is
            # cancelled: the errors are this session's, the cancellation goes on.
            self._fail(_describe(failures))
        finally:
            if self._counted and self._open_sessions is not None:
                self._counted = False
                self._open_sessions.dec()
            if self.state not in ("failed",):
                self.state = "closed"
            self._ready.set()
            self._answer_interrupted()
            self._drain(f"The MCP server {self.label!r} connection is closed.")
            self._ended.set()

    async def _serve(self) -> None:
        async with self._connect() as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            self._scope.deadline = math.inf
            if self.state == "connecting":
                self.state = "ready"
            if self._open_sessions is not None:
                self._open_sessions.inc()
                self._counted = True
            self._ready.set()
            logger.info("MCP server %r connected", self.label)
            async with trio.open_nursery() as calls:
                async for request in self._receive:
                    calls.start_soon(self._handle, session, request)
                # Closing: in-flight calls belong to callers that are going away.
                calls.cancel_scope.cancel()
            if self.state == "failed":
                # Leave without the polite goodbye: the connection is gone.
                self._scope.cancel()

    async def _handle(self, session: ClientSession, request: _Request) -> None:
        self.calls_in_flight += 1
        try:
            with request.scope:
                request.scope.deadline = trio.current_time() + request.timeout_s
                try:
                    if request.kind == "list":
                        request.tools = await _list_all(session)
                    else:
                        result = await session.call_tool(request.name, request.arguments)
                        request.result = ToolResult(
                            strict_text(_text(result.content)), bool(result.is_error)
                        )
                except MCPError as error:
                    request.error = f"The MCP server {self.label!r} failed: {error.message}"
                    request.error_code = error.code
                    if error.code == CONNECTION_CLOSED:
                        self._fail(request.error)
                except Exception as error:
                    request.error = f"The MCP server {self.label!r} failed: {_describe(error)}"
            if request.scope.cancelled_caught and request.error is None:
                request.error_code = REQUEST_TIMEOUT
                request.error = (
                    f"The call to {request.name or 'tools/list'!r} on MCP server "
                    f"{self.label!r} timed out after {request.timeout_s:g} s."
                )
        finally:
            self.calls_in_flight -= 1
            if request.answered:
                request.done.set()
            else:
                # Cancelled by the connection ending (it failed, or `close`): the
                # owner answers once it knows why (`_answer_interrupted`), and
                # leaves within the close timeout so that the caller is not kept.
                self._interrupted.append(request)
                self._scope.deadline = min(
                    self._scope.deadline, trio.current_time() + self._close_timeout_s
                )

    def _fail(self, message: str) -> None:
        if self.state != "failed":
            logger.warning("MCP server %r: %s", self.label, message)
        self.state = "failed"
        self.error = message
        self._send.close()  # ends the serving loop; _serve then leaves at once

    def _answer_interrupted(self) -> None:
        if self.state == "failed":
            reason = f"the connection failed ({self.error})" if self.error else "it failed"
        else:
            reason = "the connection was closed"
        while self._interrupted:
            request = self._interrupted.pop()
            request.error = (
                f"The call to {request.name or 'tools/list'!r} on MCP server {self.label!r} "
                f"did not finish: {reason}."
            )
            request.error_code = CONNECTION_CLOSED
            request.done.set()

    def _drain(self, message: str) -> None:
        while True:
            try:
                request = self._receive.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                return
            request.error = self.error or message
            request.error_code = CONNECTION_CLOSED
            request.done.set()

    # -- callers --------------------------------------------------------------------------

    @property
    def ended(self) -> bool:
        return self._ended.is_set()

    async def wait_ended(self) -> None:
        await self._ended.wait()

    async def list_tools(self, *, timeout_s: float = math.inf) -> list[ToolInfo]:
        """Every tool the server offers.

        Raises:
            ToolError: the server failed, timed out or is not connected.
        """
        request = await self._submit(_Request("list", timeout_s=timeout_s))
        if request.tools is None:
            raise ToolError(f"The MCP server {self.label!r} listed no tools.")
        return request.tools

    async def call_tool(
        self, name: str, arguments: dict[str, Any], *, timeout_s: float = math.inf
    ) -> ToolResult:
        """Call a tool. A tool-level error comes back as ``is_error``, not raised.

        Raises:
            ToolError: the server failed, timed out or is not connected.

        Cancellation: cancels this call only (the server is told, if it can be).
        """
        request = await self._submit(
            _Request("call", name=name, arguments=arguments, timeout_s=timeout_s)
        )
        if request.result is None:
            raise ToolError(f"The MCP server {self.label!r} gave no result for {name!r}.")
        return request.result

    async def _submit(self, request: _Request) -> _Request:
        await self._ready.wait()
        if self.state != "ready":
            raise ToolError(
                self.error or f"The MCP server {self.label!r} is not connected.",
                code=CONNECTION_CLOSED,
            )
        try:
            self._send.send_nowait(request)
        except trio.ClosedResourceError:
            raise ToolError(
                self.error or f"The MCP server {self.label!r} connection is closed.",
                code=CONNECTION_CLOSED,
            ) from None
        try:
            await request.done.wait()
        finally:
            if not request.done.is_set():
                request.scope.cancel()  # we were cancelled: so is our call, and only it
        if request.error is not None:
            raise ToolError(request.error, code=request.error_code)
        return request

    def abandon(self, reason: str) -> None:
        """Treat the connection as dead (a health check failed): the owner leaves at once."""
        self._fail(reason)

    def close(self) -> None:
        """Ask the owner to disconnect. Never blocks; idempotent.

        The owner finishes (or cancels) in-flight calls, exits its contexts
        normally, and is cancelled after ``close_timeout_s`` if that hangs.
        """
        if self.state == "connecting":
            self.state = "closed"
            self._scope.cancel()  # nothing to say goodbye to yet
        elif self.state == "ready":
            self.state = "closing"
            self._scope.deadline = trio.current_time() + self._close_timeout_s
        self._send.close()


async def _list_all(session: ClientSession) -> list[ToolInfo]:
    tools: list[ToolInfo] = []
    cursor: str | None = None
    while True:
        params = PaginatedRequestParams(cursor=cursor) if cursor else None
        result = await session.list_tools(params=params)
        for tool in result.tools:
            annotations = (
                tool.annotations.model_dump(exclude_none=True) if tool.annotations else None
            )
            tools.append(
                ToolInfo(
                    strict_text(tool.name),
                    strict_text(tool.description) if tool.description is not None else None,
                    strict_json(dict(tool.input_schema)),
                    strict_json(annotations) if annotations is not None else None,
                )
            )
        cursor = result.next_cursor
        if not cursor:
            return tools


def strict_text(text: str) -> str:
    """``text`` with lone UTF-16 surrogates replaced by U+FFFD.

    A server's JSON may escape them (``"\\ud800"``); such a string cannot be
    encoded as UTF-8, so it would fail the response at its first event or store
    write. Requests are refused for them; what a tool server says is repaired.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def strict_json(value: Any) -> Any:
    """``value`` (parsed JSON) as strict JSON: text through `strict_text`, and
    ``NaN``/``Infinity``, which stored records refuse, as ``null``."""
    if isinstance(value, str):
        return strict_text(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, list):
        return [strict_json(item) for item in value]
    if isinstance(value, dict):
        return {strict_text(str(key)): strict_json(item) for key, item in value.items()}
    return value


def _text(content: list[Any]) -> str:
    parts = []
    for block in content:
        text = getattr(block, "text", None)
        if isinstance(text, str):
            parts.append(text)
        else:
            parts.append(f"[{getattr(block, 'type', 'content')} omitted]")
    return "\n".join(parts)


def _describe(error: BaseException) -> str:
    """A one-line description, looking inside exception groups."""
    if isinstance(error, BaseExceptionGroup):
        return "; ".join(_describe(inner) for inner in error.exceptions)
    text = str(error) or type(error).__name__
    return text if isinstance(error, MCPError | ToolError) else f"{type(error).__name__}: {text}"
