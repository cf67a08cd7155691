"""Preparing a create request: validation, the prompt plan, the prompt (no I/O).

`prepare` turns a parsed request and the conversation before it into a
`PreparedRequest`: everything a job needs to start, decided before any job
exists. It is pure and synchronous: it reads the config and the tool pool's
labels, never a store or the network; loading the previous conversation is the
service's business.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._config import Config
from ._exceptions import InvalidRequestError, ModelNotFoundError
from ._generation import PromptPlan
from .harmony.fit import render_request_prompt
from .harmony.prompt import PromptTools, ToolNamespace, tool_description
from .protocol.ids import IdPrefix, new_id
from .protocol.request import (
    CreateRequest,
    InputItem,
    McpApprovalRequestItem,
    McpApprovalResponseItem,
    McpListToolsItem,
    MessageItem,
    parse_input_item,
)
from .tools.builtin import requested_namespaces
from .tools.pool import ToolServerPool
from .tools.toolbox import McpServerUse, check_request_tools

if TYPE_CHECKING:
    from ._files import ContainerPlan

_ITEM_ID_PREFIX: dict[str, IdPrefix] = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "custom_tool_call": "ctc",
    "custom_tool_call_output": "ctco",
    "tool_search_call": "tsc",
    "tool_search_output": "tso",
    "reasoning": "rs",
    "mcp_approval_response": "mcpr",
    "compaction": "cmp",
}

_NO_STATUS = frozenset(
    {"mcp_list_tools", "mcp_approval_request", "mcp_approval_response", "compaction"}
)
"""Item types whose OpenAI schema has no ``status`` (so a listed item echoed back
as input is accepted again)."""


@dataclass(frozen=True)
class PreparedRequest:
    """A validated request, ready to become a job."""

    request: CreateRequest
    input_items: list[dict[str, Any]]
    """This request's input items as stored and listed (each with an ``id``)."""
    plan: PromptPlan
    prompt_tokens: list[int]
    seal_reasoning: Callable[[str], str] | None = None
    """Seals a reasoning item's text as its ``encrypted_content`` (``include``
    ``reasoning.encrypted_content``); set by the service, which knows the owner."""
    context_ids: tuple[str, ...] | None = None
    """With ``conversation``: the ids of the conversation's items, in order, that the
    prompt was rendered from (checked again under the conversation's lock)."""
    request_bytes: int | None = None
    """The size of the request's JSON, where known (bytes, or `estimated_size`'s
    estimate): it bounds the response's first record (`first_record_bound`)."""
    container: ContainerPlan | None = None
    """The container the code interpreter's calls run in (``--code-interpreter``
    and a request offering it); set by the service (`FilesAPI.plan`)."""


Unseal = Callable[[InputItem, str | None], InputItem]
"""Opens an item's sealed content for the prompt: (item, ``input[i]`` or None for an
item of the previous conversation) -> the item the model reads."""


def check_request(request: CreateRequest, config: Config, pool: ToolServerPool) -> None:
    """What can be checked before loading anything: model, tool count, tool servers.

    Raises:
        ModelNotFoundError, InvalidRequestError: with ``param`` naming the field.
    """
    if request.model not in config.model_names:
        served = ", ".join(repr(name) for name in config.model_names)
        raise ModelNotFoundError(
            f"The model {request.model!r} does not exist on this server. Served models: {served}.",
            param="model",
        )
    if len(request.tools) > config.max_tools:
        raise InvalidRequestError(
            f"Too many tools: {len(request.tools)}; this server accepts at most "
            f"{config.max_tools}.",
            param="tools",
        )
    check_request_tools(request, pool, config.mcp_allow_hosts, containers=config.code_interpreter)


