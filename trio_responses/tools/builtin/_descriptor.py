"""What a built-in tool declares: one frozen `BuiltinTool` value (sans-IO).

A built-in tool (``code_interpreter``, ``web_search``, remote ``mcp``) touches every
layer of a response: the ``tools[]`` entry that asks for it, the harmony namespace
the model calls it by, the output item and events that stream the call, the server
that runs it, its metrics label and the scripted model's directive for it. Each is
one field here; the rest of the package reads them and knows no tool by name.

Everything here is pure data and pure functions: this module and the tool modules
import pydantic, openai_harmony and the leaves of the sans-IO core
(``protocol.ids``, ``_exceptions``), never ``trio`` nor a
module that imports the registry (``protocol.request``, ``protocol.builder``,
``harmony.*``): those import the registry, so the tools stay below them. A call is
*run* by `tools.toolbox.Toolbox`, which does what the tool's `Runner` says.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, get_args

from openai_harmony import SystemContent
from pydantic import BaseModel, ConfigDict

STRICT = ConfigDict(strict=True, extra="forbid")
"""The config of request models: no type coercion, unknown fields refused (see
`protocol.request`)."""


class BuiltinToolParam(BaseModel):
    """A ``tools[]`` entry that asks for a built-in tool (its ``type`` a Literal)."""

    type: str


class BuiltinItem(BaseModel):
    """An input item a built-in tool defines (its ``type`` a Literal): the tool's
    output items, echoed back by clients."""

    type: str


def literal_values(model: type[BaseModel]) -> tuple[str, ...]:
    """The values of a model's ``type`` field (a Literal)."""
    return tuple(str(value) for value in get_args(model.model_fields["type"].annotation))


# -- the output item and its events (read by protocol.builder) -------------------------------


class RecordResult(Protocol):
    """Writes what the tool answered into the call's item (``outputs``, ``output``...)."""

    def __call__(
        self,
        item: dict[str, Any],
        output: str,
        *,
        ok: bool,
        error: dict[str, Any] | None,
        approval_request_id: str | None,
    ) -> None: ...


def record_nothing(
    item: dict[str, Any],
    output: str,
    *,
    ok: bool,
    error: dict[str, Any] | None,
    approval_request_id: str | None,
) -> None:
    """A `RecordResult` for items that do not show the tool's answer."""


@dataclass(frozen=True)
class ToolItem:
    """A call of the tool as an output item, and the events that stream it.

    The item is opened when the model addresses the tool (``output_item.added``,
    then `in_progress`); the model's text streams as `input_delta` events; when the
    call is complete the text goes into `input_field` (or becomes the item's
    ``action``), `input_done` and `running` are emitted and the tool runs; its answer
    is recorded (`record_result`), `completed` or `failed` emitted and the item
    closed (``output_item.done``).
    """

    type: str
    """The item's ``type`` (``code_interpreter_call``)."""
    id_prefix: str
    """The prefix of its ids (``ci``)."""
    new: Callable[[str], dict[str, Any]]
    """The open item for a call of recipient: a fresh id, ``type``, ``status``
    ``in_progress`` and the item's other fields, in the order the API shows them."""
    in_progress: str
    """The event after ``output_item.added``."""
    completed: str
    """The event when the tool answered."""
    failed: str | None = None
    """The event when the call failed (None: none, the item ends ``failed``)."""
    input_delta: str | None = None
    """The event of each piece of the model's text (None: not streamed)."""
    input_field: str | None = None
    """The item field that holds the model's text (None: the item does not show it)."""
    input_done: str | None = None
    """The event with the whole text (as ``input_field``) once the call is complete."""
    running: tuple[str, str] | None = None
    """The item's status while the tool runs, and the event that says so."""
    action: Callable[[str, str], dict[str, Any]] | None = None
    """(recipient, the model's text) -> the item's ``action`` (set when complete)."""
    record_result: RecordResult = record_nothing

    @property
    def events(self) -> tuple[str, ...]:
        """Every event type this item emits besides ``output_item.added``/``.done``."""
        running = self.running[1] if self.running is not None else None
        declared = (
            self.in_progress,
            self.input_delta,
            self.input_done,
            running,
            self.completed,
            self.failed,
        )
        return tuple(event for event in declared if event is not None)


# -- the model's side (read by harmony) -----------------------------------------------------


@dataclass(frozen=True)
class ForcedCall:
    """The call ``tool_choice`` forces: its recipient and the arguments' JSON schema."""

    recipient: str
    schema: Mapping[str, Any] | None = None
    """None: the body is free text (``code``) or any JSON object."""


History = Callable[[Any], tuple[str, str, str] | None]
"""An item of the tool in a later prompt: (recipient, what the model wrote, what the
tool answered), shown as a call and its output; None: the item shows nothing."""


def no_history(item: Any) -> None:
    """A `History` for items that show nothing in later prompts."""


