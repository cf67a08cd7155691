"""Creating responses through HTTP with the openai SDK and a raw SSE client."""

from __future__ import annotations

import json

from tests.conftest import StartServer
from tests.support import MODEL, Server, check_stream, read_sse, validate_response


async def test_hello_completes_with_reasoning_and_echo(server: Server) -> None:
    response = await server.client.responses.create(model=MODEL, input="hello")

    assert response.status == "completed"
    assert [item.type for item in response.output] == ["reasoning", "message"]
    assert response.output[0].content[0].text == "Thinking about: hello"
    assert response.output_text == "You said: hello"
    assert response.completed_at is not None
    assert response.error is None
    usage = response.usage
    assert usage is not None
    assert usage.input_tokens > 0 and usage.output_tokens > 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert 0 < usage.output_tokens_details.reasoning_tokens < usage.output_tokens


async def test_response_json_validates_and_can_be_retrieved(server: Server) -> None:
    created = await server.http.post("/v1/responses", json={"model": MODEL, "input": "hi"})
    assert created.status_code == 200
    body = created.json()
    validate_response(body)
    assert body["id"].startswith("resp_") and len(body["id"]) > 40

    retrieved = await server.client.responses.retrieve(body["id"])
    assert retrieved.id == body["id"]
    assert retrieved.output_text == "You said: hi"
    assert retrieved.status == "completed"


async def test_ids_are_unique_and_prefixed(server: Server) -> None:
    first = await server.client.responses.create(model=MODEL, input="a")
    second = await server.client.responses.create(model=MODEL, input="a")
    assert first.id != second.id
    assert first.output[0].id.startswith("rs_")
    assert first.output[1].id.startswith("msg_")
    assert first.output[1].id != second.output[1].id


async def test_same_input_gives_same_output(server: Server) -> None:
    first = await server.client.responses.create(model=MODEL, input="deterministic?")
    second = await server.client.responses.create(model=MODEL, input="deterministic?")
    assert first.output_text == second.output_text
    assert first.usage == second.usage


async def test_raw_stream_lifecycle(server: Server) -> None:
    status, events, raw = await read_sse(
        server.http, "POST", "/v1/responses", json={"model": MODEL, "input": "hi", "stream": True}
    )
    assert status == 200
    assert raw.endswith(b"data: [DONE]\n\n")
    payloads = [event.json() for event in events[:-1]]
    assert events[-1].data == "[DONE]"
    for event, payload in zip(events, payloads, strict=False):
        assert event.event == payload["type"]
    check_stream(payloads)
    types = [p["type"] for p in payloads]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert payloads[0]["response"]["status"] == "in_progress"
    assert types[-1] == "response.completed"
    assert "response.reasoning_text.delta" in types
    assert "response.output_text.delta" in types
    final = payloads[-1]["response"]
    assert final["output"][1]["content"][0]["text"] == "You said: hi"
    for payload in payloads:
        if payload["type"] == "response.output_text.delta":
            assert payload["logprobs"] == []


async def test_sdk_stream_events_and_helper(server: Server) -> None:
    stream = await server.client.responses.create(model=MODEL, input="stream me", stream=True)
    seen = [event async for event in stream]
    assert seen[0].type == "response.created" and seen[0].sequence_number == 0
    assert seen[-1].type == "response.completed"
    text = "".join(e.delta for e in seen if e.type == "response.output_text.delta")
    assert text == "You said: stream me"

    async with server.client.responses.stream(model=MODEL, input="helper") as helper:
        async for _ in helper:
            pass
        final = await helper.get_final_response()
    assert final.status == "completed"
    assert final.output_text == "You said: helper"


async def test_tokens_directive_streams_that_many_tokens(server: Server) -> None:
    status, events, _ = await read_sse(
        server.http,
        "POST",
        "/v1/responses",
        json={"model": MODEL, "input": "tokens:2000", "stream": True},
    )
    assert status == 200
    payloads = [e.json() for e in events[:-1]]
    check_stream(payloads)
    deltas = [p for p in payloads if p["type"] == "response.output_text.delta"]
    assert len(deltas) == 2000
    assert payloads[-1]["type"] == "response.completed"


async def test_max_output_tokens_makes_response_incomplete(server: Server) -> None:
    response = await server.client.responses.create(
        model=MODEL, input="tokens:2000", max_output_tokens=40
    )
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage is not None and response.usage.output_tokens == 40
    assert response.output[-1].status == "incomplete"


async def test_max_output_tokens_inside_header_ends_cleanly(server: Server) -> None:
    status, events, raw = await read_sse(
        server.http,
        "POST",
        "/v1/responses",
        json={"model": MODEL, "input": "hello", "stream": True, "max_output_tokens": 2},
    )
    assert status == 200 and raw.endswith(b"data: [DONE]\n\n")
    payloads = [e.json() for e in events[:-1]]
    check_stream(payloads)
    final = payloads[-1]["response"]
    assert final["status"] in ("incomplete", "failed")
    assert final["usage"]["output_tokens"] == 2


