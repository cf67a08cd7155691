"""Custom tools through the openai SDK: free-text input, in a grammar when one is given.

The scripted model calls a custom tool on ``custom:NAME <<<INPUT>>>`` (``custom:NAME``
alone: the input is up to the model). A tool with a grammar makes the server
constrain the call's body to it; the scripted model then writes the given input
when the grammar takes it, else a short sentence of the grammar.
"""

from __future__ import annotations

import re
from typing import Any

import openai
import pytest
from lark import Lark

from tests.support import MODEL, Server, check_stream

# Codex's apply_patch grammar: its terminals /(.*)/ may be empty, which lark's own
# parsers refuse (and vLLM's grammar engines accept).
APPLY_PATCH_GRAMMAR = r"""
start: begin_patch hunk+ end_patch
begin_patch: "*** Begin Patch" LF
end_patch: "*** End Patch" LF?

hunk: add_hunk | delete_hunk | update_hunk
add_hunk: "*** Add File: " filename LF add_line+
delete_hunk: "*** Delete File: " filename LF
update_hunk: "*** Update File: " filename LF change_move? change?

filename: /(.+)/
add_line: "+" /(.*)/ LF -> line

change_move: "*** Move to: " filename LF
change: (change_context | change_line)+ eof_line?
change_context: ("@@" | "@@ " /(.+)/) LF
change_line: ("+" | "-" | " ") /(.*)/ LF
eof_line: "*** End of File" LF

%import common.LF
"""
# The same language without empty lines: lark can parse it, so the tests can check.
PARSEABLE_PATCH_GRAMMAR = APPLY_PATCH_GRAMMAR.replace("/(.*)/", "/(.+)/")

PATCH = "*** Begin Patch\n*** Add File: hello.txt\n+hello world\n*** End Patch\n"


def apply_patch(definition: str = APPLY_PATCH_GRAMMAR) -> dict[str, Any]:
    return {
        "type": "custom",
        "name": "apply_patch",
        "description": "Edit files with a patch.",
        "format": {"type": "grammar", "syntax": "lark", "definition": definition},
    }


NOTE = {"type": "custom", "name": "note", "description": "Write a note."}
TICKET = {
    "type": "custom",
    "name": "ticket",
    "format": {"type": "grammar", "syntax": "regex", "definition": r"[A-Z]{3}-\d{2,4}"},
}


def _custom_calls(output: list[Any]) -> list[Any]:
    return [item for item in output if item.type == "custom_tool_call"]


async def test_a_text_custom_tool_gets_the_raw_input(server: Server) -> None:
    response = await server.client.responses.create(
        model=MODEL, input="custom:note <<<buy {milk}\nand eggs>>>", tools=[NOTE]
    )
    (call,) = _custom_calls(response.output)
    assert call.name == "note"
    assert call.input == "buy {milk}\nand eggs"
    assert call.id.startswith("ctc_") and call.call_id.startswith("call_")
    assert call.status == "completed"
    assert response.status == "completed"
    assert response.tools[0].type == "custom"


async def test_a_patch_the_grammar_takes_is_passed_as_written(server: Server) -> None:
    response = await server.client.responses.create(
        model=MODEL, input=f"Add it. custom:apply_patch <<<{PATCH}>>>", tools=[apply_patch()]
    )
    (call,) = _custom_calls(response.output)
    assert call.input == PATCH


async def test_without_an_input_the_model_writes_a_sentence_of_the_lark_grammar(
    server: Server,
) -> None:
    response = await server.client.responses.create(
        model=MODEL,
        input="custom:apply_patch",
        tools=[apply_patch(PARSEABLE_PATCH_GRAMMAR)],
    )
    (call,) = _custom_calls(response.output)
    Lark(PARSEABLE_PATCH_GRAMMAR, start="start").parse(call.input)  # raises if not


async def test_codex_apply_patch_grammar_is_accepted_and_followed(server: Server) -> None:
    response = await server.client.responses.create(
        model=MODEL, input="custom:apply_patch <<<not a patch>>>", tools=[apply_patch()]
    )
    (call,) = _custom_calls(response.output)
    # lark cannot parse this grammar (empty terminals): the patch's shape tells.
    assert re.fullmatch(r"\*\*\* Begin Patch\n(.+\n)+\*\*\* End Patch\n?", call.input)


async def test_an_input_outside_the_regex_is_replaced_by_one_inside(server: Server) -> None:
    kept = await server.client.responses.create(
        model=MODEL, input="custom:ticket <<<ABC-123>>>", tools=[TICKET]
    )
    assert _custom_calls(kept.output)[0].input == "ABC-123"
    replaced = await server.client.responses.create(
        model=MODEL, input="custom:ticket <<<abc>>>", tools=[TICKET]
    )
    (call,) = _custom_calls(replaced.output)
    assert re.fullmatch(r"[A-Z]{3}-\d{2,4}", call.input)


