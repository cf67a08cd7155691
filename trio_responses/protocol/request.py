"""The ``POST /v1/responses`` request: validation and normalisation (sans-IO).

`parse_create_request` turns a decoded JSON body into a `CreateRequest`, or
raises `InvalidRequestError` naming the offending ``param`` the way the OpenAI
API does (``input[0].content``, ``tools[2].name``…).

Policy for fields (SPEC §4):

* honoured fields are validated strictly (no silent type coercion);
* OpenAI fields that cannot change the result are accepted and ignored
  (`IGNORED_FIELDS`);
* OpenAI fields we do not implement and that would change the result are
  rejected with a message saying so (`UNSUPPORTED_FIELDS`);
* anything else is an unknown parameter.

Input items, content parts and tools accept exactly the fields the OpenAI
schema defines for their type (clients echo output items back as input, with
every field the SDK knows), and nothing else: an unknown field is a 400 naming
it (``input[3].foo``), so a request cannot make the server store data the API
does not define. Stored items are read back ignoring fields their type does
not define, which records written by earlier versions may carry
(`parse_input_item`).

Bodies are decoded by `json_body.decode_json_body`; JSON Schemas are checked by
`json_schema`, an ``mcp`` tool's headers by ``tools.builtin._mcp_headers`` (beside
the ``mcp`` tool).

The built-in tools (`tools.builtin`) define their ``tools[]`` entries, their items
and their ``include`` and ``tool_choice`` values: the unions here are built from
their descriptors, in the registry's order.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
    field_validator,
)

from .._exceptions import InvalidRequestError
from ..tools.builtin import (
    BUILTIN_TOOLS,
    NAMESPACES,
    BuiltinItem,
    BuiltinToolParam,
    literal_values,
    requested_namespaces,
    tool_for_choice,
    tool_for_param,
)

# The MCP models live with the MCP tool; the package imports them from here.
from ..tools.builtin.mcp import McpApprovalFilter as McpApprovalFilter
from ..tools.builtin.mcp import McpApprovalRequestItem as McpApprovalRequestItem
from ..tools.builtin.mcp import McpApprovalResponseItem as McpApprovalResponseItem
from ..tools.builtin.mcp import McpCallItem as McpCallItem
from ..tools.builtin.mcp import McpListToolsItem as McpListToolsItem
from ..tools.builtin.mcp import McpTool as McpTool
from ..tools.builtin.mcp import McpToolFilter as McpToolFilter
from .grammar import Grammar, check_grammar
from .json_body import printable_key
from .json_schema import check_json_schema

__all__ = [
    "CreateRequest",
    "CustomTool",
    "FunctionTool",
    "InputItem",
    "McpTool",
    "parse_create_request",
]

# -- fields -------------------------------------------------------------------

IGNORED_FIELDS = frozenset(
    {
        "service_tier",
        "prompt_cache_key",
        "prompt_cache_retention",
        "prompt_cache_options",
        "safety_identifier",
        "stream_options",
        "access_programs",
        "background_options",
        "client_metadata",
    }
)
"""OpenAI request fields accepted and ignored: hints that cannot change the output."""

UNSUPPORTED_FIELDS = {
    "prompt": "Stored prompt templates are not supported by this server; "
    "send 'instructions' and 'input' instead.",
    "context_management": "Server-side context management is not supported by this server.",
    "moderation": "Moderation is not supported by this server.",
    "image": "Image options are not supported by this server.",
}
"""OpenAI request fields rejected when set: ignoring them would change the result."""

SUPPORTED_INCLUDES = frozenset(
    {"reasoning.encrypted_content", *(value for tool in BUILTIN_TOOLS for value in tool.includes)}
)

_STRICT = ConfigDict(strict=True, extra="forbid")
_REFUSED = ConfigDict(strict=True, extra="allow")
"""For types the server refuses whatever their fields (`UnsupportedPart`,
`UnsupportedTool`): the refusal names the type, not a field."""

ItemStatus = Literal["in_progress", "completed", "incomplete"]


# -- content parts --------------------------------------------------------------


class InputText(BaseModel):
    model_config = _STRICT
    type: Literal["input_text"]
    text: str
    prompt_cache_breakpoint: dict[str, Any] | None = None
    # Output text's fields, as the SDK dumps an input text part it parsed as output
    # text (the user messages of ``compact``'s output): only empty ones are accepted.
    annotations: Annotated[list[Any], Field(max_length=0)] | None = None
    logprobs: Annotated[list[Any], Field(max_length=0)] | None = None


class OutputText(BaseModel):
    model_config = _STRICT
    type: Literal["output_text"]
    text: str
    annotations: list[dict[str, Any]] | None = None
    logprobs: list[dict[str, Any]] | None = None


class Refusal(BaseModel):
    model_config = _STRICT
    type: Literal["refusal"]
    refusal: str


class UnsupportedPart(BaseModel):
    """Image, file and audio parts: gpt-oss reads text only."""

    model_config = _REFUSED
    type: Literal["input_image", "input_file", "input_audio"]
    filename: Any = None
    """An ``input_file``'s name, kept for the placeholder the model reads."""


