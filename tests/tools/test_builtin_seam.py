"""The built-in tool seam: every registered tool's descriptor is complete and consistent.

Each tool in `tools.builtin.BUILTIN_TOOLS` is declared once; these tests check what
it declares against the OpenAI SDK's types and against what the server does with
it: asked for, rendered into the prompt, called by the scripted model, routed,
streamed as its item and events, echoed back as input, metered.
"""

from __future__ import annotations

import importlib
import pathlib
import re
import typing
from typing import Any

import pytest
import trio
from openai.types.responses import (
    ResponseIncludable,
    ResponseInputItem,
    ResponseOutputItem,
    ResponseStreamEvent,
    Tool,
)
from openai.types.responses.tool_choice_types import ToolChoiceTypes
from openai_harmony import ToolDescription

from tests.support import check_stream, validate_response
from trio_responses.engine.script import plan
from trio_responses.harmony.encoding import get_encoding
from trio_responses.harmony.prompt import (
    PromptTools,
    ToolNamespace,
    build_conversation,
    item_messages,
    render_prompt,
)
from trio_responses.harmony.translator import TurnTranslator
from trio_responses.metrics import Metrics
from trio_responses.protocol.builder import ResponseBuilder, request_echo
from trio_responses.protocol.codec import decode_event
from trio_responses.protocol.request import (
    SUPPORTED_INCLUDES,
    CreateRequest,
    parse_create_request,
    parse_input_item,
)
from trio_responses.tools import builtin
from trio_responses.tools.builtin import (
    BUILTIN_TOOLS,
    NAMESPACES,
    BuiltinItem,
    BuiltinTool,
    BuiltinToolParam,
    literal_values,
    requested_namespaces,
)
from trio_responses.tools.pool import ToolServerPool
from trio_responses.tools.toolbox import RESERVED_LABELS, Toolbox

BY_NAME = {tool.name: tool for tool in BUILTIN_TOOLS}


def _members(union: Any) -> list[Any]:
    """The classes of a (possibly annotated, nested) union of the SDK."""
    if typing.get_origin(union) is typing.Annotated:
        return _members(typing.get_args(union)[0])
    if typing.get_origin(union) is typing.Union:
        return [member for arg in typing.get_args(union) for member in _members(arg)]
    return [union]


def _sdk_types(union: Any) -> set[str]:
    """Every ``type`` value the members of an SDK union accept."""
    found: set[str] = set()
    for member in _members(union):
        field = member.model_fields.get("type")
        if field is not None:
            found |= {
                value for value in typing.get_args(field.annotation) if isinstance(value, str)
            }
    return found


def test_every_tool_module_is_registered_and_every_tool_has_a_module() -> None:
    """A tool module left out of the list would silently not be a tool."""
    folder = pathlib.Path(builtin.__file__).parent
    modules = sorted(path.stem for path in folder.glob("*.py") if not path.stem.startswith("_"))
    tools = [importlib.import_module(f"{builtin.__name__}.{name}").TOOL for name in modules]
    assert sorted(map(id, tools)) == sorted(map(id, BUILTIN_TOOLS)), modules


@pytest.mark.parametrize("tool", BUILTIN_TOOLS, ids=lambda tool: tool.name)
def test_request_side_is_the_sdks(tool: BuiltinTool) -> None:
    assert issubclass(tool.param, BuiltinToolParam)
    assert tool.name in tool.types and set(tool.listed_types) <= set(tool.types)
    assert set(tool.types) <= _sdk_types(Tool)
    assert set(tool.choice_types) <= set(
        typing.get_args(ToolChoiceTypes.model_fields["type"].annotation)
    )
    assert tool.includes <= set(typing.get_args(ResponseIncludable))
    assert tool.includes <= SUPPORTED_INCLUDES
    assert tool.echo_exclude <= set(tool.param.model_fields)
    item_types = [literal_values(model) for model in tool.input_items]
    assert all(len(values) == 1 for values in item_types), item_types
    assert (tool.item.type,) in item_types
    assert {values[0] for values in item_types} <= _sdk_types(ResponseInputItem)
    assert all(issubclass(model, BuiltinItem) for model in tool.input_items)


@pytest.mark.parametrize("tool", BUILTIN_TOOLS, ids=lambda tool: tool.name)
def test_item_and_events_are_the_sdks(tool: BuiltinTool) -> None:
    item = tool.item
    assert item.type in _sdk_types(ResponseOutputItem)
    assert set(item.events) <= _sdk_types(ResponseStreamEvent), item.events
    assert (item.input_done is None or item.input_field is not None) and (
        item.input_field is None or item.action is None
    )
    opened = item.new("x.y")
    assert opened["id"].startswith(f"{item.id_prefix}_")
    assert opened["type"] == item.type and opened["status"] == "in_progress"


