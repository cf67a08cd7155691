"""WebSocket mode of ``/v1/responses``, through the openai SDK's ``responses.connect()``.

The SDK's WebSocket client runs on asyncio: each scenario runs in its own asyncio
loop in a worker thread (`in_asyncio`) while the server runs in the test's trio loop.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar
from urllib.parse import urlsplit

import openai
import pytest
import trio
import websockets
import wsproto
import wsproto.events
from openai.resources.responses.responses import AsyncResponsesConnection

from tests.support import (
    MODEL,
    TERMINAL_TYPES,
    Server,
    assert_nothing_left,
    check_stream,
    read_sse,
)
from trio_responses import ResponseHandle
from trio_responses.api.websocket import ResponsesSocket

T = TypeVar("T")
SCENARIO_TIMEOUT_S = 60.0


async def in_asyncio(scenario: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run ``scenario`` in a fresh asyncio loop in a worker thread; return its result."""

    async def bounded() -> T:
        async with asyncio.timeout(SCENARIO_TIMEOUT_S):
            return await scenario()

    return await trio.to_thread.run_sync(lambda: asyncio.run(bounded()))


def sdk_client(server: Server, api_key: str = "unused") -> openai.AsyncOpenAI:
    """An SDK client for the asyncio thread (the server's own belongs to trio)."""
    return openai.AsyncOpenAI(base_url=server.base_url, api_key=api_key, max_retries=0)


async def read_response(connection: AsyncResponsesConnection) -> list[dict[str, Any]]:
    """Read one response's events (and any error events) up to its terminal event.

    Each message is parsed with the SDK's own event types as well.
    """
    events: list[dict[str, Any]] = []
    while True:
        raw = await connection.recv_bytes()
        connection.parse_event(raw)
        event: dict[str, Any] = json.loads(raw)
        events.append(event)
        if event["type"] in TERMINAL_TYPES:
            return events


async def read_error(connection: AsyncResponsesConnection) -> dict[str, Any]:
    """The next message, which must be an ``error`` event."""
    raw = await connection.recv_bytes()
    event: dict[str, Any] = json.loads(raw)
    assert event["type"] == "error", event
    parsed = connection.parse_event(raw)
    assert parsed.type == "error"
    return event


def create(text: str, **fields: Any) -> Any:
    return {"type": "response.create", "model": MODEL, "input": text, **fields}


def terminal(events: list[dict[str, Any]]) -> dict[str, Any]:
    check_stream(events)
    response: dict[str, Any] = events[-1]["response"]
    return response


def output_text(response: dict[str, Any]) -> str:
    return "".join(
        part["text"]
        for item in response["output"]
        if item["type"] == "message"
        for part in item["content"]
    )


async def test_a_response_streams_the_same_events_as_sse(server: Server) -> None:
    async def scenario() -> list[dict[str, Any]]:
        client = sdk_client(server)
        try:
            async with client.responses.connect() as connection:
                await connection.send(create("hello there"))
                return await read_response(connection)
        finally:
            await client.close()

    events = await in_asyncio(scenario)
    response = terminal(events)
    assert events[-1]["type"] == "response.completed"
    assert output_text(response) == "You said: hello there"
    # The same stream as SSE, event for event (ids and timestamps aside).
    status, sse, _ = await read_sse(
        server.http,
        "POST",
        "/v1/responses",
        json={"model": MODEL, "input": "hello there", "stream": True},
    )
    assert status == 200
    sse_events = [event.json() for event in sse if event.data != "[DONE]"]
    assert [e["type"] for e in events] == [e["type"] for e in sse_events]
    assert [sorted(e) for e in events] == [sorted(e) for e in sse_events]


async def test_sequential_responses_continue_from_the_connection_with_store_false(
    server: Server,
) -> None:
    async def scenario() -> tuple[list[dict[str, Any]], dict[str, Any]]:
        client = sdk_client(server)
        try:
            responses = []
            async with client.responses.connect() as connection:
                previous = None
                for text in ("one", "two", "three"):
                    await connection.send(create(text, store=False, previous_response_id=previous))
                    response = terminal(await read_response(connection))
                    responses.append(response)
                    previous = response["id"]
            # Another connection does not have them (and neither has the store).
            async with client.responses.connect() as other:
                await other.send(create("four", store=False, previous_response_id=previous))
                error = await read_error(other)
            return responses, error
        finally:
            await client.close()

    responses, error = await in_asyncio(scenario)
    assert [output_text(r) for r in responses] == [
        "You said: one",
        "You said: two",
        "You said: three",
    ]
    assert [r["previous_response_id"] for r in responses] == [
        None,
        responses[0]["id"],
        responses[1]["id"],
    ]
    tokens = [r["usage"]["input_tokens"] for r in responses]
    assert tokens[0] < tokens[1] < tokens[2]  # each turn sees the ones before
    assert error["status"] == 400
    assert error["error"]["code"] == "previous_response_not_found"
    assert error["error"]["param"] == "previous_response_id"
    with pytest.raises(openai.NotFoundError):
        await server.client.responses.retrieve(responses[-1]["id"])


