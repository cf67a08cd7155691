"""The tools one response may use: routing the model's calls, running them.

A `Toolbox` is built per job from the request's ``tools`` and the server's
`ToolServerPool`. It decides where a recipient goes (`route`), lists and calls
MCP tools, and owns the job's per-request MCP sessions: one `McpSession` per
``server_url`` server, opened on first use (in the job's nursery, by its own
owner task) and closed when the job ends (`aclose`).

A built-in tool's call runs as its descriptor's `Runner` says (`tools.builtin`):
on the configured tool server of its label, or, for MCP, on the server the
recipient names. A runner with ``run_slots`` holds a slot of the response's API key
and one of the server's while it runs (`tools.budget.RunSlots`), when the server
runs the bundled python tool (``--code-interpreter``).

`check_request_tools` is the part that runs before a job exists: it turns a
request the server cannot serve into a 400.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, final

import trio
from mcp_types import (
    CONNECTION_CLOSED,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    REQUEST_TIMEOUT,
)

from .._exceptions import InvalidRequestError, StoreError
from ..harmony.translator import Route, ToolCall
from ..metrics import IncDec
from ..protocol.request import (
    CreateRequest,
    McpApprovalFilter,
    McpTool,
    McpToolFilter,
)
from ..protocol.tool_params import TOOL_SEARCH
from .budget import RunsBusy, RunSlots
from .builtin import (
    NAMESPACES,
    BuiltinTool,
    BuiltinToolParam,
    CallContext,
    requested_namespaces,
    tool_for_param,
)
from .builtin._mcp_headers import mcp_headers
from .builtin.mcp import TOOL as MCP
from .containers import ContainerUnavailable, ResponseContainer
from .hosts import HostNotAllowed, allowed_hosts
from .pool import ToolServer, ToolServerPool
from .session import McpSession, ToolError, ToolInfo, ToolResult, strict_json
from .transport import connect_checked

RESERVED_LABELS = frozenset({"functions", "assistant", *NAMESPACES})
"""Labels an MCP server cannot have: namespaces of the prompt's own."""


def check_request_tools(
    request: CreateRequest,
    pool: ToolServerPool,
    allow_hosts: Sequence[str],
    *,
    containers: bool = False,
) -> None:
    """Raise `InvalidRequestError` for tools this server cannot provide.

    ``containers``: the server runs the code interpreter's containers itself.
    """
    labels: set[str] = set()
    for index, tool in enumerate(request.tools):
        builtin = tool_for_param(tool)
        server = builtin.runner.server if builtin is not None else None
        if (
            builtin is not None
            and server is not None
            and server not in pool
            and builtin.runner.unconfigured is None
            and not (builtin.runner.containers and containers)
        ):
            raise InvalidRequestError(
                builtin.runner.missing.format(type=tool.type),
                param=f"tools[{index}]",
            )
        if not isinstance(tool, McpTool):
            continue
        label = tool.server_label
        if label in labels:
            raise InvalidRequestError(
                f"Duplicate MCP server_label {label!r}.", param=f"tools[{index}].server_label"
            )
        labels.add(label)
        if label in RESERVED_LABELS:
            raise InvalidRequestError(
                f"server_label {label!r} is reserved; choose another.",
                param=f"tools[{index}].server_label",
            )
        if tool.server_url is None:
            if label not in pool:
                configured = ", ".join(repr(name) for name in pool.labels) or "none"
                raise InvalidRequestError(
                    f"MCP tool {label!r} has no server_url and this server has no tool server "
                    f"with that label (configured: {configured}).",
                    param=f"tools[{index}].server_url",
                )
            continue
        check_mcp_url(tool.server_url, allow_hosts, param=f"tools[{index}].server_url")


def check_mcp_url(url: str, allow_hosts: Sequence[str], *, param: str) -> None:
    """Raise `InvalidRequestError` unless ``url`` is http(s) on an allowed host.

    A host name that only address patterns can allow passes here; its address
    is checked when its session connects (`tools.hosts`).
    """
    try:
        allowed_hosts(tuple(allow_hosts)).check_url(url)
    except HostNotAllowed as refused:
        raise InvalidRequestError(str(refused), param=param) from None