ContentPart = Annotated[
    InputText | OutputText | Refusal | UnsupportedPart, Field(discriminator="type")
]


class SummaryText(BaseModel):
    model_config = _STRICT
    type: Literal["summary_text"]
    text: str


class ReasoningText(BaseModel):
    model_config = _STRICT
    type: Literal["reasoning_text"]
    text: str


class LogsOutput(BaseModel):
    model_config = _STRICT
    type: Literal["logs"]
    logs: str


# -- input items ------------------------------------------------------------------
#
# Each item type has the fields of the OpenAI schema: those of its input param
# and of the output item clients echo back (``id``, ``status``…). The ones this
# server does not read are kept as sent, so a listed or retrieved item shows them.


class MessageItem(BaseModel):
    model_config = _STRICT
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[ContentPart]
    id: str | None = None
    status: ItemStatus | None = None
    phase: Literal["commentary", "final_answer"] | None = None

    def text(self) -> str:
        """The message's text parts joined together."""
        if isinstance(self.content, str):
            return self.content
        parts: list[str] = []
        for part in self.content:
            if isinstance(part, InputText | OutputText):
                parts.append(part.text)
            elif isinstance(part, Refusal):
                parts.append(part.refusal)
        return "".join(parts)


class FunctionCallItem(BaseModel):
    model_config = _STRICT
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: ItemStatus | None = None
    namespace: str | None = None
    caller: dict[str, Any] | None = None
    # ``async`` on the wire; ``async_`` as the SDK's models dump it.
    async_: Annotated[
        bool | None,
        Field(validation_alias=AliasChoices("async", "async_"), serialization_alias="async"),
    ] = None


class FunctionCallOutputItem(BaseModel):
    model_config = _STRICT
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[ContentPart]
    id: str | None = None
    status: ItemStatus | None = None
    name: str | None = None
    namespace: str | None = None
    caller: dict[str, Any] | None = None
    created_by: str | None = None

    def text(self) -> str:
        return output_text(self.output)


class CustomToolCallItem(BaseModel):
    """A call of a custom tool: its ``input`` is free text (in the tool's grammar)."""

    model_config = _STRICT
    type: Literal["custom_tool_call"]
    call_id: str
    name: str
    input: str
    id: str | None = None
    status: ItemStatus | None = None
    namespace: str | None = None
    caller: dict[str, Any] | None = None
    async_: Annotated[
        bool | None,
        Field(validation_alias=AliasChoices("async", "async_"), serialization_alias="async"),
    ] = None


class CustomToolCallOutputItem(BaseModel):
    model_config = _STRICT
    type: Literal["custom_tool_call_output"]
    call_id: str
    output: str | list[ContentPart]
    id: str | None = None
    status: ItemStatus | None = None
    caller: dict[str, Any] | None = None
    created_by: str | None = None

    def text(self) -> str:
        return output_text(self.output)


def output_text(output: str | Sequence[ContentPart]) -> str:
    """What the model reads of a tool's ``output``: the string, or its parts' text."""
    return output if isinstance(output, str) else content_text(output)