async def test_continuing_a_stored_chain_from_the_store(server: Server) -> None:
    stored = await server.client.responses.create(model=MODEL, input="first")

    async def scenario() -> dict[str, Any]:
        client = sdk_client(server)
        try:
            async with client.responses.connect() as connection:
                await connection.send(create("second", previous_response_id=stored.id))
                second = terminal(await read_response(connection))
                await connection.send(create("third", previous_response_id=second["id"]))
                return terminal(await read_response(connection))
        finally:
            await client.close()

    third = await in_asyncio(scenario)
    assert output_text(third) == "You said: third"
    # The same conversation over HTTP, from the store: the same prompt.
    again = await server.client.responses.create(
        model=MODEL, input="third", previous_response_id=third["previous_response_id"]
    )
    assert again.usage is not None
    assert third["usage"]["input_tokens"] == again.usage.input_tokens


async def test_generate_false_warms_up_without_running_the_model(server: Server) -> None:
    async def scenario() -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
        client = sdk_client(server)
        try:
            async with client.responses.connect() as connection:
                await connection.send(create("some context first", store=False, generate=False))
                warm = await read_response(connection)
                await connection.send(
                    create("hi", store=False, previous_response_id=warm[-1]["response"]["id"])
                )
                continued = terminal(await read_response(connection))
                await connection.send(create("hi", store=False))
                fresh = terminal(await read_response(connection))
                return warm, continued, fresh
        finally:
            await client.close()

    warm, continued, fresh = await in_asyncio(scenario)
    assert [e["type"] for e in warm] == [
        "response.created",
        "response.in_progress",
        "response.completed",
    ]
    warmed = terminal(warm)
    assert warmed["id"].startswith("resp_")
    assert warmed["output"] == []
    assert warmed["usage"]["output_tokens"] == 0
    assert output_text(continued) == "You said: hi"
    assert continued["previous_response_id"] == warmed["id"]
    assert continued["usage"]["input_tokens"] > fresh["usage"]["input_tokens"]


async def test_bad_events_get_error_events_and_the_connection_stays_open(
    server: Server,
) -> None:
    async def scenario() -> tuple[list[dict[str, Any]], dict[str, Any]]:
        client = sdk_client(server)
        try:
            errors = []
            async with client.responses.connect() as connection:
                for raw in (
                    "{not json",
                    "[1, 2]",
                    json.dumps({"model": MODEL}),
                    json.dumps({"type": "response.steer", "input": "x"}),
                    json.dumps(create("x", bogus=1)),
                    json.dumps(create("x", model="nope")),
                    json.dumps(create("x", previous_response_id="resp_missing")),
                    json.dumps(create("x", background=True)),
                    json.dumps(create("x", generate="no")),
                ):
                    await connection.send_raw(raw)
                    errors.append(await read_error(connection))
                await connection.send(create("still here?"))
                answer = terminal(await read_response(connection))
            return errors, answer
        finally:
            await client.close()

    errors, answer = await in_asyncio(scenario)
    assert [(e["status"], e["error"]["param"], e["error"]["code"]) for e in errors] == [
        (400, None, "invalid_json"),
        (400, None, "invalid_type"),
        (400, "type", "missing_required_parameter"),
        (400, "type", "invalid_value"),
        (400, "bogus", "unknown_parameter"),
        (404, "model", "model_not_found"),
        (400, "previous_response_id", "previous_response_not_found"),
        (400, "background", "unsupported_parameter"),
        (400, "generate", "invalid_type"),
    ]
    for error in errors:
        assert set(error["error"]) == {"message", "type", "param", "code"}
        assert error["error"]["type"] == "invalid_request_error"
        assert error["error"]["message"]
    assert output_text(answer) == "You said: still here?"


async def test_a_second_create_while_one_is_in_flight_is_refused(server: Server) -> None:
    async def scenario() -> tuple[list[dict[str, Any]], dict[str, Any]]:
        client = sdk_client(server)
        try:
            async with client.responses.connect() as connection:
                await connection.send(create("tokens:60 delay:20"))
                first = json.loads(await connection.recv_bytes())
                assert first["type"] == "response.created"
                await connection.send(create("me too"))
                events = [first, *await read_response(connection)]
                await connection.send(create("now me"))
                after = terminal(await read_response(connection))
                return events, after
        finally:
            await client.close()

    events, after = await in_asyncio(scenario)
    errors = [e for e in events if e["type"] == "error"]
    assert len(errors) == 1
    assert errors[0]["status"] == 400
    assert errors[0]["error"]["code"] == "response_already_in_flight"
    # The response in flight goes on undisturbed.
    response = terminal([e for e in events if e["type"] != "error"])
    assert response["status"] == "completed"
    assert response["usage"]["output_tokens"] >= 60
    assert output_text(after) == "You said: now me"


