"""Request and input items -> harmony `Conversation` -> prompt tokens (sans-IO).

The conversation is: a system message (reasoning effort, date, the namespaces of
built-in tools: `tools.builtin`), a developer message (instructions, function tools, MCP tool
namespaces) when there is anything to say, then the input items in order.
Fitting it into the context window (``truncation``) is `fit.render_request_prompt`'s job.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
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
from ..protocol.codec import encode_ascii_json, encode_json
from ..protocol.request import (
    CreateRequest,
    CustomTool,
    CustomToolCallItem,
    CustomToolCallOutputItem,
    FormatJsonObject,
    FormatJsonSchema,
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionTool,
    InputItem,
    McpApprovalRequestItem,
    McpApprovalResponseItem,
    McpCallItem,
    MessageItem,
    NamespaceTool,
    ReasoningItem,
    ToolChoiceAllowed,
    ToolChoiceCustom,
    ToolChoiceFunction,
    ToolSearchCallItem,
    ToolSearchOutputItem,
)
from ..protocol.tool_params import TOOL_SEARCH, TOOL_SEARCH_DESCRIPTION
from ..tools.builtin import NAMESPACES, tool_of_call_item
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

    builtin: frozenset[str] = frozenset()
    """The namespaces of the built-in tools shown in the system message (``python``)."""
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
    messages = head_messages(request, date=date, tools=tools)
    history = _History(items, approval_results or {})
    for index, item in enumerate(items):
        messages.extend(history.messages(item, index))
    return Conversation.from_messages(messages)


def head_messages(request: CreateRequest, *, date: str, tools: PromptTools) -> list[Message]:
    """The messages before the input items: system, then developer when it has anything."""
    messages = [SystemSettings.of(request, date=date, tools=tools).message()]
    developer = developer_message(request, tools)
    if developer is not None:
        messages.append(developer)
    return messages


@dataclass(frozen=True)
class SystemSettings:
    """Everything the system message of a request depends on (hashable: a cache key)."""

    effort: str
    date: str
    tools: tuple[str, ...]
    """The namespaces of the built-in tools shown, in the registry's order."""

    @classmethod
    def of(cls, request: CreateRequest, *, date: str, tools: PromptTools) -> SystemSettings:
        hidden = request.tool_choice == "none"
        shown = () if hidden else tuple(name for name in NAMESPACES if name in tools.builtin)
        return cls(request.reasoning_effort, date, shown)

    def message(self) -> Message:
        system = (
            SystemContent.new()
            .with_reasoning_effort(_EFFORT[self.effort])
            .with_conversation_start_date(self.date)
        )
        for namespace in self.tools:
            show = NAMESPACES[namespace].harmony.system
            if show is not None:
                system = show(system)
        return Message.from_role_and_content(Role.SYSTEM, system)