def content_text(parts: Sequence[ContentPart]) -> str:
    """The text of a tool output's content parts, joined, in order. gpt-oss reads text
    only: an image, file or audio part becomes a visible placeholder that says what was
    left out (Codex's ``view_image`` returns an image; its turn goes on)."""
    pieces: list[str] = []
    for part in parts:
        if isinstance(part, InputText | OutputText):
            pieces.append(part.text)
        elif isinstance(part, UnsupportedPart):
            if pieces and not pieces[-1].endswith(("\n", " ")):
                pieces.append("\n")
            pieces.append(omitted_placeholder(part))
    return "".join(pieces)


def omitted_placeholder(part: UnsupportedPart) -> str:
    """``[image omitted: this model reads text only]``; a file names itself."""
    kind = part.type.removeprefix("input_")
    filename = part.filename
    if kind == "file" and isinstance(filename, str) and filename:
        kind = f"file {filename[:200]!r}"
    return f"[{kind} omitted: this model reads text only]"


class ReasoningItem(BaseModel):
    model_config = _STRICT
    type: Literal["reasoning"]
    id: str | None = None
    summary: list[SummaryText] = []
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None
    status: ItemStatus | None = None

    def text(self) -> str:
        if self.content:
            return "".join(part.text for part in self.content)
        return "".join(part.text for part in self.summary)


class CompactionItem(BaseModel):
    """A compacted conversation (``POST /v1/responses/compact``): its summary is sealed
    in ``encrypted_content``, which the service opens before rendering."""

    model_config = _STRICT
    type: Literal["compaction"]
    encrypted_content: str
    id: str | None = None
    created_by: str | None = None


class ItemReference(BaseModel):
    """``{"type": "item_reference", "id": …}`` (``type`` optional): a stored item,
    resolved by the service before the request is prepared."""

    model_config = _STRICT
    type: Literal["item_reference"] | None = None
    id: Annotated[str, Field(min_length=1, max_length=256)]


def _item_tag(value: Any) -> str | None:
    if isinstance(value, dict):
        tag = value.get("type")
        if tag is None:
            # Untyped: a message, unless all it has is an id (an item reference).
            return "item_reference" if "id" in value and "role" not in value else "message"
        return tag if isinstance(tag, str) else None
    return getattr(value, "type", None) or "item_reference"


if TYPE_CHECKING:
    InputItem = (
        MessageItem
        | FunctionCallItem
        | FunctionCallOutputItem
        | CustomToolCallItem
        | CustomToolCallOutputItem
        | ReasoningItem
        | BuiltinItem
        | CompactionItem
        | ItemReference
    )
else:
    # The built-in tools' items between reasoning and compaction.
    InputItem = Annotated[
        Union[
            (
                Annotated[MessageItem, Tag("message")],
                Annotated[FunctionCallItem, Tag("function_call")],
                Annotated[FunctionCallOutputItem, Tag("function_call_output")],
                Annotated[CustomToolCallItem, Tag("custom_tool_call")],
                Annotated[CustomToolCallOutputItem, Tag("custom_tool_call_output")],
                Annotated[ReasoningItem, Tag("reasoning")],
                *(
                    Annotated[model, Tag(literal_values(model)[0])]
                    for tool in BUILTIN_TOOLS
                    for model in tool.input_items
                ),
                Annotated[CompactionItem, Tag("compaction")],
                Annotated[ItemReference, Tag("item_reference")],
            )
        ],
        Discriminator(_item_tag),
    ]

# -- tools ------------------------------------------------------------------------------


class FunctionTool(BaseModel):
    model_config = _STRICT
    type: Literal["function"]
    name: Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    # Accepted and ignored: they do not change what the model sees.
    defer_loading: bool | None = None
    allowed_callers: list[str] | None = None
    output_schema: dict[str, Any] | None = None


class NamespaceTool(BaseModel):
    """Functions grouped under a namespace (Codex's ``multi_agent_v1``): rendered as
    their own harmony namespace; the model calls ``NAMESPACE.NAME``, and the
    ``function_call`` item carries ``namespace``."""

    model_config = _STRICT
    type: Literal["namespace"]
    name: Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]
    description: str | None = None
    tools: Annotated[list[FunctionTool], Field(min_length=1, max_length=128)]


