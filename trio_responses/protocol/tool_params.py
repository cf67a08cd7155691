"""The ``tools`` and ``tool_choice`` of a create request: their models and checks (sans-IO).

Function, custom and namespace tools, client-executed ``tool_search``, the built-in
tools' entries (from their descriptors, `tools.builtin`) and the types refused by
name; the ``tool_choice`` objects, ``allowed_tools`` included. `check_tools` is the
request's tool checks, run by `protocol.request.parse_create_request`.

Tools sent with ``defer_loading`` are hidden from the model until a
``tool_search_output`` item in the conversation loads them: `visible_tools` is the
set the model sees, read through `CreateRequest`'s ``function_tools``,
``custom_tools`` and ``namespace_tools``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field

from .._exceptions import InvalidRequestError
from ..tools.builtin import (
    BUILTIN_TOOLS,
    NAMESPACES,
    BuiltinToolParam,
    requested_namespaces,
    tool_for_choice,
    tool_for_param,
)
from .grammar import Grammar, check_grammar
from .json_schema import check_json_schema

if TYPE_CHECKING:
    from .request import CreateRequest

STRICT = ConfigDict(strict=True, extra="forbid")
REFUSED = ConfigDict(strict=True, extra="allow")
"""For types the server refuses whatever their fields (`UnsupportedTool`): the
refusal names the type, not a field."""


class FunctionTool(BaseModel):
    model_config = STRICT
    type: Literal["function"]
    name: Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    defer_loading: bool | None = None
    """Hidden from the model until a ``tool_search_output`` item loads it."""
    # Accepted and ignored: they do not change what the model sees.
    allowed_callers: list[str] | None = None
    output_schema: dict[str, Any] | None = None


class NamespaceTool(BaseModel):
    """Functions grouped under a namespace (Codex's ``multi_agent_v1``): rendered as
    their own harmony namespace; the model calls ``NAMESPACE.NAME``, and the
    ``function_call`` item carries ``namespace``."""

    model_config = STRICT
    type: Literal["namespace"]
    name: Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]
    description: str | None = None
    tools: Annotated[list[FunctionTool], Field(min_length=1, max_length=128)]
    defer_loading: bool | None = None


class CustomFormatText(BaseModel):
    model_config = STRICT
    type: Literal["text"]


class CustomFormatGrammar(BaseModel):
    model_config = STRICT
    type: Literal["grammar"]
    syntax: Literal["lark", "regex"]
    definition: str


class CustomTool(BaseModel):
    """A tool whose input is free text, optionally in a grammar (``format``)."""

    model_config = STRICT
    type: Literal["custom"]
    name: Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]
    description: str | None = None
    format: (
        Annotated[CustomFormatText | CustomFormatGrammar, Field(discriminator="type")] | None
    ) = None
    defer_loading: bool | None = None
    # Accepted and ignored: they do not change what the model sees.
    allowed_callers: list[str] | None = None

    @property
    def grammar(self) -> Grammar | None:
        """The input's grammar (None: any text). Valid once the request is parsed."""
        fmt = self.format
        if isinstance(fmt, CustomFormatGrammar):
            return Grammar(fmt.syntax, fmt.definition)
        return None


class ToolSearchTool(BaseModel):
    """``tool_search`` run by the client: the model calls it as the function
    ``tool_search``; the call is a ``tool_search_call`` item and the client answers
    with a ``tool_search_output`` item whose ``tools`` the model may call from then
    on (tools sent with ``defer_loading`` stay hidden until loaded this way)."""

    model_config = STRICT
    type: Literal["tool_search"]
    execution: Literal["server", "client"] | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None

    @property
    def search_parameters(self) -> dict[str, Any]:
        return self.parameters or TOOL_SEARCH_PARAMETERS


TOOL_SEARCH = "tool_search"
"""The function name the model calls tool search by."""

TOOL_SEARCH_DESCRIPTION = (
    "Search for more tools. The tools found become available to call afterwards."
)
TOOL_SEARCH_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"query": {"type": "string", "description": "What the tool should do."}},
    "required": ["query"],
}


class UnsupportedTool(BaseModel):
    model_config = REFUSED
    type: Literal[
        "file_search",
        "computer",
        "computer_use_preview",
        "image_generation",
        "local_shell",
        "shell",
        "apply_patch",
        "programmatic_tool_calling",
    ]


if TYPE_CHECKING:
    Tool = (
        FunctionTool
        | CustomTool
        | NamespaceTool
        | ToolSearchTool
        | BuiltinToolParam
        | UnsupportedTool
    )
    HostedChoiceType = str