@dataclass(frozen=True)
class McpServerUse:
    """An MCP server as one request uses it."""

    label: str
    description: str | None
    url: str | None
    headers: Mapping[str, str]
    allowed: frozenset[str] | None
    approval_by_default: bool
    """Whether a tool not named in ``approval_exceptions`` needs approval."""
    approval_exceptions: frozenset[str]

    @classmethod
    def of(cls, tool: McpTool) -> McpServerUse:
        allowed: frozenset[str] | None = None
        if isinstance(tool.allowed_tools, list):
            allowed = frozenset(tool.allowed_tools)
        elif isinstance(tool.allowed_tools, McpToolFilter) and tool.allowed_tools.tool_names:
            allowed = frozenset(tool.allowed_tools.tool_names)
        return cls(
            label=tool.server_label,
            description=tool.server_description,
            url=tool.server_url,
            headers=mcp_headers(tool),
            allowed=allowed,
            **_approval(tool.require_approval),
        )

    def allows(self, name: str) -> bool:
        return self.allowed is None or name in self.allowed

    def needs_approval(self, name: str) -> bool:
        return self.approval_by_default != (name in self.approval_exceptions)


def _approval(policy: str | McpApprovalFilter | None) -> dict[str, Any]:
    """``require_approval`` as a default and the tools that differ from it.

    ``always`` (the default) and ``never`` apply to every tool. A filter names
    tools: with ``never`` present, every tool needs approval except those
    listed there (and not under ``always``); with only ``always``, only the
    tools listed there need it.
    """
    if not isinstance(policy, McpApprovalFilter):
        return {"approval_by_default": policy != "never", "approval_exceptions": frozenset()}
    always = frozenset(policy.always.tool_names or ()) if policy.always else frozenset()
    if policy.never is not None:
        never = frozenset(policy.never.tool_names or ())
        return {"approval_by_default": True, "approval_exceptions": never - always}
    return {"approval_by_default": False, "approval_exceptions": always}