class CustomFormatText(BaseModel):
    model_config = _STRICT
    type: Literal["text"]


class CustomFormatGrammar(BaseModel):
    model_config = _STRICT
    type: Literal["grammar"]
    syntax: Literal["lark", "regex"]
    definition: str


class CustomTool(BaseModel):
    """A tool whose input is free text, optionally in a grammar (``format``)."""

    model_config = _STRICT
    type: Literal["custom"]
    name: Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]
    description: str | None = None
    format: (
        Annotated[CustomFormatText | CustomFormatGrammar, Field(discriminator="type")] | None
    ) = None
    # Accepted and ignored: they do not change what the model sees.
    defer_loading: bool | None = None
    allowed_callers: list[str] | None = None

    @property
    def grammar(self) -> Grammar | None:
        """The input's grammar (None: any text). Valid once the request is parsed."""
        fmt = self.format
        if isinstance(fmt, CustomFormatGrammar):
            return Grammar(fmt.syntax, fmt.definition)
        return None


class UnsupportedTool(BaseModel):
    model_config = _REFUSED
    type: Literal[
        "file_search",
        "computer",
        "computer_use_preview",
        "image_generation",
        "local_shell",
        "shell",
        "apply_patch",
        "tool_search",
        "programmatic_tool_calling",
    ]


if TYPE_CHECKING:
    Tool = FunctionTool | CustomTool | NamespaceTool | BuiltinToolParam | UnsupportedTool
    HostedChoiceType = str
else:
    Tool = Annotated[
        Union[
            (
                FunctionTool,
                CustomTool,
                NamespaceTool,
                *(tool.param for tool in BUILTIN_TOOLS),
                UnsupportedTool,
            )
        ],
        Field(discriminator="type"),
    ]
    HostedChoiceType = Literal[tuple(t for tool in BUILTIN_TOOLS for t in tool.choice_types)]

# -- other structured fields ----------------------------------------------------------------


class ToolChoiceFunction(BaseModel):
    model_config = _STRICT
    type: Literal["function"]
    name: str


class ToolChoiceMcp(BaseModel):
    model_config = _STRICT
    type: Literal["mcp"]
    server_label: str
    name: str | None = None


class ToolChoiceCustom(BaseModel):
    """``{"type": "custom", "name": …}``: a call of that custom tool."""

    model_config = _STRICT
    type: Literal["custom"]
    name: str


class ToolChoiceHosted(BaseModel):
    """``{"type": T}`` forcing a call of the built-in tool with choice type T."""

    model_config = _STRICT
    type: HostedChoiceType


class ToolChoiceAllowed(BaseModel):
    """``{"type": "allowed_tools", "mode": …, "tools": [...]}``: only the listed tools
    may be called (the others are not shown to the model); ``required`` forces a call
    of one of them. Entries name tools as ``tool_choice`` does: ``{"type": "function",
    "name"}``, ``{"type": "custom", "name"}``, ``{"type": "mcp", "server_label",
    "name"?}`` or a built-in tool's type."""

    model_config = _STRICT
    type: Literal["allowed_tools"]
    mode: Literal["auto", "required"]
    tools: Annotated[list[dict[str, Any]], Field(min_length=1, max_length=128)]


ToolChoiceObject = Annotated[
    ToolChoiceFunction | ToolChoiceCustom | ToolChoiceMcp | ToolChoiceHosted | ToolChoiceAllowed,
    Field(discriminator="type"),
]


EFFORT_FOR: dict[str, str] = {"none": "low", "minimal": "low", "xhigh": "high", "max": "high"}
"""The SDK's reasoning levels that gpt-oss lacks, mapped to the nearest it has
(gpt-oss reasons at low, medium or high); the Response echoes the level used."""


