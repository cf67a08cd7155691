"""Request and input items -> harmony `Conversation` -> prompt tokens (sans-IO).

The conversation is: a system message (reasoning effort, date, built-in tool
namespaces), a developer message (instructions, function tools, MCP tool
namespaces) when there is anything to say, then the input items in order.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
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


def build_conversation(
    request: CreateRequest,
    items: Sequence[InputItem],
    *,
    date: str,
    tools: PromptTools = PromptTools(),
) -> Conversation:
    """The harmony conversation for ``request`` with history ``items``.

    ``items`` is the whole context: previous input and output when
    ``previous_response_id`` is used, then this request's input.

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

    calls: dict[str, str] = {}
    for index, item in enumerate(items):
        messages.extend(_item_messages(item, index, calls))
    return Conversation.from_messages(messages)


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


def _item_messages(item: InputItem, index: int, calls: dict[str, str]) -> list[Message]:
    """Harmony messages for one input item (``calls`` maps call_id -> name)."""
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
        return [Message.from_role_and_content(Role.ASSISTANT, item.text()).with_channel("analysis")]
    if isinstance(item, FunctionCallItem):
        calls[item.call_id] = item.name
        return [
            Message.from_role_and_content(Role.ASSISTANT, item.arguments)
            .with_channel("commentary")
            .with_recipient(f"functions.{item.name}")
            .with_content_type("json")
        ]
    if isinstance(item, FunctionCallOutputItem):
        name = calls.get(item.call_id)
        if name is None:
            raise InvalidRequestError(
                f"No function call found for function_call_output with call_id "
                f"{item.call_id!r}. Include the function_call item (or use "
                "previous_response_id) before its output.",
                param=f"input[{index}].call_id",
            )
        return [_tool_message(f"functions.{name}", item.text(), "commentary")]
    if isinstance(item, CodeInterpreterCallItem):
        messages = [
            Message.from_role_and_content(Role.ASSISTANT, item.code or "")
            .with_channel("analysis")
            .with_recipient("python")
            .with_content_type("code")
        ]
        logs = "".join(
            str(output.get("logs", "")) for output in item.outputs or [] if isinstance(output, dict)
        )
        messages.append(_tool_message("python", logs, "analysis"))
        return messages
    if isinstance(item, McpCallItem):
        recipient = f"{item.server_label}.{item.name}"
        return [
            Message.from_role_and_content(Role.ASSISTANT, item.arguments)
            .with_channel("commentary")
            .with_recipient(recipient)
            .with_content_type("json"),
            _tool_message(recipient, _mcp_result_text(item), "commentary"),
        ]
    # mcp_list_tools, approval requests/responses and web search calls carry no
    # conversation text: their effect is in the tool namespaces and in the job.
    return []


def _tool_message(author: str, text: str, channel: str) -> Message:
    return (
        Message.from_author_and_content(Author.new(Role.TOOL, author), text)
        .with_channel(channel)
        .with_recipient("assistant")
    )


def _mcp_result_text(item: McpCallItem) -> str:
    if item.error is not None:
        return f"Error: {item.error}"
    return item.output or ""


def tool_description(
    name: str, description: str | None, schema: dict[str, Any] | None
) -> ToolDescription:
    """A harmony tool description (for MCP namespaces)."""
    return ToolDescription.new(name, description or "", schema)
