"""The SDK's own objects, sent back as input, are accepted: every output item type the
server produces (and what ``input_items.list`` and ``compact`` return), dumped with
``model_dump()`` and with ``model_dump(exclude_none=True)``.

A client that keeps the conversation itself sends the items it received back, and
the SDK's models carry every field of their type (``None`` where unset), some with
the SDK's own names (``async_``), and parse a user message of ``compact``'s output
as an output message (``annotations``/``logprobs`` on its ``input_text`` parts).
Fields outside OpenAI's schema are still refused, by name.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import trio
from openai import AsyncOpenAI, BadRequestError
from pydantic import BaseModel

from tests.conftest import StartServer
from tests.support import MODEL, Server
from tests.tools.servers import RunningMcp, browser_server, echo_server, serve_mcp

FUNCTION = {
    "type": "function",
    "name": "lookup",
    "description": "Look a word up.",
    "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
}


def _mcp(mcp: RunningMcp, approval: str) -> dict[str, Any]:
    return {
        "type": "mcp",
        "server_label": "echo",
        "server_url": mcp.url,
        "require_approval": approval,
    }


async def _every_item_type(server: Server, mcp: RunningMcp) -> dict[str, list[BaseModel]]:
    """SDK objects of every item type the server sends, by where they came from."""
    client = server.client
    code = await client.responses.create(
        model=MODEL,
        input="Run it.\n```python\nprint(6 * 7)\n```",
        tools=[{"type": "code_interpreter", "container": {"type": "auto"}}],
        include=["code_interpreter_call.outputs", "reasoning.encrypted_content"],
    )
    search = await client.responses.create(
        model=MODEL,
        input="search: trio nurseries",
        tools=[{"type": "web_search"}],
        include=["web_search_call.action.sources"],
    )
    call = await client.responses.create(
        model=MODEL, input='call:lookup {"word": "nursery"}', tools=[FUNCTION]
    )
    mcp_call = await client.responses.create(
        model=MODEL, input='mcp:echo.echo {"text": "hi"}', tools=[_mcp(mcp, "never")]
    )
    approval = await client.responses.create(
        model=MODEL, input='mcp:echo.echo {"text": "please"}', tools=[_mcp(mcp, "always")]
    )
    compacted = await client.responses.compact(
        model=MODEL,
        input=[{"role": "user", "content": "hello"}, *[item.model_dump() for item in code.output]],
    )
    listed = [item async for item in client.responses.input_items.list(code.id)]
    found = {
        "code_interpreter": list(code.output),
        "web_search": list(search.output),
        "function_call": list(call.output),
        "mcp_call": list(mcp_call.output),
        "mcp_approval_request": list(approval.output),
        "compact": list(compacted.output),
        "input_items": listed,
    }
    types = {item.type for items in found.values() for item in items}  # type: ignore[attr-defined]
    assert types >= {
        "message",
        "reasoning",
        "code_interpreter_call",
        "web_search_call",
        "function_call",
        "mcp_list_tools",
        "mcp_call",
        "mcp_approval_request",
        "compaction",
    }, types
    return found


def _dump(items: list[BaseModel], *, exclude_none: bool) -> list[dict[str, Any]]:
    """``model_dump`` of each item, as a client would call it.

    The SDK types ``compact``'s output as output items, so a user message's
    ``input_text`` parts become output text models, which pydantic warns about when
    they are dumped: the SDK's mismatch (OpenAI's compact answers the same), not ours.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Pydantic serializer warnings", UserWarning)
        return [item.model_dump(exclude_none=exclude_none) for item in items]


@pytest.fixture
async def tools_server(
    start_server: StartServer, nursery: trio.Nursery
) -> tuple[Server, RunningMcp]:
    """A server with every tool: the code interpreter, a browser, an echo MCP server."""
    mcp_browser: RunningMcp = await nursery.start(serve_mcp, browser_server())
    mcp_echo: RunningMcp = await nursery.start(serve_mcp, echo_server())
    started = await start_server(
        code_interpreter=True,
        python_wall_s=20,
        tool_servers=(f"browser={mcp_browser.url}",),
        mcp_allow_hosts=("127.0.0.1",),
    )
    return started, mcp_echo


@pytest.mark.parametrize("exclude_none", [False, True], ids=["model_dump", "exclude_none"])
async def test_every_item_the_sdk_returns_is_accepted_as_input(
    tools_server: tuple[Server, RunningMcp], exclude_none: bool
) -> None:
    running, mcp = tools_server
    found = await _every_item_type(running, mcp)
    client: AsyncOpenAI = running.client
    for source, items in found.items():
        dumped = _dump(items, exclude_none=exclude_none)
        if source == "mcp_approval_request":
            request_id = dumped[-1]["id"]
            dumped.append(
                {
                    "type": "mcp_approval_response",
                    "approval_request_id": request_id,
                    "approve": False,
                }
            )
        with trio.fail_after(60):
            answer = await client.responses.create(
                model=MODEL,
                input=[*dumped, {"role": "user", "content": "and now?"}],
                tools=[FUNCTION, _mcp(mcp, "never")],
            )
        assert answer.status == "completed", (source, answer.error)
        assert answer.output_text == "You said: and now?", source


async def test_fields_outside_the_schema_are_still_refused(
    tools_server: tuple[Server, RunningMcp],
) -> None:
    running, mcp = tools_server
    found = await _every_item_type(running, mcp)
    for source, items in found.items():
        for index, dumped in enumerate(_dump(items, exclude_none=False)):
            dumped["not_a_field"] = 1
            with pytest.raises(BadRequestError) as refused:
                await running.client.responses.create(
                    model=MODEL, input=[dumped], tools=[FUNCTION, _mcp(mcp, "never")]
                )
            assert refused.value.body["param"] == "input[0].not_a_field", (source, index)  # type: ignore[index]
    # Annotations are output text's: on an input text part, only empty ones pass.
    part = {"type": "input_text", "text": "hi", "annotations": [{"type": "file_citation"}]}
    with pytest.raises(BadRequestError) as refused:
        await running.client.responses.create(
            model=MODEL, input=[{"role": "user", "content": [part]}]
        )
    assert refused.value.body["param"] == "input[0].content[0].annotations"  # type: ignore[index]