async def test_engine_failure_ends_with_response_failed(server: Server) -> None:
    status, events, raw = await read_sse(
        server.http,
        "POST",
        "/v1/responses",
        json={"model": MODEL, "input": "fail:5", "stream": True},
    )
    assert status == 200 and raw.endswith(b"data: [DONE]\n\n")
    payloads = [e.json() for e in events[:-1]]
    check_stream(payloads)
    terminal = payloads[-1]
    assert terminal["type"] == "response.failed"
    assert terminal["response"]["status"] == "failed"
    assert "fail:5" in terminal["response"]["error"]["message"]
    assert terminal["response"]["usage"]["output_tokens"] == 5

    response = await server.client.responses.create(model=MODEL, input="fail:3")
    assert response.status == "failed"
    assert response.error is not None and "failed after 3 tokens" in response.error.message


WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


async def test_function_call_is_streamed_and_answered(server: Server) -> None:
    prompt = 'What is the weather? call:get_weather {"city":"Paris"}'
    status, events, _ = await read_sse(
        server.http,
        "POST",
        "/v1/responses",
        json={"model": MODEL, "input": prompt, "tools": [WEATHER_TOOL], "stream": True},
    )
    assert status == 200
    payloads = [e.json() for e in events[:-1]]
    check_stream(payloads)
    deltas = [p for p in payloads if p["type"] == "response.function_call_arguments.delta"]
    assert len(deltas) > 1
    done = next(p for p in payloads if p["type"] == "response.function_call_arguments.done")
    assert json.loads(done["arguments"]) == {"city": "Paris"}
    final = payloads[-1]["response"]
    assert final["status"] == "completed"
    call = final["output"][-1]
    assert call["type"] == "function_call" and call["name"] == "get_weather"
    assert call["call_id"].startswith("call_") and call["id"].startswith("fc_")

    follow_up = await server.client.responses.create(
        model=MODEL,
        previous_response_id=final["id"],
        input=[{"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}],
        tools=[WEATHER_TOOL],
    )
    assert follow_up.output_text == "Tool result: sunny"
    assert follow_up.previous_response_id == final["id"]


async def test_function_call_round_trip_with_full_history(server: Server) -> None:
    prompt = 'call:get_weather {"city":"Oslo"}'
    first = await server.client.responses.create(
        model=MODEL,
        input=prompt,
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
    )
    call = first.output[-1]
    assert call.type == "function_call"
    assert json.loads(call.arguments) == {"city": "Oslo"}
    history = [
        {"role": "user", "content": prompt},
        *[item.model_dump(exclude_none=True) for item in first.output],
        {"type": "function_call_output", "call_id": call.call_id, "output": "-3 C"},
    ]
    second = await server.client.responses.create(
        model=MODEL,
        input=history,
        tools=[WEATHER_TOOL],  # type: ignore[arg-type, list-item]
    )
    assert second.output_text == "Tool result: -3 C"


async def test_undeclared_function_is_not_called(server: Server) -> None:
    response = await server.client.responses.create(
        model=MODEL, input='call:get_weather {"city":"Paris"}'
    )
    assert [item.type for item in response.output] == ["reasoning", "message"]
    assert response.output_text.startswith("You said: call:get_weather")


async def test_store_false_is_not_retrievable(server: Server) -> None:
    response = await server.client.responses.create(model=MODEL, input="x", store=False)
    assert response.status == "completed" and response.store is False
    missing = await server.http.get(f"/v1/responses/{response.id}")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "not_found"


async def test_models_and_health(server: Server) -> None:
    models = await server.client.models.list()
    assert [model.id for model in models.data] == [MODEL]
    assert "scripted" in models.data[0].owned_by
    health = await server.http.get("/health")
    assert health.status_code == 200
    assert health.json()["engine"]["kind"] == "scripted"


async def test_truncation_auto_leaves_room_for_the_answer(start_server: StartServer) -> None:
    server = await start_server(max_model_len=8192)
    history = [
        {"role": "user" if n % 2 == 0 else "assistant", "content": f"turn {n} " + "word " * 5}
        for n in range(1999)
    ]
    response = await server.client.responses.create(
        model=MODEL,
        input=[*history, {"role": "user", "content": "tokens:1500"}],
        truncation="auto",
    )
    # Dropping old turns left the default reserve (a quarter of the window) for the
    # answer, which fits in it.
    assert response.status == "completed", response.incomplete_details
    assert response.usage is not None
    assert response.usage.input_tokens + 8192 // 4 <= 8192
    assert response.usage.output_tokens > 1500
