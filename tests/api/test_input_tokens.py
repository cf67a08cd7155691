"""``POST /v1/responses/input_tokens`` and integer timestamps on the wire."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from tests.conftest import StartServer
from tests.support import MODEL, Server, read_sse

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


async def count(server: Server, **body: Any) -> int:
    counted = await server.client.responses.input_tokens.count(**body)
    assert counted.object == "response.input_tokens"
    return counted.input_tokens


def assert_nothing_runs(server: Server) -> None:
    stats = server.service.statistics()
    assert (stats.running_jobs, stats.job_tasks) == (0, 0)
    assert server.service.engine.statistics()["running"] == 0


@pytest.mark.parametrize(
    "body",
    [
        {"input": "hello"},
        {"input": "hello", "instructions": "Answer in French."},
        {
            "input": [{"role": "user", "content": "What is the weather in Paris?"}],
            "instructions": "Be brief.",
            "tools": [WEATHER],
            "reasoning": {"effort": "high"},
        },
    ],
    ids=["plain", "instructions", "tools"],
)
async def test_count_equals_usage_of_the_same_create(server: Server, body: dict[str, Any]) -> None:
    counted = await count(server, model=MODEL, **body)
    assert_nothing_runs(server)

    response = await server.client.responses.create(model=MODEL, **body)
    assert response.usage is not None
    assert counted == response.usage.input_tokens


async def test_count_follows_previous_response_id(server: Server) -> None:
    first_input = 'call:get_weather {"city": "Paris"}'
    first = await server.client.responses.create(model=MODEL, input=first_input, tools=[WEATHER])
    call = first.output[-1]
    assert call.type == "function_call"
    body: dict[str, Any] = {
        "previous_response_id": first.id,
        "input": [{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
        "tools": [WEATHER],
    }
    counted = await count(server, model=MODEL, **body)
    # The same conversation sent in full counts the same.
    history = [
        {"role": "user", "content": first_input},
        *(item.model_dump(exclude_none=True) for item in first.output),
        *body["input"],
    ]
    assert counted == await count(server, model=MODEL, input=history, tools=[WEATHER])

    second = await server.client.responses.create(model=MODEL, **body)
    assert second.output_text == "Tool result: sunny"
    assert second.usage is not None
    assert counted == second.usage.input_tokens


async def test_model_may_be_left_out(server: Server) -> None:
    assert await count(server, input="hello") == await count(server, model=MODEL, input="hello")


async def test_counting_stores_and_runs_nothing(start_server: StartServer) -> None:
    # A store holding one response: anything counting stored would evict `kept`.
    server = await start_server(max_stored_responses=1)
    kept = await server.client.responses.create(model=MODEL, input="keep me")
    for _ in range(3):
        await count(server, model=MODEL, input="delay:1000 hello", previous_response_id=kept.id)
        await count(
            server,
            model=MODEL,
            input="tokens:50",
            extra_body={"stream": True, "background": True},
        )
    assert_nothing_runs(server)
    retrieved = await server.client.responses.retrieve(kept.id)
    assert retrieved.output_text == "You said: keep me"


@pytest.mark.parametrize(
    ("body", "status", "param", "code"),
    [
        ([1, 2], 400, None, "invalid_type"),
        ({"model": MODEL, "input": "hi", "bogus": 1}, 400, "bogus", "unknown_parameter"),
        ({"model": MODEL, "input": 7}, 400, "input", None),
        ({"model": "nope", "input": "hi"}, 404, "model", "model_not_found"),
        (
            {"model": MODEL, "input": "hi", "previous_response_id": "resp_missing"},
            404,
            "previous_response_id",
            "not_found",
        ),
        (
            {"model": MODEL, "input": "hi", "tool_choice": {"type": "function", "name": "x"}},
            400,
            "tool_choice",
            None,
        ),
    ],
    ids=["not-an-object", "unknown-field", "bad-input", "unknown-model", "no-previous", "choice"],
)
async def test_bad_bodies_get_the_usual_errors(
    server: Server, body: Any, status: int, param: str | None, code: str | None
) -> None:
    reply = await server.http.post("/v1/responses/input_tokens", json=body)
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param
    assert isinstance(error["code"], str) and error["code"]
    if code is not None:
        assert error["code"] == code
    assert_nothing_runs(server)


async def test_sdk_raises_for_a_bad_body(server: Server) -> None:
    with pytest.raises(openai.NotFoundError) as raised:
        await server.client.responses.input_tokens.count(model="nope", input="hi")
    assert raised.value.code == "model_not_found"


async def test_other_methods_on_the_path_are_refused(server: Server) -> None:
    # GET names a response called "input_tokens", which does not exist.
    reply = await server.http.get("/v1/responses/input_tokens")
    assert reply.status_code == 404
    assert reply.json()["error"]["param"] == "response_id"


# -- integer timestamps -------------------------------------------------------------------


def assert_integer_times(response: dict[str, Any], *, completed: bool) -> None:
    assert type(response["created_at"]) is int
    if completed:
        assert type(response["completed_at"]) is int
        assert response["completed_at"] >= response["created_at"]
    else:
        assert response["completed_at"] is None


async def test_timestamps_are_integers_in_json(server: Server) -> None:
    created = await server.http.post("/v1/responses", json={"model": MODEL, "input": "hi"})
    assert created.status_code == 200
    body = created.json()
    assert_integer_times(body, completed=True)

    retrieved = await server.http.get(f"/v1/responses/{body['id']}")
    assert retrieved.status_code == 200
    assert_integer_times(retrieved.json(), completed=True)

    status, events, _ = await read_sse(
        server.http, "POST", "/v1/responses", json={"model": MODEL, "input": "hi", "stream": True}
    )
    assert status == 200
    responses = {
        data["type"]: data["response"]
        for data in (json.loads(event.data) for event in events if event.data != "[DONE]")
        if "response" in data
    }
    assert set(responses) == {"response.created", "response.in_progress", "response.completed"}
    assert_integer_times(responses["response.created"], completed=False)
    assert_integer_times(responses["response.in_progress"], completed=False)
    assert_integer_times(responses["response.completed"], completed=True)