else:
    Tool = Annotated[
        Union[
            (
                FunctionTool,
                CustomTool,
                NamespaceTool,
                ToolSearchTool,
                *(tool.param for tool in BUILTIN_TOOLS),
                UnsupportedTool,
            )
        ],
        Field(discriminator="type"),
    ]
    HostedChoiceType = Literal[tuple(t for tool in BUILTIN_TOOLS for t in tool.choice_types)]

# -- other structured fields ----------------------------------------------------------------


class ToolChoiceFunction(BaseModel):
    model_config = STRICT
    type: Literal["function"]
    name: str


class ToolChoiceMcp(BaseModel):
    model_config = STRICT
    type: Literal["mcp"]
    server_label: str
    name: str | None = None


class ToolChoiceCustom(BaseModel):
    """``{"type": "custom", "name": …}``: a call of that custom tool."""

    model_config = STRICT
    type: Literal["custom"]
    name: str


class ToolChoiceHosted(BaseModel):
    """``{"type": T}`` forcing a call of the built-in tool with choice type T."""

    model_config = STRICT
    type: HostedChoiceType


class ToolChoiceAllowed(BaseModel):
    """``{"type": "allowed_tools", "mode": …, "tools": [...]}``: only the listed tools
    may be called (the others are not shown to the model); ``required`` forces a call
    of one of them. Entries name tools as ``tool_choice`` does: ``{"type": "function",
    "name"}``, ``{"type": "custom", "name"}``, ``{"type": "mcp", "server_label",
    "name"?}`` or a built-in tool's type."""

    model_config = STRICT
    type: Literal["allowed_tools"]
    mode: Literal["auto", "required"]
    tools: Annotated[list[dict[str, Any]], Field(min_length=1, max_length=128)]


ToolChoiceObject = Annotated[
    ToolChoiceFunction | ToolChoiceCustom | ToolChoiceMcp | ToolChoiceHosted | ToolChoiceAllowed,
    Field(discriminator="type"),
]


_SUPPORTED_TOOL_TYPES = ", ".join(
    [
        "function",
        "custom",
        "namespace",
        "tool_search",
        *(listed for tool in BUILTIN_TOOLS for listed in tool.listed_types),
    ]
)


# -- what the model sees -------------------------------------------------------------------


def visible_tools(declared: Sequence[Tool], loaded: Sequence[Tool]) -> list[Tool]:
    """The request's tools the model sees: those not deferred, then the ``loaded`` ones
    (a loaded tool replaces a declared one of its name; a loaded namespace adds its
    functions to one of its name)."""
    shown: dict[tuple[str, str], Tool] = {}
    for tool in declared:
        if isinstance(tool, NamespaceTool):
            functions = [f for f in tool.tools if not f.defer_loading]
            if tool.defer_loading or not functions:
                continue
            tool = tool.model_copy(update={"tools": functions})
        elif isinstance(tool, FunctionTool | CustomTool) and tool.defer_loading:
            continue
        shown[_key(tool)] = tool
    for tool in loaded:
        key = _key(tool)
        earlier = shown.get(key)
        if isinstance(tool, NamespaceTool) and isinstance(earlier, NamespaceTool):
            names = {f.name for f in tool.tools}
            merged = [*(f for f in earlier.tools if f.name not in names), *tool.tools]
            tool = tool.model_copy(update={"tools": merged})
        shown[key] = tool
    return list(shown.values())


def _key(tool: Tool) -> tuple[str, str]:
    if isinstance(tool, NamespaceTool):
        return ("namespace", tool.name)
    if isinstance(tool, FunctionTool | CustomTool):
        return ("function", tool.name)  # one name space: both are called functions.NAME
    return (tool.type, "")


def loaded_name(tool: Tool) -> str:
    """How the model calls a loaded tool: ``NAME``, or ``NAMESPACE.*`` for a namespace's."""
    if isinstance(tool, NamespaceTool):
        return ", ".join(f"{tool.name}.{function.name}" for function in tool.tools)
    return getattr(tool, "name", tool.type)


def check_loaded_tools(tools: Sequence[Tool], param: str) -> None:
    """Tools a ``tool_search_output`` item loads: functions, custom and namespace tools
    (the others cannot be added mid-conversation), each checked as a request's are."""
    for index, tool in enumerate(tools):
        if not isinstance(tool, FunctionTool | CustomTool | NamespaceTool):
            raise InvalidRequestError(
                f"tool_search_output can load function, custom and namespace tools, "
                f"not {tool.type!r}.",
                param=f"{param}[{index}].type",
                code="unsupported_value",
            )
        check_definition(tool, f"{param}[{index}]")


