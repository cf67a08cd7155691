"""Structured outputs: ``text.format`` ``json_schema``/``json_object`` through the openai SDK.

The scripted model answers a constrained final message with a deterministic
instance of the schema (using the user's text when it is JSON that fits);
reasoning before it stays free text.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import jsonschema
import trio
from pydantic import BaseModel, Field

from tests.support import MODEL, Server, check_stream, read_sse


class Address(BaseModel):
    street: str
    city: str


class Person(BaseModel):
    name: str = Field(min_length=2, max_length=40)
    age: int = Field(ge=0, le=150)
    role: Literal["admin", "user"]
    tags: list[str]
    address: Address
    nickname: str | None


async def test_parse_returns_a_validated_model(server: Server) -> None:
    response = await server.client.responses.parse(
        model=MODEL, input="Tell me about Ada.", text_format=Person
    )
    assert response.status == "completed"
    assert [item.type for item in response.output] == ["reasoning", "message"]
    assert response.output[0].content[0].text == "Thinking about: Tell me about Ada."
    person = response.output_parsed
    assert isinstance(person, Person)
    assert person.role in ("admin", "user") and 0 <= person.age <= 150
    assert person.name.startswith("You said:")
    assert json.loads(response.output_text) == person.model_dump()
    assert response.text.format is not None and response.text.format.type == "json_schema"


async def test_the_user_can_steer_the_values_with_json(server: Server) -> None:
    wanted = {
        "name": "Ada",
        "age": 36,
        "role": "admin",
        "tags": ["math"],
        "address": {"street": "1 St James's Square", "city": "London"},
        "nickname": None,
    }
    response = await server.client.responses.parse(
        model=MODEL, input=json.dumps(wanted), text_format=Person
    )
    assert response.output_parsed == Person.model_validate(wanted)


async def test_streamed_parse(server: Server) -> None:
    async with server.client.responses.stream(
        model=MODEL, input="stream it", text_format=Person
    ) as stream:
        deltas = [
            event.delta async for event in stream if event.type == "response.output_text.delta"
        ]
        final = await stream.get_final_response()
    assert final.output_parsed is not None
    assert "".join(deltas) == final.output_text
    assert len(deltas) > 1


async def test_raw_stream_is_well_formed(server: Server) -> None:
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    body = {
        "model": MODEL,
        "input": "yes or no?",
        "stream": True,
        "text": {"format": {"type": "json_schema", "name": "yn", "schema": schema, "strict": True}},
    }
    status, events, _ = await read_sse(server.http, "POST", "/v1/responses", json=body)
    assert status == 200
    payloads = [event.json() for event in events[:-1]]
    check_stream(payloads)
    final = payloads[-1]["response"]
    text = final["output"][-1]["content"][0]["text"]
    assert json.loads(text) == {"answer": "yes"}
    assert final["text"]["format"]["name"] == "yn"
    usage = final["usage"]
    assert usage["output_tokens"] > usage["output_tokens_details"]["reasoning_tokens"] > 0


async def test_json_object_gives_an_object(server: Server) -> None:
    response = await server.client.responses.create(
        model=MODEL, input="anything", text={"format": {"type": "json_object"}}
    )
    assert isinstance(json.loads(response.output_text), dict)


async def test_defs_and_refs_are_followed(server: Server) -> None:
    class Node(BaseModel):
        label: str
        children: list[Node]

    class Tree(BaseModel):
        root: Node
        depth: int

    response = await server.client.responses.parse(model=MODEL, input="a tree", text_format=Tree)
    assert isinstance(response.output_parsed, Tree)
    jsonschema.validate(json.loads(response.output_text), Tree.model_json_schema())


async def test_tool_calls_still_happen_with_a_format(server: Server) -> None:
    tool = {
        "type": "function",
        "name": "lookup",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
    }
    first = await server.client.responses.parse(
        model=MODEL, input='call:lookup {"q": "ada"}', tools=[tool], text_format=Person
    )
    call = first.output[-1]
    assert call.type == "function_call" and json.loads(call.arguments) == {"q": "ada"}
    second = await server.client.responses.parse(
        model=MODEL,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "found"}],
        tools=[tool],
        text_format=Person,
    )
    assert isinstance(second.output_parsed, Person)
    assert second.output_parsed.name == "Tool result: found"


async def test_invalid_schema_is_a_400(server: Server) -> None:
    for schema, fragment in (
        ({"type": "banana"}, "Invalid JSON schema"),
        ({"type": "object", "properties": {"a": {"$ref": "#/$defs/Missing"}}}, "does not resolve"),
        ({"$ref": "https://example.com/schema.json"}, "not local"),
    ):
        body = {
            "model": MODEL,
            "input": "x",
            "text": {"format": {"type": "json_schema", "name": "bad", "schema": schema}},
        }
        reply = await server.http.post("/v1/responses", json=body)
        assert reply.status_code == 400, schema
        error = reply.json()["error"]
        assert error["param"] == "text.format.schema"
        assert error["code"] == "invalid_json_schema"
        assert fragment in error["message"]


RECURSIVE = {
    "type": "object",
    "properties": {"v": {"$ref": "#/$defs/a"}},
    "required": ["v"],
    "additionalProperties": False,
    "$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"$ref": "#/$defs/a"}]}},
}
HUGE = {
    "type": "array",
    "minItems": 2000,
    "items": {"type": "array", "minItems": 2000, "items": {"type": "array", "minItems": 2000}},
}


async def test_schemas_too_costly_to_answer_fail_cleanly(server: Server) -> None:
    for schema in (RECURSIVE, HUGE, {"type": "string", "minLength": 3_000_000_000}):
        async with trio.open_nursery() as nursery:
            done = trio.Event()

            async def ask(schema: dict[str, Any] = schema, done: trio.Event = done) -> None:
                body = {
                    "model": MODEL,
                    "input": "hi",
                    "text": {"format": {"type": "json_schema", "name": "x", "schema": schema}},
                }
                reply = await server.http.post("/v1/responses", json=body)
                assert reply.status_code == 200
                response = reply.json()
                assert response["status"] == "failed"
                assert "cannot build a value for this JSON schema" in response["error"]["message"]
                done.set()

            nursery.start_soon(ask)
            with trio.fail_after(5):  # the server answers others meanwhile
                assert (await server.http.get("/health")).status_code == 200
            with trio.fail_after(30):
                await done.wait()


async def test_a_pattern_is_not_run_against_long_hints(server: Server) -> None:
    schema = {
        "type": "object",
        "properties": {"v": {"type": "string", "pattern": "^(a+)+$"}},
        "required": ["v"],
        "additionalProperties": False,
    }
    with trio.fail_after(10):
        response = await server.client.responses.create(
            model=MODEL,
            input='{"v": "' + "a" * 40 + '!"}',
            text={"format": {"type": "json_schema", "name": "x", "schema": schema}},
        )
    assert response.status == "completed"
    jsonschema.validate(json.loads(response.output_text), schema)
