"""``include: ["reasoning.encrypted_content"]``: sealed reasoning that a stateless client
sends back, and the 400s for blobs that are not this server's, for this key."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.conftest import StartServer
from tests.support import MODEL, Server, read_sse

INCLUDE = ["reasoning.encrypted_content"]
KEY = "11" * 32
OTHER_KEY = "22" * 32
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
QUESTION = 'call:get_weather {"city": "Paris"}'


@pytest.fixture
async def server(start_server: StartServer) -> Server:
    return await start_server(encryption_key=KEY)


async def first_turn(server: Server) -> list[dict[str, Any]]:
    """A store:false turn that calls a function: [reasoning, function_call] as dicts."""
    response = await server.client.responses.create(
        model=MODEL, input=QUESTION, tools=[WEATHER], store=False, include=INCLUDE
    )
    assert [item.type for item in response.output] == ["reasoning", "function_call"]
    return [item.model_dump(exclude_none=True) for item in response.output]


def stripped(reasoning: dict[str, Any]) -> dict[str, Any]:
    """The reasoning item as stateless clients send it back: no text, only the blob."""
    return {
        "type": "reasoning",
        "id": reasoning["id"],
        "summary": [],
        "encrypted_content": reasoning["encrypted_content"],
    }


def loop_input(reasoning: dict[str, Any], call: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": QUESTION},
        reasoning,
        call,
        {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"},
    ]


async def count(server: Server, items: list[dict[str, Any]]) -> int:
    counted = await server.client.responses.input_tokens.count(
        model=MODEL, input=items, tools=[WEATHER]
    )
    return counted.input_tokens


async def test_every_reasoning_item_carries_a_blob(server: Server) -> None:
    response = await server.client.responses.create(model=MODEL, input="hello", include=INCLUDE)
    reasoning = [item for item in response.output if item.type == "reasoning"]
    assert len(reasoning) == 1 and reasoning[0].encrypted_content
    assert reasoning[0].content and reasoning[0].content[0].text == "Thinking about: hello"
    # The stored record keeps it too.
    stored = await server.client.responses.retrieve(response.id)
    assert stored.output[0].type == "reasoning"
    assert stored.output[0].encrypted_content == reasoning[0].encrypted_content

    plain = await server.client.responses.create(model=MODEL, input="hello")
    assert plain.output[0].type == "reasoning" and plain.output[0].encrypted_content is None


async def test_streamed_output_item_done_carries_the_blob(server: Server) -> None:
    body = {"model": MODEL, "input": "hello", "stream": True, "include": INCLUDE, "store": False}
    status, events, _ = await read_sse(server.http, "POST", "/v1/responses", json=body)
    assert status == 200
    done = [
        e.json()["item"]
        for e in events
        if e.event == "response.output_item.done" and e.json()["item"]["type"] == "reasoning"
    ]
    assert len(done) == 1 and done[0]["encrypted_content"]
    completed = next(e.json() for e in events if e.event == "response.completed")["response"]
    assert completed["output"][0]["encrypted_content"] == done[0]["encrypted_content"]


async def test_stateless_tool_loop_restores_the_reasoning(server: Server) -> None:
    reasoning, call = await first_turn(server)
    restored = await count(server, loop_input(stripped(reasoning), call))
    # The same count as when the text is sent in the clear: the prompt holds it...
    assert restored == await count(server, loop_input(reasoning, call))
    # ...and more than with the text gone and no blob to restore it from.
    without = {"type": "reasoning", "id": reasoning["id"], "summary": []}
    assert restored > await count(server, loop_input(without, call))

    answer = await server.client.responses.create(
        model=MODEL,
        input=loop_input(stripped(reasoning), call),  # type: ignore[arg-type]
        tools=[WEATHER],  # type: ignore[list-item]
        store=False,
        include=INCLUDE,
    )
    assert answer.output_text == "Tool result: sunny"
    assert answer.usage is not None and answer.usage.input_tokens == restored


async def test_blob_text_wins_over_content_sent_with_it(server: Server) -> None:
    reasoning, call = await first_turn(server)
    forged = {**reasoning, "content": [{"type": "reasoning_text", "text": "x" * 400}]}
    assert await count(server, loop_input(forged, call)) == await count(
        server, loop_input(reasoning, call)
    )


def _flipped(blob: str) -> str:
    middle = len(blob) // 2
    return blob[:middle] + ("A" if blob[middle] != "A" else "B") + blob[middle + 1 :]


@pytest.mark.parametrize(
    "change",
    [_flipped, lambda blob: blob[:-10], lambda blob: "not a blob"],
    ids=["flipped", "cut", "replaced"],
)
async def test_changed_blob_is_refused(server: Server, change: Any) -> None:
    reasoning, call = await first_turn(server)
    reasoning["encrypted_content"] = change(reasoning["encrypted_content"])
    with pytest.raises(openai.BadRequestError) as raised:
        await server.client.responses.create(
            model=MODEL,
            input=loop_input(stripped(reasoning), call),  # type: ignore[arg-type]
            tools=[WEATHER],  # type: ignore[list-item]
            store=False,
        )
    assert raised.value.code == "invalid_encrypted_content"
    assert raised.value.param == "input[1].encrypted_content"
    with pytest.raises(openai.BadRequestError) as counted:
        await count(server, loop_input(stripped(reasoning), call))
    assert counted.value.code == "invalid_encrypted_content"


async def test_blob_of_another_api_key_is_refused(start_server: StartServer) -> None:
    server = await start_server(encryption_key=KEY, api_keys=["key-a", "key-b"])
    reasoning, call = await first_turn(server)
    other = openai.AsyncOpenAI(base_url=server.base_url, api_key="key-b", max_retries=0)
    async with other:
        with pytest.raises(openai.BadRequestError) as raised:
            await other.responses.create(
                model=MODEL,
                input=loop_input(stripped(reasoning), call),  # type: ignore[arg-type]
                tools=[WEATHER],  # type: ignore[list-item]
                store=False,
            )
    assert raised.value.code == "invalid_encrypted_content"
    assert raised.value.param == "input[1].encrypted_content"
    # The key that made it still can.
    answer = await server.client.responses.create(
        model=MODEL,
        input=loop_input(stripped(reasoning), call),  # type: ignore[arg-type]
        tools=[WEATHER],  # type: ignore[list-item]
        store=False,
    )
    assert answer.output_text == "Tool result: sunny"


async def test_blob_opens_only_under_the_server_key(
    server: Server, start_server: StartServer
) -> None:
    reasoning, call = await first_turn(server)
    body = loop_input(stripped(reasoning), call)
    restarted = await start_server(encryption_key=OTHER_KEY)
    with pytest.raises(openai.BadRequestError) as raised:
        await restarted.client.responses.create(
            model=MODEL,
            input=body,  # type: ignore[arg-type]
            tools=[WEATHER],  # type: ignore[list-item]
            store=False,
        )
    assert raised.value.code == "invalid_encrypted_content"
    assert raised.value.param == "input[1].encrypted_content"
    # A replica sharing the key opens it.
    replica = await start_server(encryption_key=KEY)
    answer = await replica.client.responses.create(
        model=MODEL,
        input=body,  # type: ignore[arg-type]
        tools=[WEATHER],  # type: ignore[list-item]
        store=False,
    )
    assert answer.output_text == "Tool result: sunny"
