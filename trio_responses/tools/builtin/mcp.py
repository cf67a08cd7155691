"""``mcp``: the tools of a remote MCP server, named by the request.

A ``{"type": "mcp", "server_label": LABEL, ...}`` entry makes the server's tools a
namespace of the developer message (listed first as an ``mcp_list_tools`` item);
the model calls ``LABEL.TOOL`` on the commentary channel with JSON arguments. The
call is an ``mcp_call`` item, or, when the entry requires approval, an
``mcp_approval_request`` that ends the response until an
``mcp_approval_response`` answers it. The server is the request's ``server_url``
(a session of the response's own) or the tool server configured with that label;
`tools.toolbox` owns sessions, listings and the approval policy.

This module holds the request models of MCP: the ``tools[]`` entry and the four
item types (`protocol.request` exports them with the rest).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from ..._exceptions import InvalidRequestError
from ...protocol.ids import new_id
from ._descriptor import (
    STRICT,
    BuiltinItem,
    BuiltinTool,
    BuiltinToolParam,
    HarmonyTool,
    Runner,
    ScriptDirective,
    ToolItem,
    json_object_at,
    tool_after_dot,
)
from ._mcp_headers import check_mcp_tool

# -- request models ---------------------------------------------------------------------


class McpToolFilter(BaseModel):
    model_config = STRICT
    tool_names: list[str] | None = None
    read_only: bool | None = None


class McpApprovalFilter(BaseModel):
    model_config = STRICT
    always: McpToolFilter | None = None
    never: McpToolFilter | None = None


class McpTool(BuiltinToolParam):
    model_config = STRICT
    type: Literal["mcp"]
    server_label: Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]
    server_url: str | None = None
    headers: dict[str, str] | None = None
    authorization: str | None = None
    allowed_tools: list[str] | McpToolFilter | None = None
    require_approval: Literal["always", "never"] | McpApprovalFilter | None = None
    server_description: str | None = None
    connector_id: str | None = None
    defer_loading: bool | None = None
    allowed_callers: list[str] | None = None


class McpListToolsItem(BuiltinItem):
    model_config = STRICT
    type: Literal["mcp_list_tools"]
    id: str
    server_label: str
    tools: list[dict[str, Any]]
    error: str | None = None


class McpCallItem(BuiltinItem):
    model_config = STRICT
    type: Literal["mcp_call"]
    id: str
    server_label: str
    name: str
    arguments: str
    output: str | None = None
    error: str | dict[str, Any] | None = None
    approval_request_id: str | None = None
    status: str | None = None

    def result_text(self) -> str:
        """What the model read after this call: the output, or the error."""
        error = self.error
        if error is None:
            return self.output or ""
        if isinstance(error, str):
            return f"Error: {error}"
        if "message" in error:
            return f"Error: {error['message']}"
        content = error.get("content")
        texts = (
            [str(part.get("text", "")) for part in content or [] if isinstance(part, dict)]
            if isinstance(content, list)
            else [str(content)]
        )
        return "Error: " + "\n".join(texts)


class McpApprovalRequestItem(BuiltinItem):
    model_config = STRICT
    type: Literal["mcp_approval_request"]
    id: str
    server_label: str
    name: str
    arguments: str


class McpApprovalResponseItem(BuiltinItem):
    model_config = STRICT
    type: Literal["mcp_approval_response"]
    approval_request_id: str
    approve: bool
    id: str | None = None
    reason: str | None = None


def _check(tool: McpTool, index: int) -> None:
    if tool.connector_id is not None:
        raise InvalidRequestError(
            "MCP connectors are not supported by this server; use 'server_url' "
            "or a server configured with --tool-server.",
            param=f"tools[{index}].connector_id",
            code="unsupported_parameter",
        )
    check_mcp_tool(tool, index)


# -- the call item --------------------------------------------------------------------------


def _new_item(recipient: str) -> dict[str, Any]:
    label, _, name = recipient.partition(".")
    return {
        "id": new_id("mcp"),
        "type": "mcp_call",
        "server_label": label,
        "name": name,
        "arguments": "",
        "status": "in_progress",
    }


def _record_result(
    item: dict[str, Any],
    output: str,
    *,
    ok: bool,
    error: dict[str, Any] | None,
    approval_request_id: str | None,
) -> None:
    if approval_request_id is not None:
        item["approval_request_id"] = approval_request_id
    if ok:
        item["output"] = output
    else:
        item["error"] = error or {
            "type": "mcp_tool_execution_error",
            "content": [{"type": "text", "text": output}],
        }


def _history(item: McpCallItem) -> tuple[str, str, str]:
    return f"{item.server_label}.{item.name}", item.arguments, item.result_text()


_DIRECTIVE = re.compile(r"mcp:([A-Za-z0-9_-]+)\.([A-Za-z0-9_.-]+)[ \t]*")


def _directives(text: str) -> list[tuple[int, str, str]]:
    """Every ``mcp:LABEL.TOOL {json}``."""
    found = []
    for match in _DIRECTIVE.finditer(text):
        arguments = json_object_at(text, match.end())
        if arguments is not None:
            found.append((match.start(), f"{match[1]}.{match[2]}", arguments))
    return found


TOOL = BuiltinTool(
    name="mcp",
    param=McpTool,
    listed_types=("mcp",),
    input_items=(McpListToolsItem, McpCallItem, McpApprovalRequestItem, McpApprovalResponseItem),
    check=_check,
    echo_exclude=frozenset({"headers", "authorization"}),
    item=ToolItem(
        type="mcp_call",
        id_prefix="mcp",
        new=_new_item,
        in_progress="response.mcp_call.in_progress",
        input_delta="response.mcp_call_arguments.delta",
        input_field="arguments",
        input_done="response.mcp_call_arguments.done",
        completed="response.mcp_call.completed",
        failed="response.mcp_call.failed",
        record_result=_record_result,
    ),
    harmony=HarmonyTool(
        namespace=None, channel="commentary", content_type="json", history=_history
    ),
    runner=Runner(server=None, tool=tool_after_dot),
    metrics_label="mcp",
    example={
        "type": "mcp",
        "server_label": "echo",
        "server_url": "https://mcp.example/mcp",
        "require_approval": "never",
    },
    script=ScriptDirective(find=_directives, example='mcp:echo.say {"text": "hi"}'),
)