class Reasoning(BaseModel):
    model_config = _STRICT
    effort: Literal["low", "medium", "high"] | None = None

    @field_validator("effort", mode="before")
    @classmethod
    def _nearest_effort(cls, value: object) -> object:
        return EFFORT_FOR.get(value, value) if isinstance(value, str) else value

    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None
    # Harmony drops the reasoning of earlier turns: ``current_turn`` is what runs
    # (``auto`` picks it); ``all_turns`` would need another prompt format.
    context: Literal["auto", "current_turn"] | None = None
    # gpt-oss has one execution mode.
    mode: Literal["standard"] | None = None


class FormatText(BaseModel):
    model_config = _STRICT
    type: Literal["text"]


class FormatJsonSchema(BaseModel):
    model_config = _STRICT
    type: Literal["json_schema"]
    name: Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]
    schema_: Annotated[dict[str, Any], Field(alias="schema")]
    description: str | None = None
    strict: bool | None = None


class FormatJsonObject(BaseModel):
    model_config = _STRICT
    type: Literal["json_object"]


class TextConfig(BaseModel):
    model_config = _STRICT
    format: (
        Annotated[FormatText | FormatJsonSchema | FormatJsonObject, Field(discriminator="type")]
        | None
    ) = None
    verbosity: Literal["low", "medium", "high"] | None = None


Metadata = Annotated[dict[str, Annotated[str, Field(max_length=512)]], Field(max_length=16)]


ConversationId = Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,128}$")]


class ConversationParam(BaseModel):
    model_config = _STRICT
    id: ConversationId


class CreateRequest(BaseModel):
    """A validated create request. Build it with `parse_create_request`."""

    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=True)

    model: Annotated[str, Field(max_length=256)]
    input: str | list[InputItem] = []
    instructions: str | None = None
    tools: list[Tool] = []
    tool_choice: Literal["auto", "none", "required"] | ToolChoiceObject = "auto"
    parallel_tool_calls: bool = True
    max_output_tokens: Annotated[int, Field(ge=1)] | None = None
    max_tool_calls: Annotated[int, Field(ge=0)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(ge=0, le=1)] | None = None
    presence_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=0)] | None = None
    reasoning: Reasoning | None = None
    text: TextConfig | None = None
    store: bool = True
    stream: bool = False
    background: bool = False
    previous_response_id: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,128}$")] | None = None
    conversation: ConversationId | ConversationParam | None = None
    metadata: Metadata | None = None
    user: str | None = None
    truncation: Literal["auto", "disabled"] = "disabled"
    include: list[str] = []
    # Accepted hints (IGNORED_FIELDS); stored and echoed where the Response has them.
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    safety_identifier: str | None = None
    stream_options: dict[str, Any] | None = None
    access_programs: dict[str, Any] | None = None
    background_options: dict[str, Any] | None = None
    client_metadata: dict[str, Any] | None = None

    @property
    def input_items(self) -> list[InputItem]:
        """``input`` as items (a string becomes one user message)."""
        if isinstance(self.input, str):
            return [MessageItem(role="user", content=self.input)]
        return list(self.input)

    @property
    def conversation_id(self) -> str | None:
        """``conversation`` as an id (it may be sent as ``{"id": …}``)."""
        conversation = self.conversation
        return conversation.id if isinstance(conversation, ConversationParam) else conversation

    @property
    def function_tools(self) -> list[FunctionTool]:
        return [tool for tool in self.tools if isinstance(tool, FunctionTool)]

    @functools.cached_property
    def _allowed(self) -> frozenset[str] | None:
        # Read once per request (routing asks on every call); a copy that changed
        # ``tools`` or ``tool_choice`` would have to drop it (none does).
        return allowed_recipients(self)

    def may_call(self, recipient: str) -> bool:
        """Whether ``tool_choice`` lets the model call ``recipient`` (``functions.NAME``,
        ``NAMESPACE.NAME``, ``browser.search``...): only ``allowed_tools`` restricts."""
        allowed = self._allowed
        if allowed is None:
            return True
        return any(recipient == name or recipient.startswith(name + ".") for name in allowed)

    @property
    def namespace_tools(self) -> list[NamespaceTool]:
        return [tool for tool in self.tools if isinstance(tool, NamespaceTool)]

    @property
    def custom_tools(self) -> list[CustomTool]:
        return [tool for tool in self.tools if isinstance(tool, CustomTool)]

    @property
    def mcp_tools(self) -> list[McpTool]:
        return [tool for tool in self.tools if isinstance(tool, McpTool)]

    @property
    def reasoning_effort(self) -> Literal["low", "medium", "high"]:
        if self.reasoning is not None and self.reasoning.effort is not None:
            return self.reasoning.effort
        return "medium"