async def test_pipelined_creates_after_an_error_never_run_two_responses_at_once(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    creates = [
        create("first", previous_response_id="resp_missing"),
        *(create(f"{name} tokens:40 delay:5") for name in ("b", "c", "d")),
    ]
    # The first error event is slow to go out (a slow network): the next create
    # is read and dispatched while it is being sent.
    dispatched = 0
    second = trio.Event()
    dispatch, send_error = ResponsesSocket._dispatch, ResponsesSocket._send_error

    async def counting_dispatch(self: ResponsesSocket, *args: Any) -> None:
        nonlocal dispatched
        await dispatch(self, *args)
        dispatched += 1
        if dispatched == 2:
            second.set()

    async def slow_send_error(self: ResponsesSocket, error: Exception, **kwargs: Any) -> None:
        if getattr(error, "code", None) == "previous_response_not_found":
            with trio.fail_after(SCENARIO_TIMEOUT_S):
                await second.wait()
        await send_error(self, error, **kwargs)

    monkeypatch.setattr(ResponsesSocket, "_dispatch", counting_dispatch)
    monkeypatch.setattr(ResponsesSocket, "_send_error", slow_send_error)

    async def scenario() -> list[dict[str, Any]]:
        client = sdk_client(server)
        try:
            async with client.responses.connect() as connection:
                for event in creates:  # all at once, without waiting for answers
                    await connection.send(event)
                events: list[dict[str, Any]] = []
                answered = 0  # each create gets an error event or a terminal event
                while answered < len(creates):
                    event = json.loads(await connection.recv_bytes())
                    events.append(event)
                    answered += event["type"] == "error" or event["type"] in TERMINAL_TYPES
                await connection.send(create("last"))
                events.extend(await read_response(connection))
                return events
        finally:
            await client.close()

    events = await in_asyncio(scenario)
    errors = [e["error"]["code"] for e in events if e["type"] == "error"]
    assert errors.count("previous_response_not_found") == 1
    streaming: str | None = None
    for event in events:
        if event["type"] == "response.created":
            assert streaming is None, f"{event['response']['id']} started inside {streaming}"
            streaming = event["response"]["id"]
        elif event["type"] in TERMINAL_TYPES:
            assert streaming == event["response"]["id"]
            streaming = None
        elif event["type"] != "error":
            assert streaming is not None, f"{event['type']} outside a response"
    finished = [e["response"] for e in events if e["type"] in TERMINAL_TYPES]
    assert finished and all(r["status"] == "completed" for r in finished)
    assert output_text(finished[-1]) == "You said: last"
    refused = [code for code in errors if code != "previous_response_not_found"]
    assert all(code == "response_already_in_flight" for code in refused)
    # Each of the three pipelined creates ran or was refused; "last" ran.
    assert len(refused) + len(finished) == 3 + 1


async def test_a_failed_response_is_not_kept_for_previous_response_id(server: Server) -> None:
    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        client = sdk_client(server)
        try:
            async with client.responses.connect() as connection:
                await connection.send(create("fail:3 tokens:10", store=False))
                failed = terminal(await read_response(connection))
                await connection.send(create("again", previous_response_id=failed["id"]))
                return failed, await read_error(connection)
        finally:
            await client.close()

    failed, error = await in_asyncio(scenario)
    assert failed["status"] == "failed"
    assert error["status"] == 400
    assert error["error"]["code"] == "previous_response_not_found"
    assert error["error"]["param"] == "previous_response_id"


async def test_api_keys_are_checked_at_the_upgrade(start_server: Any) -> None:
    server: Server = await start_server(api_keys=("right",))

    async def attempt(key: str) -> Any:
        client = sdk_client(server, api_key=key)
        try:
            async with client.responses.connect() as connection:
                await connection.send(create("with the right key"))
                return terminal(await read_response(connection))
        except websockets.InvalidStatus as refused:
            return refused.response
        finally:
            await client.close()

    wrong = await in_asyncio(lambda: attempt("wrong"))
    assert wrong.status_code == 401
    assert json.loads(wrong.body)["error"]["code"] == "invalid_api_key"

    async def no_key() -> Any:
        try:
            async with websockets.connect(server.url.replace("http", "ws") + "/v1/responses"):
                return None
        except websockets.InvalidStatus as refused:
            return refused.response

    missing = await in_asyncio(no_key)
    assert missing.status_code == 401
    assert "Authorization: Bearer" in json.loads(missing.body)["error"]["message"]

    answer = await in_asyncio(lambda: attempt("right"))
    assert output_text(answer) == "You said: with the right key"


async def test_websockets_to_other_routes_get_http_errors(server: Server) -> None:
    base = server.url.replace("http", "ws")

    async def refused(path: str) -> Any:
        with pytest.raises(websockets.InvalidStatus) as info:
            async with websockets.connect(base + path):
                pass
        return info.value.response

    unknown = await in_asyncio(lambda: refused("/v1/nothing"))
    assert unknown.status_code == 404
    assert json.loads(unknown.body)["error"]["code"] == "not_found"
    http_only = await in_asyncio(lambda: refused("/v1/models"))
    assert http_only.status_code == 400
    assert json.loads(http_only.body)["error"]["type"] == "invalid_request_error"


async def test_closing_the_connection_cancels_the_response(server: Server) -> None:
    service = server.service

    async def follow_then_close() -> ResponseHandle | None:
        client = sdk_client(server)
        try:
            async with client.responses.connect() as connection:
                await connection.send(create("tokens:100000 delay:2"))
                created = json.loads(await connection.recv_bytes())
                assert created["type"] == "response.created"
                while json.loads(await connection.recv_bytes())["type"] != (
                    "response.output_text.delta"
                ):
                    pass
                return trio.from_thread.run_sync(service.running, created["response"]["id"])
        finally:
            await client.close()

    handle = await in_asyncio(follow_then_close)
    assert handle is not None
    with trio.fail_after(10):
        await handle.wait_closed()
    assert handle.status == "cancelled"
    await assert_nothing_left(server)


WRITE_TIMEOUT_S = 1.0
TINY_BUFFER = 4096


async def test_a_client_that_stops_reading_is_disconnected_and_its_response_cancelled(
    start_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    server: Server = await start_server(sse_write_timeout_s=WRITE_TIMEOUT_S)
    started: list[ResponseHandle] = []
    first = trio.Event()
    original = server.service.start

    async def start(*args: Any, **kwargs: Any) -> ResponseHandle:
        handle = await original(*args, **kwargs)
        started.append(handle)
        first.set()
        return handle

    monkeypatch.setattr(server.service, "start", start)

    # A raw client with a tiny receive buffer: it upgrades, sends one create, reads nothing.
    parts = urlsplit(server.url)
    assert parts.hostname is not None and parts.port is not None
    sock = trio.socket.socket()
    sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_RCVBUF, TINY_BUFFER)
    await sock.connect((parts.hostname, parts.port))
    stream = trio.SocketStream(sock)
    ws = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
    await stream.send_all(ws.send(wsproto.events.Request(host="test", target="/v1/responses")))
    head = b""
    while b"\r\n\r\n" not in head:
        head += await stream.receive_some(1)
    ws.receive_data(head)
    assert isinstance(next(ws.events()), wsproto.events.AcceptConnection)
    body = json.dumps(create("tokens:100000 delay:2"))
    await stream.send_all(ws.send(wsproto.events.TextMessage(data=body)))

    with trio.fail_after(5):
        await first.wait()
    handle = started[0]
    with trio.fail_after(WRITE_TIMEOUT_S + 10):
        await handle.wait_closed()
    assert handle.status == "cancelled"
    await assert_nothing_left(server)
    await stream.aclose()


async def test_binary_and_empty_frames_get_error_events_and_cancel_nothing(
    server: Server,
) -> None:
    url = server.url.replace("http", "ws", 1) + "/v1/responses"

    async def scenario() -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
        async with websockets.connect(url) as connection:
            await connection.send(json.dumps(create("in flight tokens:30")))
            for frame in (b"", json.dumps(create("binary")).encode(), ""):
                await connection.send(frame)
            events: list[dict[str, Any]] = []
            errors: list[dict[str, Any]] = []
            while len(errors) < 3 or not events or events[-1]["type"] not in TERMINAL_TYPES:
                event = json.loads(await connection.recv())
                (errors if event["type"] == "error" else events).append(event)
            await connection.send(json.dumps(create("still here?")))
            while (after := json.loads(await connection.recv()))["type"] not in TERMINAL_TYPES:
                pass
            return events, errors, after

    events, errors, after = await in_asyncio(scenario)
    assert events[-1]["type"] == "response.completed"  # the frames cancelled nothing
    assert [(e["status"], e["error"]["code"]) for e in errors] == [
        (400, "unsupported_frame"),
        (400, "unsupported_frame"),
        (400, "invalid_json"),
    ]
    assert output_text(after["response"]) == "You said: still here?"
