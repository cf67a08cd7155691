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
    PrivateAttr,
    Tag,
    TypeAdapter,
    ValidationError,
    field_validator,
)

from .._exceptions import InvalidRequestError
from ..tools.builtin import (
    BUILTIN_TOOLS,
    BuiltinItem,
    literal_values,
)

# The MCP models live with the MCP tool; the package imports them from here.
from ..tools.builtin.mcp import McpApprovalFilter as McpApprovalFilter
from ..tools.builtin.mcp import McpApprovalRequestItem as McpApprovalRequestItem
from ..tools.builtin.mcp import McpApprovalResponseItem as McpApprovalResponseItem
from ..tools.builtin.mcp import McpCallItem as McpCallItem
from ..tools.builtin.mcp import McpListToolsItem as McpListToolsItem
from ..tools.builtin.mcp import McpTool as McpTool
from ..tools.builtin.mcp import McpToolFilter as McpToolFilter
from .json_body import printable_key
from .json_schema import check_json_schema

# The tool models live in tool_params; the package imports them from here too.
from .tool_params import CustomTool as CustomTool
from .tool_params import FunctionTool as FunctionTool
from .tool_params import NamespaceTool as NamespaceTool
from .tool_params import Tool as Tool
from .tool_params import ToolChoiceAllowed as ToolChoiceAllowed
from .tool_params import ToolChoiceCustom as ToolChoiceCustom
from .tool_params import ToolChoiceFunction as ToolChoiceFunction
from .tool_params import ToolChoiceHosted as ToolChoiceHosted
from .tool_params import ToolChoiceMcp as ToolChoiceMcp
from .tool_params import ToolChoiceObject as ToolChoiceObject
from .tool_params import ToolSearchTool as ToolSearchTool
from .tool_params import UnsupportedTool as UnsupportedTool
from .tool_params import (
    allowed_recipients,
    check_loaded_tools,
    check_tools,
    loaded_name,
    visible_tools,
)

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


class ToolSearchCallItem(BaseModel):
    """The model's call of ``tool_search`` (run by the client), echoed back."""

    model_config = _STRICT
    type: Literal["tool_search_call"]
    id: str | None = None
    call_id: str | None = None
    arguments: Any = None
    execution: Literal["server", "client"] | None = None
    status: ItemStatus | None = None
    created_by: str | None = None


class ToolSearchOutputItem(BaseModel):
    """What the client's tool search found: ``tools`` the model may call from here on."""

    model_config = _STRICT
    type: Literal["tool_search_output"]
    id: str | None = None
    call_id: str | None = None
    tools: Annotated[list[Tool], Field(max_length=128)]
    execution: Literal["server", "client"] | None = None
    status: ItemStatus | None = None
    created_by: str | None = None

    def text(self) -> str:
        """What the model reads: the names of the tools it may now call."""
        names = [loaded_name(tool) for tool in self.tools]
        if not names:
            return "No tools found."
        return "Tools now available: " + ", ".join(names) + "."


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
        | ToolSearchCallItem
        | ToolSearchOutputItem
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
                Annotated[ToolSearchCallItem, Tag("tool_search_call")],
                Annotated[ToolSearchOutputItem, Tag("tool_search_output")],
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

# -- tools: `protocol.tool_params` ----------------------------------------------------


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

    _loaded: tuple[Tool, ...] = PrivateAttr(default=())

    def with_loaded_tools(self, items: Sequence[InputItem]) -> CreateRequest:
        """This request, its model also seeing the tools the ``tool_search_output``
        items among ``items`` (the whole conversation) loaded; ``tools`` stays as sent."""
        loaded = [t for i in items if isinstance(i, ToolSearchOutputItem) for t in i.tools]
        if not loaded:
            return self
        copy = self.model_copy()
        copy._loaded = tuple(loaded)
        copy.__dict__.pop("_visible", None)
        return copy

    @functools.cached_property
    def _visible(self) -> list[Tool]:
        return visible_tools(self.tools, self._loaded)

    @property
    def function_tools(self) -> list[FunctionTool]:
        """The function tools the model sees (`tool_params.visible_tools`)."""
        return [tool for tool in self._visible if isinstance(tool, FunctionTool)]

    @property
    def tool_search(self) -> ToolSearchTool | None:
        """The ``tool_search`` tool (run by the client), if sent."""
        return next((t for t in self.tools if isinstance(t, ToolSearchTool)), None)

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
        return [tool for tool in self._visible if isinstance(tool, NamespaceTool)]

    @property
    def custom_tools(self) -> list[CustomTool]:
        return [tool for tool in self._visible if isinstance(tool, CustomTool)]

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
    check_tools(request)
    text_format = request.text.format if request.text is not None else None
    if isinstance(text_format, FormatJsonSchema):
        check_json_schema(
            text_format.schema_,
            param="text.format.schema",
            what=f"response format {text_format.name!r}",
        )
    for index, item in enumerate(request.input_items):
        if isinstance(item, ToolSearchOutputItem):
            check_loaded_tools(item.tools, f"input[{index}].tools")
        if isinstance(item, MessageItem) and not isinstance(item.content, str):
            for part_index, part in enumerate(item.content):
                if isinstance(part, UnsupportedPart):
                    raise InvalidRequestError(
                        f"Content of type {part.type!r} is not supported: gpt-oss models "
                        "read text only. Send 'input_text' parts.",
                        param=f"input[{index}].content[{part_index}].type",
                        code="unsupported_value",
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
