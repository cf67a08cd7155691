"""Request and input items -> harmony `Conversation` -> prompt tokens (sans-IO).

The conversation is: a system message (reasoning effort, date, built-in tool
namespaces), a developer message (instructions, function tools, MCP tool
namespaces) when there is anything to say, then the input items in order.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from openai_harmony import (
    Author,
    Conversation,
    DeveloperContent,
    Message,
    ReasoningEffort,
    Role,
    SystemContent,
    ToolDescription,
    ToolNamespaceConfig,
)

from .._exceptions import InvalidRequestError
from ..protocol.request import (
    CodeInterpreterCallItem,
    CreateRequest,
    FormatJsonObject,
    FormatJsonSchema,
    FunctionCallItem,
    FunctionCallOutputItem,
    InputItem,
    McpApprovalRequestItem,
    McpApprovalResponseItem,
    McpCallItem,
    MessageItem,
    ReasoningItem,
    ToolChoiceFunction,
)
from .encoding import get_encoding

_EFFORT = {
    "low": ReasoningEffort.LOW,
    "medium": ReasoningEffort.MEDIUM,
    "high": ReasoningEffort.HIGH,
}


@dataclass(frozen=True)
class ToolNamespace:
    """A namespace of callable tools shown to the model (MCP servers)."""

    name: str
    description: str | None
    tools: Sequence[ToolDescription]


@dataclass(frozen=True)
class PromptTools:
    """What the model may call, decided by the request and the server's tools."""

    python: bool = False
    browser: bool = False
    namespaces: Sequence[ToolNamespace] = field(default_factory=tuple)


DECLINED = "The user declined to run this tool call."


def build_conversation(
    request: CreateRequest,
    items: Sequence[InputItem],
    *,
    date: str,
    tools: PromptTools = PromptTools(),
    approval_results: Mapping[str, str] | None = None,
) -> Conversation:
    """The harmony conversation for ``request`` with history ``items``.

    ``items`` is the whole context: previous input and output when
    ``previous_response_id`` is used, then this request's input.
    ``approval_results`` maps an approved ``mcp_approval_request`` id to the
    output of the call it allowed (run by this response).

    Raises:
        InvalidRequestError: a ``function_call_output`` without its call.
    """
    hide_tools = request.tool_choice == "none"
    system = (
        SystemContent.new()
        .with_reasoning_effort(_EFFORT[request.reasoning_effort])
        .with_conversation_start_date(date)
    )
    if tools.python and not hide_tools:
        system = system.with_python_tool()
    if tools.browser and not hide_tools:
        system = system.with_browser_tool()
    messages = [Message.from_role_and_content(Role.SYSTEM, system)]

    developer = _developer_content(request, tools, hide_tools)
    if developer is not None:
        messages.append(Message.from_role_and_content(Role.DEVELOPER, developer))

    history = _History(items, approval_results or {})
    for index, item in enumerate(items):
        messages.extend(history.messages(item, index))
    return Conversation.from_messages(messages)


def render_request_prompt(
    request: CreateRequest,
    items: Sequence[InputItem],
    *,
    date: str,
    max_model_len: int,
    tools: PromptTools = PromptTools(),
    approval_results: Mapping[str, str] | None = None,
) -> list[int]:
    """The prompt tokens for a request, leaving room for output.

    With ``truncation: "auto"`` the oldest items are dropped until it fits.

    Raises:
        InvalidRequestError: the prompt does not fit (``context_length_exceeded``),
            or the history is inconsistent.
    """
    while True:
        prompt = render_prompt(
            build_conversation(
                request, items, date=date, tools=tools, approval_results=approval_results
            )
        )
        if len(prompt) < max_model_len:
            return prompt
        if request.truncation != "auto" or len(items) <= 1:
            raise InvalidRequestError(
                f"The input is {len(prompt)} tokens, which leaves no room for output in "
                f"this model's context window of {max_model_len} tokens. Shorten the input, "
                "or set 'truncation' to 'auto' to drop the oldest items.",
                param="input",
                code="context_length_exceeded",
            )
        items = _drop_oldest(items)


def _drop_oldest(items: Sequence[InputItem]) -> list[InputItem]:
    """Drop the oldest item, and any tool outputs left without their call."""
    rest = list(items[1:])
    while rest and isinstance(rest[0], FunctionCallOutputItem | McpApprovalResponseItem):
        rest = rest[1:]
    return rest or list(items[-1:])


def render_prompt(conversation: Conversation) -> list[int]:
    """Prompt tokens ending with ``<|start|>assistant``."""
    return get_encoding().render_conversation_for_completion(conversation, Role.ASSISTANT)


def render_tool_result(author: str, text: str, *, channel: str) -> list[int]:
    """Tokens of one tool-output message followed by ``<|start|>assistant``.

    Used inside a response: appended to the tokens generated so far, so the next
    turn sees its own analysis (harmony keeps it within a turn).
    """
    encoding = get_encoding()
    message = (
        Message.from_author_and_content(Author.new(Role.TOOL, author), text)
        .with_channel(channel)
        .with_recipient("assistant")
    )
    tokens = encoding.render(message)
    tokens.extend(encoding.encode("<|start|>assistant", allowed_special="all"))
    return tokens