@dataclass(frozen=True)
class HarmonyTool:
    """How the model sees and calls the tool (harmony)."""

    namespace: str | None
    """The namespace of its calls (``python``, ``browser``); None: the request names
    them (an MCP server's label), shown in the developer message."""
    channel: Literal["analysis", "commentary"]
    """The channel of its calls and of their outputs."""
    content_type: Literal["code", "json"]
    """How a call's body is written: free text (``code``) or JSON."""
    commands: frozenset[str] | None = None
    """The tools of the namespace the model may call (``browser.search``...); None:
    any name, and the namespace alone (``python``)."""
    system: Callable[[SystemContent], SystemContent] | None = None
    """Shows the tool in the system message (``SystemContent.with_python_tool``)."""
    forced: ForcedCall | None = None
    """The call a ``tool_choice`` of this tool forces."""
    history: History = no_history

    def calls(self, recipient: str) -> bool:
        """Whether ``recipient`` is a call of this tool's namespace."""
        head, _, name = recipient.partition(".")
        if head != self.namespace:
            return False
        return self.commands is None or name in self.commands


# -- running a call (done by tools.toolbox) ---------------------------------------------------


@dataclass(frozen=True)
class CallContext:
    """What a call's `Runner.context` may read besides the model's arguments."""

    entry: BuiltinToolParam
    """The request's ``tools[]`` entry of the tool."""
    response_id: str
    conversation_id: str | None = None
    previous_response_id: str | None = None


@dataclass(frozen=True)
class Runner:
    """What runs a call: a tool of a configured tool server (``--tool-server``)."""

    server: str | None
    """The label of the tool server that runs the calls (``python``); None: the MCP
    server the recipient names (the request's, or a configured one)."""
    tool: Callable[[str], str]
    """The server's tool for a recipient."""
    arguments: Callable[[str], dict[str, Any]] | None = None
    """The model's text -> the tool's arguments; None: the text is a JSON object."""
    context: Callable[[CallContext], dict[str, Any]] | None = None
    """Arguments added to every call, over the model's (the model cannot set them);
    each one only when the server's tool declares it in its input schema, so that a
    server without it gets the model's arguments alone."""
    run_slots: bool = False
    """Whether a call holds a run slot (`tools.budget.RunSlots`) while it runs."""
    containers: bool = False
    """Whether a call runs in the response's container when the server runs the
    code interpreter itself (``--code-interpreter``: `tools.containers`) rather
    than on the tool server ``server``."""
    missing: str = ""
    """The 400 when ``server`` is not configured; ``{type}`` is the entry's type."""
    unconfigured: str | None = None
    """When set, a request offering the tool is accepted though ``server`` is not
    configured, and a call the model makes anyway fails with this text (the model
    reads it); None: such a request gets the ``missing`` 400."""


def tool_after_dot(recipient: str) -> str:
    """``browser.search`` -> ``search``: the server's tool is the command."""
    return recipient.partition(".")[2]


# -- the scripted model (read by engine.script) ---------------------------------------------


Directive = Callable[[str], Sequence[tuple[int, str, str]]]
"""User text -> every call of the tool it asks for: (position in the text, recipient,
the call's body), at most one per match of the directive."""


@dataclass(frozen=True)
class ScriptDirective:
    """How the scripted model's user text triggers the tool (`engine.script`)."""

    find: Directive
    example: str
    """A user text that makes the scripted model call the tool."""
    default_body: Callable[[str], str] | None = None
    """The body of a prefilled call the text has no directive for, from the
    unconstrained answer (``code`` tools; JSON tools get ``{}``)."""


def json_object_at(text: str, position: int) -> str | None:
    """The JSON object text starting at ``position``, if there is one."""
    try:
        value, end = json.JSONDecoder().raw_decode(text, position)
    except json.JSONDecodeError:
        return None
    return text[position:end] if isinstance(value, dict) else None


# -- the descriptor ------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class BuiltinTool:
    """Everything the server knows about one built-in tool (one value per tool:
    compared and hashed by identity).

    `tests/tools/test_builtin_seam.py` checks that every registered tool's fields
    agree with each other and with the OpenAI SDK's types.
    """

    name: str
    """The tool's ``tools[].type`` (``web_search``)."""
    param: type[BuiltinToolParam]
    """The model of its ``tools[]`` entry; its ``type`` Literal lists every alias."""
    listed_types: tuple[str, ...]
    """The types an error listing the supported tools names (dated aliases left out)."""
    input_items: tuple[type[BuiltinItem], ...]
    """Every input item type the tool defines (its output items, echoed back)."""
    item: ToolItem
    harmony: HarmonyTool
    runner: Runner
    metrics_label: str
    """``kind`` of its ``trio_responses_tool_calls_total`` samples."""
    script: ScriptDirective
    example: Mapping[str, Any]
    """A ``tools[]`` entry asking for the tool (the contract test sends it with
    ``script.example``)."""
    includes: frozenset[str] = frozenset()
    """Its values of the request's ``include``."""
    choice_types: tuple[str, ...] = ()
    """``tool_choice: {"type": T}`` values that force a call of it."""
    check: Callable[[Any, int], None] | None = None
    """Further checks of a ``tools[index]`` entry; raises `InvalidRequestError`."""
    echo_exclude: frozenset[str] = frozenset()
    """Fields of the entry never stored nor echoed in a Response (credentials)."""

    @property
    def types(self) -> tuple[str, ...]:
        """Every ``tools[].type`` that asks for this tool."""
        return literal_values(self.param)