def developer_message(request: CreateRequest, tools: PromptTools) -> Message | None:
    """The developer message (instructions, function tools, MCP namespaces); None
    when there is nothing to say."""
    content = _developer_content(request, tools, request.tool_choice == "none")
    return None if content is None else Message.from_role_and_content(Role.DEVELOPER, content)


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
            # ASCII-escaped: the prompt's tokens (and what a cache holds) depend on it.
            + encode_ascii_json(text_format.schema_)
        )
    elif isinstance(text_format, FormatJsonObject):
        instructions.append("Answer with a single JSON object.")
    choice = request.tool_choice
    if choice == "required" or (
        isinstance(choice, ToolChoiceAllowed) and choice.mode == "required"
    ):
        instructions.append("You must call one of the available tools before answering.")
    elif isinstance(choice, ToolChoiceFunction):
        instructions.append(f"You must call the function `{choice.name}` before answering.")
    elif isinstance(choice, ToolChoiceCustom):
        instructions.append(f"You must call the tool `{choice.name}` before answering.")

    may_call = request.may_call
    functions = [] if hide_tools else request.function_tools
    functions = [tool for tool in functions if may_call(f"functions.{tool.name}")]
    customs = [] if hide_tools else request.custom_tools
    customs = [tool for tool in customs if may_call(f"functions.{tool.name}")]
    search = None if hide_tools else request.tool_search
    if search is not None and may_call(f"functions.{TOOL_SEARCH}"):
        functions.append(
            FunctionTool(
                type="function",
                name=TOOL_SEARCH,
                description=search.description or TOOL_SEARCH_DESCRIPTION,
                parameters=search.search_parameters,
            )
        )
    namespaces = [] if hide_tools else _allowed_namespaces(tools.namespaces, may_call)
    grouped = [] if hide_tools else _allowed_groups(request.namespace_tools, may_call)
    if not instructions and not functions and not customs and not namespaces and not grouped:
        return None
    content = DeveloperContent.new()
    if instructions:
        content = content.with_instructions("\n\n".join(instructions))
    if functions or customs:
        content = content.with_function_tools(
            [
                *(
                    ToolDescription.new(tool.name, tool.description or "", tool.parameters)
                    for tool in functions
                ),
                *(custom_tool_description(tool) for tool in customs),
            ]
        )
    for group in grouped:
        content = content.with_tools(group)
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
        self._custom_calls: dict[str, str] = {}  # custom tool call_id -> name
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
        if isinstance(item, FunctionCallItem):
            self._calls[item.call_id] = qualified_name(item)
        elif isinstance(item, FunctionCallOutputItem):
            name = self._calls.get(item.call_id)
            if name is None:
                raise orphan_output(item, index)
            return item_messages(item, function_name=name)
        elif isinstance(item, McpApprovalResponseItem):
            return self._approval(item)
        elif isinstance(item, CustomToolCallItem | CustomToolCallOutputItem):
            return self._custom(item, index)
        return item_messages(item)

    def _custom(
        self, item: CustomToolCallItem | CustomToolCallOutputItem, index: int
    ) -> list[Message]:
        if isinstance(item, CustomToolCallItem):
            self._custom_calls[item.call_id] = item.name
            return item_messages(item)
        name = self._custom_calls.get(item.call_id)
        if name is None:
            raise orphan_custom_output(item, index)
        return item_messages(item, function_name=name)

    def _approval(self, item: McpApprovalResponseItem) -> list[Message]:
        request = self._approval_requests.get(item.approval_request_id)
        if request is None:
            return []
        result = self._approval_results.get(request.id)
        if result is None:
            if request.id in self._executed or item.approve:
                return []  # the mcp_call item that ran it shows call and output
            result = DECLINED
        return approval_messages(request, result)


def item_messages(item: InputItem, *, function_name: str | None = None) -> list[Message]:
    """The messages of one input item, for every type whose messages do not depend on
    other items; a ``function_call_output`` needs ``function_name``, its call's name.

    ``mcp_approval_response`` items are rendered by `approval_messages` (what they
    show depends on the request they answer and on whether a call ran it).
    """
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
        recipient = function_recipient(qualified_name(item))
        return [_call_message(recipient, item.arguments, "commentary", "json")]
    if isinstance(item, FunctionCallOutputItem):
        author = function_recipient(function_name or "")
        return [_tool_message(author, item.text(), "commentary")]
    if isinstance(item, CustomToolCallItem):
        return [custom_call_message(item.name, item.input)]
    if isinstance(item, ToolSearchCallItem):
        arguments = (
            item.arguments if isinstance(item.arguments, str) else encode_json(item.arguments)
        )
        return [_call_message(f"functions.{TOOL_SEARCH}", arguments, "commentary", "json")]
    if isinstance(item, ToolSearchOutputItem):
        return [_tool_message(f"functions.{TOOL_SEARCH}", item.text(), "commentary")]
    if isinstance(item, CustomToolCallOutputItem):
        # Its call's name (a custom tool is called as functions.NAME, like a function).
        return [_tool_message(f"functions.{function_name}", item.text(), "commentary")]
    tool = tool_of_call_item(item.type or "")
    shown = tool.harmony.history(item) if tool is not None else None
    if tool is not None and shown is not None:
        # A built-in tool's call and what it answered.
        recipient, call, output = shown
        harmony = tool.harmony
        return [
            _call_message(recipient, call, harmony.channel, harmony.content_type),
            _tool_message(recipient, output, harmony.channel),
        ]
    # mcp_list_tools and approval requests carry no conversation text (tool lists
    # are in the namespaces; a request is rendered with its response), nor do the
    # calls of tools that keep no results to show.
    return []