@final
class Toolbox:
    """Routing and calling for one response. Its sessions live in ``nursery``.

    ``allow_hosts`` are the ``--mcp-allow-host`` patterns: each per-request
    session checks its host against them when it connects, and connects to the
    address it checked (`tools.transport.connect_checked`). Without patterns
    every ``server_url`` is refused.
    """

    def __init__(
        self,
        request: CreateRequest,
        pool: ToolServerPool,
        *,
        nursery: trio.Nursery,
        tool_timeout_s: float,
        close_timeout_s: float,
        allow_hosts: Sequence[str] = (),
        open_sessions: IncDec | None = None,
        python_slots: RunSlots | None = None,
        owner: str | None = None,
        response_id: str = "",
        container: ResponseContainer | None = None,
    ) -> None:
        self._request = request
        self._container = container
        self._response_id = response_id
        self._pool = pool
        self._run_slots = python_slots
        self._owner = owner
        self._open_sessions = open_sessions
        self._allowed = allowed_hosts(tuple(allow_hosts))
        self._nursery = nursery
        self._timeout_s = tool_timeout_s
        self._close_timeout_s = close_timeout_s
        hidden = request.tool_choice == "none"
        self.builtin = frozenset() if hidden else requested_namespaces(request.tools)
        """The namespaces of the built-in tools this response may call."""
        self.mcp = {} if hidden else {t.server_label: McpServerUse.of(t) for t in request.mcp_tools}
        self.custom = frozenset(tool.name for tool in request.custom_tools)
        """The names of the request's custom tools (called as ``functions.NAME``)."""
        self.namespaces = {
            tool.name: frozenset(function.name for function in tool.tools)
            for tool in ([] if hidden else request.namespace_tools)
        }
        """The function names of each of the request's namespace tools."""
        self._may_call = request.may_call
        self._tool_search = request.tool_search is not None
        self._sessions: dict[str, McpSession] = {}

    # -- routing ---------------------------------------------------------------------

    def route(self, recipient: str) -> Route:
        if not self._may_call(recipient):
            return "unknown"
        if recipient.startswith("functions."):
            if recipient[10:] == TOOL_SEARCH and self._tool_search:
                return "tool_search"
            return "custom" if recipient[10:] in self.custom else "function"
        label, _, name = recipient.partition(".")
        if name in self.namespaces.get(label, ()):
            return "function"
        tool = NAMESPACES.get(label)
        if tool is not None:
            return tool if label in self.builtin and tool.harmony.calls(recipient) else "unknown"
        server = self.mcp.get(label)
        if server is None or not name:
            return "unknown"
        if server.allows(name) and server.needs_approval(name):
            return "mcp_approval"
        return MCP

    # -- MCP listings ------------------------------------------------------------------

    async def list_tools(self, label: str) -> list[ToolInfo]:
        """The tools of MCP server ``label`` this request may use.

        Raises:
            ToolError: the server could not be reached or failed.
        """
        server = self.mcp[label]
        if server.url is None:
            configured = self._configured(label)
            if configured.state != "ready":
                raise ToolError(
                    f"The tool server {label!r} is not connected ({configured.state}).",
                    code=CONNECTION_CLOSED,
                )
            tools = configured.tools
        else:
            session = self._session(server.label, server.url, server.headers)
            tools = await session.list_tools(timeout_s=self._timeout_s)
        return [tool for tool in tools if server.allows(tool.name)]

    # -- calls ---------------------------------------------------------------------------

    async def call(self, call: ToolCall) -> ToolResult:
        """Run a built-in or MCP tool call.

        Raises:
            ToolError: the call could not be made or got no answer (the server
                is down, failed, timed out); a tool that ran and reported an
                error returns ``is_error`` instead.

        Cancellation: cancels the call (only it); the session stays usable.
        """
        return await self._call(call)

    async def _call(self, call: ToolCall) -> ToolResult:
        tool = call.tool
        if tool is None:
            raise ToolError(f"{call.recipient!r} is not a built-in tool.", code=METHOD_NOT_FOUND)
        runner = tool.runner
        name = runner.tool(call.recipient)
        if runner.arguments is not None:
            arguments = runner.arguments(call.arguments)
        else:
            arguments = _arguments(call.arguments)
        if runner.containers and self._container is not None:
            return await self._in_container(self._container, str(arguments.get("code", "")))
        if (
            runner.server is not None
            and runner.unconfigured is not None
            and self._pool.get(runner.server) is None
        ):
            raise ToolError(runner.unconfigured, code=METHOD_NOT_FOUND)
        if runner.server is not None:
            arguments |= self._context(tool, runner.server, name)
            return await self._call_server(runner.server, name, arguments, runner.run_slots)
        label = call.recipient.partition(".")[0]
        server = self.mcp[label]
        if not server.allows(name):
            raise ToolError(
                f"The tool {name!r} of MCP server {label!r} is not allowed here.",
                code=METHOD_NOT_FOUND,
            )
        if server.url is None:
            return await self._configured(label).call_tool(
                name, arguments, timeout_s=self._timeout_s
            )
        session = self._session(server.label, server.url, server.headers)
        return await session.call_tool(name, arguments, timeout_s=self._timeout_s)

    async def _call_server(
        self, label: str, name: str, arguments: dict[str, Any], run_slots: bool
    ) -> ToolResult:
        """Call ``name`` on configured server ``label``; with ``run_slots`` (and
        `RunSlots`), once a slot of this response's key and one of the server's are
        free. Waiting counts against the call's timeout."""
        server = self._configured(label)
        if not run_slots or self._run_slots is None:
            return await server.call_tool(name, arguments, timeout_s=self._timeout_s)
        deadline = trio.current_time() + self._timeout_s
        try:
            async with self._run_slots.hold(self._owner, wait_s=self._timeout_s):
                return await server.call_tool(
                    name, arguments, timeout_s=deadline - trio.current_time()
                )
        except RunsBusy as busy:
            raise ToolError(str(busy), code=REQUEST_TIMEOUT) from None

    async def _in_container(self, container: ResponseContainer, code: str) -> ToolResult:
        """Run ``code`` in the response's container, once a slot of this response's
        key and one of the server's are free; waiting counts against the timeout."""
        deadline = trio.current_time() + self._timeout_s
        try:
            async with contextlib.AsyncExitStack() as stack:
                if self._run_slots is not None:
                    await stack.enter_async_context(
                        self._run_slots.hold(self._owner, wait_s=self._timeout_s)
                    )
                with trio.move_on_at(deadline):
                    return await container.call(code)
                raise ToolError(
                    f"The code did not finish within {self._timeout_s:g} s.",
                    code=REQUEST_TIMEOUT,
                )
        except RunsBusy as busy:
            raise ToolError(str(busy), code=REQUEST_TIMEOUT) from None
        except ContainerUnavailable as unavailable:
            raise ToolError(str(unavailable), code=INVALID_REQUEST) from None
        except StoreError:
            raise ToolError(
                "The container's files could not be read or written (the store failed).",
                code=INTERNAL_ERROR,
            ) from None

    def _context(self, tool: BuiltinTool, label: str, name: str) -> dict[str, Any]:
        """The runner's own arguments (`Runner.context`) that tool ``name`` of
        server ``label`` declares."""
        server = self._pool.get(label)
        entry = next(
            (
                entry
                for entry in self._request.tools
                if isinstance(entry, BuiltinToolParam) and tool_for_param(entry) is tool
            ),
            None,
        )
        if tool.runner.context is None or server is None or entry is None:
            return {}
        declared = next((t.input_schema for t in server.tools if t.name == name), {})
        properties = declared.get("properties")
        if not isinstance(properties, dict):
            return {}
        context = CallContext(
            entry=entry,
            response_id=self._response_id,
            conversation_id=self._request.conversation_id,
            previous_response_id=self._request.previous_response_id,
        )
        return {k: v for k, v in tool.runner.context(context).items() if k in properties}

    def _configured(self, label: str) -> ToolServer:
        server = self._pool.get(label)
        if server is None:
            raise ToolError(f"No tool server {label!r} is configured.", code=METHOD_NOT_FOUND)
        return server

    def _session(self, label: str, url: str, headers: Mapping[str, str]) -> McpSession:
        """The per-request session of ``label``, opened (again) if needed.

        Raises:
            ToolError: ``url`` is not allowed (``--mcp-allow-host``).
        """
        session = self._sessions.get(label)
        if session is None or session.ended:
            try:
                connect = connect_checked(url, headers, self._allowed)
            except HostNotAllowed as refused:
                raise ToolError(str(refused), code=INVALID_REQUEST) from None
            session = McpSession(
                label,
                connect,
                connect_timeout_s=self._timeout_s,
                close_timeout_s=self._close_timeout_s,
                open_sessions=self._open_sessions,
            )
            self._sessions[label] = session
            self._nursery.start_soon(session.run, name=f"mcp session {label}")
        return session

    async def aclose(self) -> None:
        """Close the per-request sessions and wait for their owners (bounded).

        Each owner says goodbye to its server (an HTTP session is deleted, a
        child process ends) within ``close_timeout_s``, then is cancelled.
        """
        for session in self._sessions.values():
            session.close()
        with trio.move_on_after(self._close_timeout_s + 1):
            for session in self._sessions.values():
                await session.wait_ended()


def _arguments(text: str) -> dict[str, Any]:
    if not text.strip():
        return {}
    try:
        # What the model wrote may escape a lone surrogate or say NaN: neither can be sent.
        value = strict_json(json.loads(text))
    except (ValueError, RecursionError) as error:  # JSONDecodeError, a 4,300-digit integer
        raise ToolError(
            f"The call's arguments are not valid JSON: {error}.", code=INVALID_PARAMS
        ) from None
    if not isinstance(value, dict):
        raise ToolError("The call's arguments must be a JSON object.", code=INVALID_PARAMS)
    return value


def tool_json(tool: ToolInfo) -> dict[str, Any]:
    """A tool as an ``mcp_list_tools`` item lists it."""
    listed: dict[str, Any] = {"name": tool.name, "input_schema": tool.input_schema}
    if tool.description is not None:
        listed["description"] = tool.description
    if tool.annotations:
        listed["annotations"] = tool.annotations
    return listed