def prepare(
    request: CreateRequest,
    context: list[dict[str, Any]],
    *,
    config: Config,
    date: str | None = None,
    unseal: Unseal | None = None,
    request_bytes: int | None = None,
) -> PreparedRequest:
    """Plan and render the prompt of ``request`` after ``context`` (earlier turns).

    Call `check_request` first. ``request_bytes``: see `PreparedRequest`.

    Raises:
        InvalidRequestError: too many items, an approval that answers nothing,
            a conversation that cannot fit the context window, sealed content
            that does not open (``unseal``).
    """
    input_items = [stored_item(item) for item in request.input_items]
    if len(context) + len(input_items) > config.max_input_items:
        raise InvalidRequestError(
            f"Too many input items: {len(context) + len(input_items)} (including the "
            f"previous response's); this server accepts at most {config.max_input_items}.",
            param="input",
        )
    items = [parse_input_item(item) for item in (*context, *input_items)]
    if unseal is not None:  # the stored items keep what was sent; the prompt gets the text
        items = [
            unseal(item, None if index < len(context) else f"input[{index - len(context)}]")
            for index, item in enumerate(items)
        ]
    # Tools a tool_search_output item loaded join those the model sees.
    request = request.with_loaded_tools(items)
    plan = _plan(request, items, date or datetime.datetime.now(datetime.UTC).date().isoformat())
    prompt = render_request_prompt(
        request,
        plan.items,
        date=plan.date,
        max_model_len=config.max_model_len,
        tools=plan.tools,
    )
    return PreparedRequest(
        request=request,
        input_items=input_items,
        plan=plan,
        prompt_tokens=list(prompt),
        request_bytes=request_bytes,
    )


def _plan(request: CreateRequest, items: list[InputItem], date: str) -> PromptPlan:
    """What the prompt needs: known tool namespaces, listings and approvals to do."""
    hidden = request.tool_choice == "none"
    listed = {
        item.server_label: item.tools
        for item in items
        if isinstance(item, McpListToolsItem) and item.error is None
    }
    namespaces: list[ToolNamespace] = []
    to_list: list[str] = []
    for tool in [] if hidden else request.mcp_tools:
        use = McpServerUse.of(tool)
        if use.label not in listed:
            to_list.append(use.label)
            continue
        namespaces.append(
            ToolNamespace(
                use.label,
                use.description,
                [
                    tool_description(
                        str(t.get("name")), t.get("description"), t.get("input_schema")
                    )
                    for t in listed[use.label]
                    if use.allows(str(t.get("name")))
                ],
            )
        )
    requests = {item.id: item for item in items if isinstance(item, McpApprovalRequestItem)}
    labels = {tool.server_label for tool in request.mcp_tools}
    approvals = []
    for index, item in enumerate(request.input_items):
        if not isinstance(item, McpApprovalResponseItem):
            continue
        approval_request = requests.get(item.approval_request_id)
        if approval_request is None:
            raise InvalidRequestError(
                f"No mcp_approval_request with id {item.approval_request_id!r} in this "
                "conversation; answer a request from the previous response.",
                param=f"input[{index}].approval_request_id",
            )
        if approval_request.server_label not in labels:
            raise InvalidRequestError(
                f"The approved call is for MCP server {approval_request.server_label!r}; "
                "declare that server in 'tools' again.",
                param="tools",
            )
        approvals.append((item, approval_request))
    return PromptPlan(
        items=items,
        date=date,
        tools=PromptTools(
            builtin=frozenset() if hidden else requested_namespaces(request.tools),
            namespaces=tuple(namespaces),
        ),
        to_list=tuple(to_list),
        approvals=tuple(approvals),
    )


def stored_item(item: InputItem) -> dict[str, Any]:
    """An input item as stored and listed: typed, with an id, content as parts."""
    stored: dict[str, Any] = item.model_dump(exclude_none=True, by_alias=True)
    if isinstance(item, MessageItem):
        stored["type"] = "message"
        part_type = "output_text" if item.role == "assistant" else "input_text"
        if isinstance(item.content, str):
            part: dict[str, Any] = {"type": part_type, "text": item.content}
            if part_type == "output_text":
                part["annotations"] = []
            stored["content"] = [part]
    if stored["type"] not in _NO_STATUS:
        stored.setdefault("status", "completed")
    if "id" not in stored:
        stored["id"] = new_id(_ITEM_ID_PREFIX.get(stored["type"], "msg"))
    return stored