def _developer_content(
    request: CreateRequest, tools: PromptTools, hide_tools: bool
) -> DeveloperContent | None:
    instructions: list[str] = []
    if request.instructions:
        instructions.append(request.instructions)
    text_format = request.text.format if request.text is not None else None
    if isinstance(text_format, FormatJsonSchema):
        described = f"// {text_format.description}\n" if text_format.description else ""
        instructions.append(
            f"# Response Formats\n\n## {text_format.name}\n\n{described}"
            + json.dumps(text_format.schema_, separators=(",", ":"))
        )
    elif isinstance(text_format, FormatJsonObject):
        instructions.append("Answer with a single JSON object.")
    choice = request.tool_choice
    if choice == "required":
        instructions.append("You must call one of the available tools before answering.")
    elif isinstance(choice, ToolChoiceFunction):
        instructions.append(f"You must call the function `{choice.name}` before answering.")

    functions = [] if hide_tools else request.function_tools
    namespaces = [] if hide_tools else list(tools.namespaces)
    if not instructions and not functions and not namespaces:
        return None
    content = DeveloperContent.new()
    if instructions:
        content = content.with_instructions("\n\n".join(instructions))
    if functions:
        content = content.with_function_tools(
            [
                ToolDescription.new(tool.name, tool.description or "", tool.parameters)
                for tool in functions
            ]
        )
    for namespace in namespaces:
        content = content.with_tools(
            ToolNamespaceConfig(
                name=namespace.name,
                description=namespace.description,
                tools=list(namespace.tools),
            )
        )
    return content


class _History:
    """Turns input items into harmony messages, with what later items need from earlier ones."""

    def __init__(self, items: Sequence[InputItem], approval_results: Mapping[str, str]) -> None:
        self._calls: dict[str, str] = {}  # function call_id -> name
        self._approval_requests = {
            item.id: item for item in items if isinstance(item, McpApprovalRequestItem)
        }
        self._executed = {
            item.approval_request_id
            for item in items
            if isinstance(item, McpCallItem) and item.approval_request_id
        }
        self._approval_results = approval_results

    def messages(self, item: InputItem, index: int) -> list[Message]:
        if isinstance(item, MessageItem):
            text = item.text()
            if item.role == "user":
                return [Message.from_role_and_content(Role.USER, text)]
            if item.role == "assistant":
                return [Message.from_role_and_content(Role.ASSISTANT, text).with_channel("final")]
            # Extra system/developer messages: harmony has one system message (ours),
            # so they are passed on as developer text in their place.
            return [Message.from_role_and_content(Role.DEVELOPER, text)]
        if isinstance(item, ReasoningItem):
            return [
                Message.from_role_and_content(Role.ASSISTANT, item.text()).with_channel("analysis")
            ]
        if isinstance(item, FunctionCallItem):
            self._calls[item.call_id] = item.name
            return [_call_message(f"functions.{item.name}", item.arguments, "commentary", "json")]
        if isinstance(item, FunctionCallOutputItem):
            name = self._calls.get(item.call_id)
            if name is None:
                raise InvalidRequestError(
                    f"No function call found for function_call_output with call_id "
                    f"{item.call_id!r}. Include the function_call item (or use "
                    "previous_response_id) before its output.",
                    param=f"input[{index}].call_id",
                )
            return [_tool_message(f"functions.{name}", item.text(), "commentary")]
        if isinstance(item, CodeInterpreterCallItem):
            logs = "".join(
                str(output.get("logs", ""))
                for output in item.outputs or []
                if isinstance(output, dict)
            )
            return [
                _call_message("python", item.code or "", "analysis", "code"),
                _tool_message("python", logs, "analysis"),
            ]
        if isinstance(item, McpCallItem):
            recipient = f"{item.server_label}.{item.name}"
            return [
                _call_message(recipient, item.arguments, "commentary", "json"),
                _tool_message(recipient, item.result_text(), "commentary"),
            ]
        if isinstance(item, McpApprovalResponseItem):
            return self._approval(item)
        # mcp_list_tools and approval requests carry no conversation text (tool lists
        # are in the namespaces; a request is rendered with its response); web search
        # calls keep no results to show.
        return []

    def _approval(self, item: McpApprovalResponseItem) -> list[Message]:
        request = self._approval_requests.get(item.approval_request_id)
        if request is None:
            return []
        result = self._approval_results.get(request.id)
        if result is None:
            if request.id in self._executed or item.approve:
                return []  # the mcp_call item that ran it shows call and output
            result = DECLINED
        recipient = f"{request.server_label}.{request.name}"
        return [
            _call_message(recipient, request.arguments, "commentary", "json"),
            _tool_message(recipient, result, "commentary"),
        ]


def _call_message(recipient: str, body: str, channel: str, content_type: str) -> Message:
    return (
        Message.from_role_and_content(Role.ASSISTANT, body)
        .with_channel(channel)
        .with_recipient(recipient)
        .with_content_type(content_type)
    )


def _tool_message(author: str, text: str, channel: str) -> Message:
    return (
        Message.from_author_and_content(Author.new(Role.TOOL, author), text)
        .with_channel(channel)
        .with_recipient("assistant")
    )


def tool_description(
    name: str, description: str | None, schema: dict[str, Any] | None
) -> ToolDescription:
    """A harmony tool description (for MCP namespaces)."""
    return ToolDescription.new(name, description or "", schema)