def check_definition(tool: FunctionTool | CustomTool | NamespaceTool, param: str) -> None:
    """A function's parameters (a namespace's functions' too) must be a JSON schema this
    server can check, a custom tool's grammar must compile; ``param`` names the tool."""
    if isinstance(tool, FunctionTool) and tool.parameters:  # missing or {}: any arguments
        check_json_schema(
            tool.parameters,
            param=f"{param}.parameters",
            what=f"the parameters of function {tool.name!r}",
        )
    elif isinstance(tool, NamespaceTool):
        for inner, function in enumerate(tool.tools):
            if function.parameters:
                check_json_schema(
                    function.parameters,
                    param=f"{param}.tools[{inner}].parameters",
                    what=f"the parameters of function {tool.name}.{function.name}",
                )
    elif isinstance(tool, CustomTool) and isinstance(tool.format, CustomFormatGrammar):
        check_grammar(
            tool.format.syntax,
            tool.format.definition,
            param=f"{param}.format.definition",
            name=tool.name,
        )


# -- checks ---------------------------------------------------------------------------------


def check_tools(request: CreateRequest) -> None:
    """Raise `InvalidRequestError` for tools or a ``tool_choice`` the server cannot take."""
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
        if isinstance(tool, FunctionTool | CustomTool | NamespaceTool):
            check_definition(tool, f"tools[{index}]")
    seen: set[str] = set()
    for index, function in enumerate(request.tools):
        if isinstance(function, FunctionTool):
            if function.name in seen:
                raise InvalidRequestError(
                    f"Duplicate function name {function.name!r} in 'tools'.",
                    param=f"tools[{index}].name",
                )
            seen.add(function.name)
    choice = request.tool_choice
    if isinstance(choice, ToolChoiceFunction) and choice.name not in seen:
        raise InvalidRequestError(
            f"tool_choice names function {choice.name!r}, which is not in 'tools'.",
            param="tool_choice",
        )
    _check_custom_tools(request, seen)
    _check_namespace_tools(request)
    _check_tool_search(request, seen)
    allowed_recipients(request)


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
    declared = request.tools
    functions = {t.name for t in declared if isinstance(t, FunctionTool | CustomTool)}
    if any(isinstance(t, ToolSearchTool) for t in declared):
        functions.add(TOOL_SEARCH)
    grouped = {
        f"{g.name}.{tool.name}"
        for g in declared
        if isinstance(g, NamespaceTool)
        for tool in g.tools
    }
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
    tool's, an MCP server's label, another namespace), functions unique within it."""
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


def _check_custom_tools(request: CreateRequest, functions: set[str]) -> None:
    """Custom tools: names unique among functions and custom tools (the model calls
    both as ``functions.NAME``), a ``tool_choice`` naming one."""
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
    choice = request.tool_choice
    if isinstance(choice, ToolChoiceCustom) and choice.name not in names:
        raise InvalidRequestError(
            f"tool_choice names custom tool {choice.name!r}, which is not in 'tools'.",
            param="tool_choice",
        )


def _check_tool_search(request: CreateRequest, functions: set[str]) -> None:
    """At most one ``tool_search``, executed by the client, its name not a function's."""
    found = [(i, t) for i, t in enumerate(request.tools) if isinstance(t, ToolSearchTool)]
    if len(found) > 1:
        raise InvalidRequestError(
            "Only one tool_search tool may be sent.", param=f"tools[{found[1][0]}].type"
        )
    for index, tool in found:
        if tool.execution != "client":
            raise InvalidRequestError(
                "tool_search run by the server is not supported: send it with "
                '"execution": "client" and answer each tool_search_call with a '
                "tool_search_output item listing the tools found.",
                param=f"tools[{index}].execution",
                code="unsupported_value",
            )
        if TOOL_SEARCH in functions or any(
            isinstance(t, CustomTool) and t.name == TOOL_SEARCH for t in request.tools
        ):
            raise InvalidRequestError(
                f"A function named {TOOL_SEARCH!r} clashes with the tool_search tool.",
                param=f"tools[{index}]",
            )
        if tool.parameters:
            check_json_schema(
                tool.parameters,
                param=f"tools[{index}].parameters",
                what="the parameters of tool_search",
            )