_ITEM_ADAPTER: TypeAdapter[InputItem] = TypeAdapter(InputItem)


def parse_input_item(raw: Any) -> InputItem:
    """Validate one stored input item (already checked once when it arrived).

    Fields its type does not define are dropped rather than refused: records
    written by earlier versions of this server may carry some.
    """
    return _ITEM_ADAPTER.validate_python(raw, extra="ignore")


# -- parsing and error messages -------------------------------------------------------------


def parse_create_request(body: Any) -> CreateRequest:
    """Validate a decoded JSON body.

    Raises:
        InvalidRequestError: with ``param`` set to the first offending field.
    """
    if not isinstance(body, dict):
        raise InvalidRequestError("The request body must be a JSON object.", code="invalid_type")
    fields = {key: value for key, value in body.items() if value is not None}
    for key in fields:
        if key in UNSUPPORTED_FIELDS:
            raise InvalidRequestError(
                UNSUPPORTED_FIELDS[key], param=key, code="unsupported_parameter"
            )
    if "model" not in fields:
        raise InvalidRequestError(
            "Missing required parameter: 'model'.",
            param="model",
            code="missing_required_parameter",
        )
    try:
        request = CreateRequest.model_validate(fields)
    except ValidationError as error:
        raise _to_invalid_request(error, fields) from None
    _check_semantics(request)
    return request


def check_includes(values: Sequence[str]) -> None:
    """Raise `InvalidRequestError` for an ``include`` value we do not support."""
    for index, value in enumerate(values):
        if value not in SUPPORTED_INCLUDES:
            raise InvalidRequestError(
                f"Unsupported value {value!r} in 'include'. Supported values are: "
                + ", ".join(sorted(SUPPORTED_INCLUDES))
                + ".",
                param=f"include[{index}]",
                code="unsupported_value",
            )


_SUPPORTED_TOOL_TYPES = ", ".join(
    [
        "function",
        "custom",
        "namespace",
        *(listed for tool in BUILTIN_TOOLS for listed in tool.listed_types),
    ]
)


def _check_semantics(request: CreateRequest) -> None:
    if request.conversation is not None and request.previous_response_id is not None:
        raise InvalidRequestError(
            "Mutually exclusive parameters: send either 'previous_response_id' or "
            "'conversation', not both.",
            param="conversation",
            code="mutually_exclusive_parameters",
        )
    if request.background and not request.store:
        raise InvalidRequestError(
            "Background responses must be stored: set 'store' to true or drop 'background'.",
            param="background",
        )
    check_includes(request.include)
    for index, tool in enumerate(request.tools):
        if isinstance(tool, UnsupportedTool):
            raise InvalidRequestError(
                f"Tool type {tool.type!r} is not supported by this server. Supported tool "
                f"types: {_SUPPORTED_TOOL_TYPES}.",
                param=f"tools[{index}].type",
                code="unsupported_value",
            )
        builtin = tool_for_param(tool)
        if builtin is not None and builtin.check is not None:
            builtin.check(tool, index)
    seen: set[str] = set()
    for index, function in enumerate(request.tools):
        if isinstance(function, FunctionTool):
            if function.name in seen:
                raise InvalidRequestError(
                    f"Duplicate function name {function.name!r} in 'tools'.",
                    param=f"tools[{index}].name",
                )
            seen.add(function.name)
            if function.parameters:  # missing or {}: any arguments
                check_json_schema(
                    function.parameters,
                    param=f"tools[{index}].parameters",
                    what=f"the parameters of function {function.name!r}",
                )
    choice = request.tool_choice
    if isinstance(choice, ToolChoiceFunction) and choice.name not in seen:
        raise InvalidRequestError(
            f"tool_choice names function {choice.name!r}, which is not in 'tools'.",
            param="tool_choice",
        )
    _check_custom_tools(request, seen)
    _check_namespace_tools(request)
    allowed_recipients(request)
    text_format = request.text.format if request.text is not None else None
    if isinstance(text_format, FormatJsonSchema):
        check_json_schema(
            text_format.schema_,
            param="text.format.schema",
            what=f"response format {text_format.name!r}",
        )
    for index, item in enumerate(request.input_items):
        if isinstance(item, MessageItem) and not isinstance(item.content, str):
            for part_index, part in enumerate(item.content):
                if isinstance(part, UnsupportedPart):
                    raise InvalidRequestError(
                        f"Content of type {part.type!r} is not supported: gpt-oss models "
                        "read text only. Send 'input_text' parts.",
                        param=f"input[{index}].content[{part_index}].type",
                        code="unsupported_value",
                    )