async def test_streamed_input_deltas_add_up_to_the_input(server: Server) -> None:
    stream = await server.client.responses.create(
        model=MODEL,
        input=f"custom:apply_patch <<<{PATCH}>>>",
        tools=[apply_patch()],
        stream=True,
    )
    events = [event.model_dump(mode="json", exclude_none=True) async for event in stream]
    check_stream(events)
    deltas = [e for e in events if e["type"] == "response.custom_tool_call_input.delta"]
    (done,) = [e for e in events if e["type"] == "response.custom_tool_call_input.done"]
    assert len(deltas) > 1
    assert "".join(e["delta"] for e in deltas) == done["input"] == PATCH
    (item,) = [
        e["item"]
        for e in events
        if e["type"] == "response.output_item.done" and e["item"]["type"] == "custom_tool_call"
    ]
    assert item["input"] == PATCH and item["id"] == done["item_id"]


async def test_the_output_goes_back_to_the_model(server: Server) -> None:
    first = await server.client.responses.create(
        model=MODEL, input=f"custom:apply_patch <<<{PATCH}>>>", tools=[apply_patch()]
    )
    (call,) = _custom_calls(first.output)
    second = await server.client.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        input=[{"type": "custom_tool_call_output", "call_id": call.call_id, "output": "Done!"}],
        tools=[apply_patch()],
    )
    assert second.output_text == "Tool result: Done!"


async def test_a_whole_history_with_output_parts_is_read(server: Server) -> None:
    response = await server.client.responses.create(
        model=MODEL,
        input=[
            {"role": "user", "content": "custom:note <<<hi>>>"},
            {"type": "custom_tool_call", "call_id": "call_1", "name": "note", "input": "hi"},
            {
                "type": "custom_tool_call_output",
                "call_id": "call_1",
                "output": [
                    {"type": "input_text", "text": "noted"},
                    {"type": "input_text", "text": "!"},
                ],
            },
        ],
        tools=[NOTE],
    )
    assert response.output_text == "Tool result: noted!"
    items = await server.client.responses.input_items.list(response.id, order="asc")
    types = [item.type for item in items.data]
    assert types == ["message", "custom_tool_call", "custom_tool_call_output"]
    assert items.data[1].id.startswith("ctc_") and items.data[2].id.startswith("ctco_")


async def test_tool_choice_custom_forces_the_call(server: Server) -> None:
    response = await server.client.responses.create(
        model=MODEL,
        input="Just say hello.",
        tools=[NOTE, TICKET],
        tool_choice={"type": "custom", "name": "ticket"},
    )
    (call,) = _custom_calls(response.output)
    assert call.name == "ticket"
    assert re.fullmatch(r"[A-Z]{3}-\d{2,4}", call.input)
    assert response.tool_choice.type == "custom"


@pytest.mark.parametrize(
    ("tool", "message"),
    [
        (
            apply_patch("start: missing_rule\n"),
            "Invalid lark grammar for custom tool 'apply_patch'",
        ),
        (apply_patch('start: "a" (\n'), "Invalid lark grammar"),
        (
            {**TICKET, "format": {"type": "grammar", "syntax": "regex", "definition": "[a-"}},
            "Invalid regex grammar for custom tool 'ticket'",
        ),
        (apply_patch("start: " + '"a" ' * 10_000), "this server accepts at most 32768"),
    ],
    ids=["undefined-rule", "syntax", "regex", "too-large"],
)
async def test_a_bad_grammar_is_refused_naming_its_definition(
    server: Server, tool: dict[str, Any], message: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await server.client.responses.create(model=MODEL, input="hi", tools=[NOTE, tool])
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["param"] == "tools[1].format.definition"
    assert message in error["message"]


@pytest.mark.parametrize(
    ("request_fields", "param"),
    [
        ({"tools": [NOTE, {**NOTE, "description": "again"}]}, "tools[1].name"),
        ({"tools": [NOTE], "tool_choice": {"type": "custom", "name": "ticket"}}, "tool_choice"),
        (
            {
                "tools": [NOTE],
                "input": [{"type": "custom_tool_call_output", "call_id": "c", "output": "x"}],
            },
            "input[0].call_id",
        ),
        ({"tools": [{**NOTE, "format": {"type": "json"}}]}, "tools[0].format.type"),
    ],
    ids=["duplicate-name", "unknown-choice", "orphan-output", "unknown-format"],
)
async def test_other_mistakes_are_refused(
    server: Server, request_fields: dict[str, Any], param: str
) -> None:
    fields = {"model": MODEL, "input": "hi", **request_fields}
    with pytest.raises(openai.BadRequestError) as caught:
        await server.client.responses.create(**fields)
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["param"] == param