def _allowed_namespaces(
    namespaces: Sequence[ToolNamespace], may_call: Callable[[str], bool]
) -> list[ToolNamespace]:
    """The MCP namespaces with only the tools ``tool_choice`` lets the model call."""
    shown = []
    for namespace in namespaces:
        kept = [tool for tool in namespace.tools if may_call(f"{namespace.name}.{tool.name}")]
        if kept:
            shown.append(ToolNamespace(namespace.name, namespace.description, kept))
    return shown


def _allowed_groups(
    groups: Sequence[NamespaceTool], may_call: Callable[[str], bool]
) -> list[ToolNamespaceConfig]:
    """The request's namespace tools, as harmony namespaces of the callable functions."""
    shown = []
    for group in groups:
        kept = [
            ToolDescription.new(tool.name, tool.description or "", tool.parameters)
            for tool in group.tools
            if may_call(f"{group.name}.{tool.name}")
        ]
        if kept:
            shown.append(
                ToolNamespaceConfig(name=group.name, description=group.description, tools=kept)
            )
    return shown


def qualified_name(call: FunctionCallItem) -> str:
    """``NAME``, or ``NAMESPACE.NAME`` for a namespace tool's call (a function's
    name has no dot)."""
    return f"{call.namespace}.{call.name}" if call.namespace else call.name


def function_recipient(qualified: str) -> str:
    """The harmony recipient of a function: ``functions.NAME`` or ``NAMESPACE.NAME``."""
    return qualified if "." in qualified else f"functions.{qualified}"


def custom_call_message(name: str, text: str) -> Message:
    """A custom tool's call: its raw input, with no content type (it is not JSON)."""
    return (
        Message.from_role_and_content(Role.ASSISTANT, text)
        .with_channel("commentary")
        .with_recipient(f"functions.{name}")
    )


def approval_messages(request: McpApprovalRequestItem, result: str) -> list[Message]:
    """An answered approval request: the call it asked for and ``result``, its output."""
    recipient = f"{request.server_label}.{request.name}"
    return [
        _call_message(recipient, request.arguments, "commentary", "json"),
        _tool_message(recipient, result, "commentary"),
    ]


def orphan_output(item: FunctionCallOutputItem, index: int) -> InvalidRequestError:
    """The error for a ``function_call_output`` (at ``index``) without its call."""
    return InvalidRequestError(
        f"No function call found for function_call_output with call_id "
        f"{item.call_id!r}. Include the function_call item (or use "
        "previous_response_id) before its output.",
        param=f"input[{index}].call_id",
    )


def orphan_custom_output(item: CustomToolCallOutputItem, index: int) -> InvalidRequestError:
    """The error for a ``custom_tool_call_output`` (at ``index``) without its call."""
    return InvalidRequestError(
        f"No custom tool call found for custom_tool_call_output with call_id "
        f"{item.call_id!r}. Include the custom_tool_call item (or use "
        "previous_response_id) before its output.",
        param=f"input[{index}].call_id",
    )


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


def custom_tool_description(tool: CustomTool) -> ToolDescription:
    """A custom tool, shown among the functions: it takes raw text, not JSON, and its
    description says so (with the grammar the text must follow, if any)."""
    lines = [tool.description] if tool.description else []
    grammar = tool.grammar
    if grammar is None:
        lines.append("Its input is free-form text (not JSON): write the text itself.")
    else:
        lines.append(
            "Its input is free-form text (not JSON) in this "
            f"{'Lark grammar' if grammar.syntax == 'lark' else 'regular expression'}:"
        )
        lines.append(grammar.definition)
    return ToolDescription.new(tool.name, "\n".join(lines), None)


def tool_description(
    name: str, description: str | None, schema: dict[str, Any] | None
) -> ToolDescription:
    """A harmony tool description (for MCP namespaces)."""
    return ToolDescription.new(name, description or "", schema)