_HOSTED_CHOICES = frozenset(t for tool in BUILTIN_TOOLS for t in tool.choice_types)


def allowed_recipients(request: CreateRequest) -> frozenset[str] | None:
    """The recipients, or recipient prefixes (an MCP label, a built-in namespace), that
    an ``allowed_tools`` choice lists; None: no such choice.

    Raises:
        InvalidRequestError: an entry that names no tool of the request.
    """
    choice = request.tool_choice
    if not isinstance(choice, ToolChoiceAllowed):
        return None
    functions = {tool.name for tool in request.function_tools} | {
        tool.name for tool in request.custom_tools
    }
    grouped = {f"{g.name}.{tool.name}" for g in request.namespace_tools for tool in g.tools}
    labels = {tool.server_label for tool in request.mcp_tools}
    builtin = requested_namespaces(request.tools)
    found: set[str] = set()
    for index, entry in enumerate(choice.tools):
        kind, name = entry.get("type"), entry.get("name")
        namespace = entry.get("namespace")
        recipient: str | None = None
        if kind in ("function", "custom") and isinstance(name, str):
            if isinstance(namespace, str):
                name = f"{namespace}.{name}"
            if name in functions:
                recipient = f"functions.{name}"
            elif name in grouped:
                recipient = name
        elif kind == "namespace" and isinstance(name, str):
            if any(full.startswith(name + ".") for full in grouped):
                recipient = name
        elif kind == "mcp" and entry.get("server_label") in labels:
            label = str(entry["server_label"])
            recipient = f"{label}.{name}" if isinstance(name, str) else label
        elif isinstance(kind, str) and kind in _HOSTED_CHOICES:
            namespace = tool_for_choice(kind).harmony.namespace
            if namespace is not None and namespace in builtin:
                recipient = namespace
        if recipient is None:
            raise InvalidRequestError(
                f"tool_choice.tools[{index}] names no tool of this request: list tools "
                'from \'tools\' as {"type": "function", "name": ...} (or custom, mcp '
                "with server_label, or a built-in tool's type).",
                param=f"tool_choice.tools[{index}]",
            )
        found.add(recipient)
    return frozenset(found)


def _check_namespace_tools(request: CreateRequest) -> None:
    """Namespace tools: a namespace name no other tool uses (``functions``, a built-in
    tool's, an MCP server's label, another namespace), functions unique within it,
    parameters that are JSON schemas."""
    taken = {"functions", "assistant", *NAMESPACES, *(t.server_label for t in request.mcp_tools)}
    for index, tool in enumerate(request.tools):
        if not isinstance(tool, NamespaceTool):
            continue
        if tool.name in taken:
            raise InvalidRequestError(
                f"Namespace name {tool.name!r} is already used: 'functions', the built-in "
                "tools' namespaces, MCP server labels and other namespaces are taken.",
                param=f"tools[{index}].name",
            )
        taken.add(tool.name)
        names: set[str] = set()
        for inner, function in enumerate(tool.tools):
            if function.name in names:
                raise InvalidRequestError(
                    f"Duplicate function name {function.name!r} in namespace {tool.name!r}.",
                    param=f"tools[{index}].tools[{inner}].name",
                )
            names.add(function.name)
            if function.parameters:
                check_json_schema(
                    function.parameters,
                    param=f"tools[{index}].tools[{inner}].parameters",
                    what=f"the parameters of function {tool.name}.{function.name}",
                )


