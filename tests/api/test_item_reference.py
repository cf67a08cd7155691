"""``item_reference`` input items, through the real server and the openai SDK.

A reference names an item of a stored response (its input or output) or of a
conversation, created with the same API key; the server puts the stored item in
its place. Clients such as the Vercel AI SDK send them in tool loops for the
function calls and reasoning of earlier responses, without ``previous_response_id``.
Also: the SQLite item index is built for records stored before it existed
(schema v2 → v3).
"""

from __future__ import annotations

import json
import pathlib
import sqlite3
from typing import Any

import openai
from openai.types.responses import ResponseFunctionToolCall

from tests.conftest import StartServer
from tests.support import MODEL, Server
from trio_responses import Config
from trio_responses.store.base import StoredResponse
from trio_responses.store.open import open_state
from trio_responses.store.sqlite import SCHEMA_VERSION

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


async def call_weather(server: Server, **options: Any) -> ResponseFunctionToolCall:
    response = await server.client.responses.create(
        model=MODEL, input='call:get_weather {"city": "Paris"}', tools=[WEATHER], **options
    )  # type: ignore[call-overload]
    calls = [item for item in response.output if item.type == "function_call"]
    assert len(calls) == 1, response.output
    call = calls[0]
    assert isinstance(call, ResponseFunctionToolCall) and call.id is not None
    return call


async def test_a_tool_loop_with_item_references(start_server: StartServer, store_url: str) -> None:
    server = await start_server(store_url=store_url)
    call = await call_weather(server)
    answer = await server.client.responses.create(
        model=MODEL,
        tools=[WEATHER],  # type: ignore[list-item]
        input=[
            {"type": "item_reference", "id": call.id},  # type: ignore[typeddict-item]
            {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"},
        ],
    )
    assert answer.status == "completed"
    assert answer.output_text == "Tool result: sunny, 21 C"
    assert answer.previous_response_id is None
    # The reference is listed as the item it named.
    listed = await server.client.responses.input_items.list(answer.id, order="asc")
    first = listed.data[0]
    assert first.type == "function_call" and first.id == call.id
    assert first.call_id == call.call_id  # type: ignore[union-attr]


async def test_references_without_a_type_and_to_conversation_items(server: Server) -> None:
    client = server.client
    conversation = await client.conversations.create(
        items=[{"type": "message", "role": "user", "content": "remembered text"}]
    )
    page = await client.conversations.items.list(conversation.id)
    item_id = page.data[0].id
    assert item_id is not None
    answer = await client.responses.create(model=MODEL, input=[{"id": item_id}])  # type: ignore[list-item]
    assert answer.output_text == "You said: remembered text"


async def test_unknown_references_are_400_naming_the_item(start_server: StartServer) -> None:
    server = await start_server(api_keys=("key-a", "key-b"))
    call = await call_weather(server)
    async with openai.AsyncOpenAI(
        base_url=server.base_url, api_key="key-b", max_retries=0
    ) as stranger:
        for client, reference in [(server.client, "fc_nothing"), (stranger, call.id)]:
            try:
                await client.responses.create(
                    model=MODEL,
                    input=[
                        {"type": "message", "role": "user", "content": "hi"},
                        {"type": "item_reference", "id": reference},
                    ],  # type: ignore[list-item]
                )
            except openai.BadRequestError as error:
                assert error.code == "item_not_found"
                assert error.param == "input[1].id"
                assert str(reference) in error.message
            else:
                raise AssertionError(f"a reference to {reference!r} was accepted")


async def test_not_stored_responses_cannot_be_referenced(server: Server) -> None:
    call = await call_weather(server, store=False)
    try:
        await server.client.responses.create(
            model=MODEL, input=[{"type": "item_reference", "id": call.id}]
        )  # type: ignore[list-item]
    except openai.BadRequestError as error:
        assert error.code == "item_not_found"
    else:
        raise AssertionError("an item of a store: false response was found")


def _record(response_id: str) -> StoredResponse:
    return StoredResponse(
        response={
            "id": response_id,
            "object": "response",
            "status": "completed",
            "output": [{"type": "message", "id": f"msg_{response_id}", "content": []}],
        },
        input_items=[{"type": "message", "id": f"in_{response_id}", "role": "user"}],
        owner=None,
    )


async def test_a_version_2_file_gets_its_item_index(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "old.db"
    url = f"sqlite:///{path}"
    async with open_state(url, Config(store_url=url)) as state:
        await state.store.put(_record("resp_old"))
    # What a file written by the previous schema version holds: no index, no conversations.
    db = sqlite3.connect(path)
    db.executescript(
        "DROP TRIGGER responses_index_items; DROP TRIGGER responses_unindex_items;"
        " DROP TRIGGER conversations_drop_items; DROP TABLE response_items;"
        " DROP TABLE conversation_items; DROP TABLE conversations; PRAGMA user_version = 2;"
    )
    db.close()
    async with open_state(url, Config(store_url=url)) as state:
        assert await state.store.find_item("msg_resp_old", owner=None) is not None
        assert await state.store.find_item("in_resp_old", owner=None) is not None
        await state.store.put(_record("resp_new"))
        assert await state.store.find_item("msg_resp_new", owner=None) is not None
        assert await state.conversations.items("conv_none", owner=None) is None
    db = sqlite3.connect(path)
    (version,) = db.execute("PRAGMA user_version").fetchone()
    rows = db.execute("SELECT item_id FROM response_items ORDER BY item_id").fetchall()
    db.close()
    assert version == SCHEMA_VERSION == 5
    assert json.dumps(rows) == json.dumps(
        [["in_resp_new"], ["in_resp_old"], ["msg_resp_new"], ["msg_resp_old"]]
    )