@pytest.mark.parametrize("tool", BUILTIN_TOOLS, ids=lambda tool: tool.name)
def test_harmony_runner_metrics_and_script_agree(tool: BuiltinTool) -> None:
    harmony, runner = tool.harmony, tool.runner
    namespace = harmony.namespace
    assert re.fullmatch(r"[a-z][a-z0-9_]*", tool.metrics_label)
    calls = tool.script.find(tool.script.example)
    assert calls, "the example must trigger the tool"
    _, recipient, _ = calls[0]
    if namespace is None:  # the request names the namespace (an MCP server's label)
        assert runner.server is None and harmony.system is None and harmony.forced is None
        return
    assert NAMESPACES[namespace] is tool and namespace in RESERVED_LABELS
    assert harmony.calls(recipient), recipient
    assert harmony.system is not None
    assert harmony.forced is not None and harmony.calls(harmony.forced.recipient)
    assert runner.server is not None
    assert "{type}" in runner.missing and runner.server in runner.missing


def _prompt_tools(tool: BuiltinTool, request: CreateRequest, recipient: str) -> PromptTools:
    if tool.harmony.namespace is not None:
        return PromptTools(builtin=requested_namespaces(request.tools))
    label, _, name = recipient.partition(".")
    described = (ToolDescription.new(name, "", {"type": "object"}),)
    return PromptTools(namespaces=(ToolNamespace(label, None, described),))


def _builder(request: CreateRequest, events: list[dict[str, Any]]) -> ResponseBuilder:
    builder = ResponseBuilder(
        response_id="resp_seam",
        model="m",
        created_at=0,
        echo=request_echo(request),
        background=False,
        emit=lambda frame: events.append(decode_event(frame)),
    )
    builder.start()
    builder.mark_in_progress()
    return builder


@pytest.mark.parametrize("ok", [True, False], ids=["answered", "failed"])
@pytest.mark.parametrize("tool", BUILTIN_TOOLS, ids=lambda tool: tool.name)
async def test_declared_once_rendered_called_streamed_and_echoed(
    tool: BuiltinTool, ok: bool, nursery: trio.Nursery
) -> None:
    _, recipient, body = tool.script.find(tool.script.example)[0]
    request = parse_create_request(
        {"model": "m", "input": tool.script.example, "tools": [dict(tool.example)]}
    )
    echoed = request_echo(request)["tools"]
    assert echoed[0]["type"] == tool.name and not tool.echo_exclude & set(echoed[0])

    # Rendered: the model sees the tool, and the scripted model calls it.
    tools = _prompt_tools(tool, request, recipient)
    prompt = render_prompt(
        build_conversation(request, request.input_items, date="2026-01-01", tools=tools)
    )
    text = get_encoding().decode(prompt)
    if tool.harmony.namespace is not None:
        assert f"## {tool.harmony.namespace}\n" in text.split("<|end|>")[0]
    script = plan(prompt)
    answer = get_encoding().decode(list(script.tokens))
    assert f"<|channel|>{tool.harmony.channel} to={recipient}" in answer

    # Routed by the response's toolbox to this tool, and streamed as its item.
    events: list[dict[str, Any]] = []
    builder = _builder(request, events)
    toolbox = Toolbox(
        request, ToolServerPool([]), nursery=nursery, tool_timeout_s=1, close_timeout_s=1
    )
    assert toolbox.route(recipient) is tool
    translator = TurnTranslator(builder, toolbox.route)
    translator.feed(script.tokens)
    outcome = translator.finish("stop")
    assert outcome.kind == "tool_call" and outcome.call is not None
    assert outcome.call.tool is tool and outcome.call.recipient == recipient
    assert outcome.call.arguments == body
    item = builder.finish_tool_call("the tool's answer", ok=ok)
    builder.finish("completed", now=1)
    check_stream(events)
    validate_response(events[-1]["response"])
    assert item["type"] == tool.item.type and item["status"] == ("completed" if ok else "failed")
    emitted = [
        event["type"]
        for event in events
        if event.get("item_id") == item["id"]
        and not event["type"].startswith("response.output_item")
    ]
    expected = [
        tool.item.in_progress,
        *([tool.item.input_delta] if tool.item.input_delta is not None else []),
        *([tool.item.input_done] if tool.item.input_done is not None else []),
        *([tool.item.running[1]] if tool.item.running is not None else []),
        *([tool.item.completed] if ok else [tool.item.failed] if tool.item.failed else []),
    ]
    assert [kind for i, kind in enumerate(emitted) if i == 0 or kind != emitted[i - 1]] == expected

    # Echoed back as input, it is the tool's item again, and shows the call (or nothing).
    parsed = parse_input_item(item)
    assert type(parsed) in tool.input_items and parsed.type == tool.item.type
    messages = item_messages(parsed)
    if messages:
        assert messages[0].recipient == recipient and messages[0].channel == tool.harmony.channel
        assert messages[1].author.name == recipient


@pytest.mark.parametrize("tool", BUILTIN_TOOLS, ids=lambda tool: tool.name)
def test_calls_are_metered_under_the_tools_label(tool: BuiltinTool) -> None:
    metrics = Metrics(model="m", engine="scripted")
    metrics.tool_call(tool.metrics_label, "ok", 0.25)
    exposition = metrics.render().decode()
    assert f'trio_responses_tool_calls_total{{kind="{tool.metrics_label}",outcome="ok"}} 1.0' in (
        exposition
    )