def _check_custom_tools(request: CreateRequest, functions: set[str]) -> None:
    """Custom tools: names unique among functions and custom tools (the model calls
    both as ``functions.NAME``), grammars that compile, a ``tool_choice`` naming one."""
    names: set[str] = set()
    for index, tool in enumerate(request.tools):
        if not isinstance(tool, CustomTool):
            continue
        if tool.name in names or tool.name in functions:
            raise InvalidRequestError(
                f"Duplicate tool name {tool.name!r} in 'tools': function and custom tools "
                "need distinct names.",
                param=f"tools[{index}].name",
            )
        names.add(tool.name)
        if isinstance(tool.format, CustomFormatGrammar):
            check_grammar(
                tool.format.syntax,
                tool.format.definition,
                param=f"tools[{index}].format.definition",
                name=tool.name,
            )
    choice = request.tool_choice
    if isinstance(choice, ToolChoiceCustom) and choice.name not in names:
        raise InvalidRequestError(
            f"tool_choice names custom tool {choice.name!r}, which is not in 'tools'.",
            param="tool_choice",
        )


_TYPE_NAMES = {
    "string_type": "a string",
    "int_type": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "bool_type": "a boolean",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
    "list_type": "an array",
    "none_required": "null",
}


def _param_path(loc: tuple[int | str, ...], data: Any, keep_last: bool) -> str:
    """Render a pydantic location as an OpenAI param path, skipping union labels.

    Pydantic adds the name of the union member it tried (``str``, ``function``…)
    to locations; those are not keys of the data, so they are dropped.
    """
    path = ""
    node = data
    for position, part in enumerate(loc):
        last = position == len(loc) - 1
        if isinstance(part, int):
            if isinstance(node, list) and 0 <= part < len(node):
                node = node[part]
                path += f"[{part}]"
            continue
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif not (last and keep_last):
            continue
        else:
            node = None
        key = printable_key(part)
        path += f".{key}" if path else key
    return path


def _to_invalid_request(error: ValidationError, data: dict[str, Any]) -> InvalidRequestError:
    located = []
    for entry in error.errors(include_url=False):
        keep_last = entry["type"] in ("missing", "extra_forbidden")
        located.append((_param_path(entry["loc"], data, keep_last), entry))
    # Unions report one error per member; the deepest location is the member that
    # matched the data's shape, so it is the most useful one to report.
    param, first = max(located, key=lambda pair: _depth(pair[0]))
    kind = first["type"]
    if kind == "extra_forbidden":
        return InvalidRequestError(
            f"Unknown parameter: '{param}'.", param=param, code="unknown_parameter"
        )
    if kind == "missing":
        return InvalidRequestError(
            f"Missing required parameter: '{param}'.",
            param=param,
            code="missing_required_parameter",
        )
    expected = [
        _TYPE_NAMES[e["type"]] for p, e in located if p == param and e["type"] in _TYPE_NAMES
    ]
    if kind in _TYPE_NAMES and expected:
        unique = list(dict.fromkeys(expected))
        wanted = unique[0] if len(unique) == 1 else "one of " + " or ".join(unique)
        return InvalidRequestError(
            f"Invalid type for '{param}': expected {wanted}.", param=param, code="invalid_type"
        )
    if kind == "union_tag_invalid":
        context = first.get("ctx", {})
        param = f"{param}.type" if param else "type"
        return InvalidRequestError(
            f"Invalid value for '{param}': {context.get('tag')!r} is not supported. "
            f"Supported values are: {context.get('expected_tags')}.",
            param=param,
            code="invalid_value",
        )
    if kind == "union_tag_not_found":
        return InvalidRequestError(
            f"Invalid type for '{param}': expected an object with a 'type'.",
            param=param,
            code="invalid_type",
        )
    message = first["msg"].replace("Input should", "it should")
    return InvalidRequestError(
        f"Invalid value for '{param}': {message}.", param=param, code="invalid_value"
    )


def _depth(param: str) -> int:
    return param.count(".") + param.count("[")
