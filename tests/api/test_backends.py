"""The API on every state backend (memory, SQLite, Redis), through HTTP with the SDK.

The same user-visible behaviour whatever ``--store`` says: retrieve, input items,
conversation chains, background streams and resume, cancel, delete; clients that
hang up leave nothing behind; a failing store never takes the server down.
"""

from __future__ import annotations

from typing import Any

import openai
import pytest
import trio
from openai import AsyncOpenAI

from tests.conftest import StartServer
from tests.support import MODEL, RawSSEClient, Server, check_stream, parse_sse, read_sse
from trio_responses import StoreError


async def _server(start_server: StartServer, store_url: str, **config: Any) -> Server:
    return await start_server(store_url=store_url, **config)


async def test_create_retrieve_chain_delete(start_server: StartServer, store_url: str) -> None:
    server = await _server(start_server, store_url, api_keys=("key-a", "key-b"))
    client = server.client
    first = await client.responses.create(
        model=MODEL,
        input=[
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": "first turn"},
        ],
    )
    assert first.output_text == "You said: first turn"
    second = await client.responses.create(
        model=MODEL, input="second turn", previous_response_id=first.id
    )
    third = await client.responses.create(
        model=MODEL, input="third turn", previous_response_id=second.id
    )
    assert first.usage and second.usage and third.usage
    assert first.usage.input_tokens < second.usage.input_tokens < third.usage.input_tokens

    retrieved = await client.responses.retrieve(second.id)
    assert retrieved.output_text == "You said: second turn"
    assert retrieved.previous_response_id == first.id
    items = [item async for item in client.responses.input_items.list(first.id)]
    assert [item.role for item in items] == ["user", "developer"]  # type: ignore[union-attr]

    await client.responses.delete(third.id)
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(third.id)

    unstored = await client.responses.create(model=MODEL, input="x", store=False)
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(unstored.id)

    stranger = AsyncOpenAI(base_url=server.base_url, api_key="key-b", max_retries=0)
    async with stranger:
        with pytest.raises(openai.NotFoundError):
            await stranger.responses.retrieve(first.id)
        with pytest.raises(openai.NotFoundError):
            await stranger.responses.create(model=MODEL, input="x", previous_response_id=first.id)


async def test_background_stream_resume_and_replay(
    start_server: StartServer, store_url: str
) -> None:
    server = await _server(start_server, store_url)
    created = await server.client.responses.create(
        model=MODEL, input="tokens:200 delay:5", background=True
    )
    assert created.status == "queued"
    live = await RawSSEClient.open(server, "GET", f"/v1/responses/{created.id}?stream=true")
    early = await live.read_events(20)
    assert early[0].json()["type"] == "response.created"

    running = await server.client.responses.retrieve(created.id)
    assert running.status in ("queued", "in_progress")

    resumed = await RawSSEClient.open(
        server, "GET", f"/v1/responses/{created.id}?stream=true&starting_after=10"
    )
    resumed_events = [event.json() for event in parse_sse(await resumed.read_all())[:-1]]
    everything = [event.json() for event in parse_sse(await live.read_all())[:-1]]
    check_stream(everything)
    assert resumed_events == everything[11:]

    finished = await server.client.responses.retrieve(created.id)
    assert finished.status == "completed"
    assert finished.usage is not None and finished.usage.output_tokens > 200

    status, replayed, raw = await read_sse(
        server.http, "GET", f"/v1/responses/{created.id}?stream=true&starting_after=5"
    )
    assert status == 200 and raw.endswith(b"data: [DONE]\n\n")
    assert [event.json() for event in replayed[:-1]] == everything[6:]

    last = everything[-1]["sequence_number"]
    _, empty, _ = await read_sse(
        server.http, "GET", f"/v1/responses/{created.id}?stream=true&starting_after={last}"
    )
    assert [event.data for event in empty] == ["[DONE]"]

    foreground = await server.client.responses.create(model=MODEL, input="fg")
    refused = await server.http.get(f"/v1/responses/{foreground.id}?stream=true")
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "stream"


async def test_cancel_ends_readers_and_is_recorded(
    start_server: StartServer, store_url: str
) -> None:
    server = await _server(start_server, store_url)
    created = await server.client.responses.create(
        model=MODEL, input="tokens:5000 delay:5", background=True
    )
    readers = [
        await RawSSEClient.open(server, "GET", f"/v1/responses/{created.id}?stream=true")
        for _ in range(2)
    ]
    for reader in readers:
        await reader.read_events(5)
    busy = await server.http.delete(f"/v1/responses/{created.id}")
    assert busy.status_code == 400
    cancelled = await server.client.responses.cancel(created.id)
    assert cancelled.status == "cancelled"
    with trio.fail_after(5):
        for reader in readers:
            events = parse_sse(await reader.read_all())
            assert events[-1].data == "[DONE]"
            assert events[-2].json()["response"]["status"] == "cancelled"
        await server.service.wait_idle()
    assert (await server.client.responses.retrieve(created.id)).status == "cancelled"
    assert (await server.client.responses.cancel(created.id)).status == "cancelled"
    await server.client.responses.delete(created.id)
    assert (await server.http.get(f"/v1/responses/{created.id}?stream=true")).status_code == 404


async def test_clients_that_hang_up_at_once_leave_nothing(
    start_server: StartServer, store_url: str
) -> None:
    server = await _server(start_server, store_url, max_queued_jobs=100)
    body = b'{"model": "%s", "input": "hang-up", "background": true}' % MODEL.encode()
    request = (
        b"POST /v1/responses HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    limiter = trio.CapacityLimiter(50)

    async def hang_up() -> None:
        async with limiter:
            stream = await trio.open_tcp_stream(host, int(port))
            await stream.send_all(request)
            await stream.aclose()  # FIN right after the request

    async with trio.open_nursery() as nursery:
        for _ in range(300):
            nursery.start_soon(hang_up)
    # No event says when the server has handled the last hung-up request: poll.
    with trio.fail_after(30):
        while (stats := server.service.statistics()).running_jobs or stats.job_tasks:  # noqa: ASYNC110
            await trio.sleep(0.05)
    # The server still takes requests: no slot or queue place was lost.
    assert (await server.client.responses.create(model=MODEL, input="after")).status == (
        "completed"
    )


async def test_create_fails_cleanly_while_the_store_is_down(
    start_server: StartServer, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = await _server(start_server, store_url)
    store = server.service.state.store
    working_put = store.put
    calls = 0

    async def broken_put(record: Any) -> None:
        nonlocal calls
        calls += 1
        raise StoreError("the disk is on fire")

    monkeypatch.setattr(store, "put", broken_put)
    refused = await server.http.post(
        "/v1/responses", json={"model": MODEL, "input": "x", "background": True}
    )
    assert refused.status_code == 503
    error = refused.json()["error"]
    assert error["code"] == "store_unavailable" and error["type"] == "server_error"
    assert calls > 1  # retried before giving up
    stats = server.service.statistics()
    assert stats.running_jobs == 0 and stats.job_tasks == 0

    monkeypatch.setattr(store, "put", working_put)
    assert (await server.client.responses.create(model=MODEL, input="ok")).status == "completed"
    assert (await server.http.get("/health")).status_code == 200


@pytest.mark.parametrize("store_url", ["sqlite", "redis"], indirect=True)
async def test_a_store_failing_mid_response_fails_only_that_response(
    start_server: StartServer, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = await _server(start_server, store_url)
    logs = server.service.state.logs
    working_append = logs.append

    async def broken_append(*args: Any, **kwargs: Any) -> None:
        raise StoreError("the connection dropped")

    created = await server.client.responses.create(
        model=MODEL, input="tokens:3000 delay:2", background=True
    )
    reader = await RawSSEClient.open(server, "GET", f"/v1/responses/{created.id}?stream=true")
    await reader.read_events(5)
    monkeypatch.setattr(logs, "append", broken_append)
    with trio.fail_after(10):
        events = parse_sse(await reader.read_all())
    terminal = events[-2].json()
    assert terminal["type"] == "response.failed"
    assert terminal["response"]["error"]["code"] == "server_error"
    with trio.fail_after(10):
        await server.service.wait_idle()

    monkeypatch.setattr(logs, "append", working_append)
    assert (await server.client.responses.retrieve(created.id)).status == "failed"
    after = await server.client.responses.create(model=MODEL, input="tokens:5", background=True)
    with trio.fail_after(10):
        assert (await server.service.wait(after.id))["status"] == "completed"
    assert (await server.http.get("/health")).status_code == 200


async def test_admission_holds_under_concurrent_creates(
    start_server: StartServer, store_url: str
) -> None:
    server = await _server(start_server, store_url, max_active_jobs=1, max_queued_jobs=1)
    statuses: list[int] = []

    async def create() -> None:
        reply = await server.http.post(
            "/v1/responses",
            json={"model": MODEL, "input": "tokens:3000 delay:5", "background": True},
        )
        statuses.append(reply.status_code)

    async with trio.open_nursery() as nursery:
        for _ in range(20):
            nursery.start_soon(create)
    assert sorted(statuses) == [200] * 2 + [429] * 18


async def test_shutdown_while_a_create_is_being_recorded(
    start_server: StartServer, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = await _server(start_server, store_url)
    store = server.service.state.store
    working_put = store.put
    recording = trio.Event()

    async def slow_put(record: Any) -> None:
        recording.set()
        await trio.sleep(0.5)
        await working_put(record)

    monkeypatch.setattr(store, "put", slow_put)
    replies: list[Any] = []

    async def create() -> None:
        replies.append(
            await server.http.post("/v1/responses", json={"model": MODEL, "input": "late"})
        )

    async with trio.open_nursery() as nursery:
        nursery.start_soon(create)
        await recording.wait()
        await server.service.shutdown(0)
    assert replies[0].status_code == 503
    assert replies[0].json()["error"]["code"] == "server_shutting_down"
    stats = server.service.statistics()
    assert stats.running_jobs == 0 and stats.job_tasks == 0


async def test_an_unstored_response_is_nobody_elses_to_look_up(
    start_server: StartServer, store_url: str
) -> None:
    server = await _server(start_server, store_url)
    stream = await RawSSEClient.open(
        server,
        "POST",
        "/v1/responses",
        {"model": MODEL, "input": "tokens:3000 delay:5", "stream": True, "store": False},
    )
    events = await stream.read_events(3)
    response_id = events[0].json()["response"]["id"]
    for method, path in [
        ("GET", f"/v1/responses/{response_id}"),
        ("GET", f"/v1/responses/{response_id}?stream=true"),
        ("GET", f"/v1/responses/{response_id}/input_items"),
        ("POST", f"/v1/responses/{response_id}/cancel"),
        ("DELETE", f"/v1/responses/{response_id}"),
    ]:
        reply = await server.http.request(method, path)
        assert reply.status_code == 404, (method, path, reply.text)
    follow_up = await server.http.post(
        "/v1/responses",
        json={"model": MODEL, "input": "x", "previous_response_id": response_id},
    )
    assert follow_up.status_code == 404
    await stream.aclose()


@pytest.mark.parametrize("store_url", ["sqlite", "redis"], indirect=True)
async def test_a_final_state_the_store_refused_is_recorded_later(
    start_server: StartServer, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A short lease makes maintenance (which retries) run every 0.1 s.
    server = await _server(start_server, store_url, job_lease_s=0.4)
    store = server.service.state.store
    working_put = store.put
    created = await server.client.responses.create(
        model=MODEL, input="tokens:200 delay:5", background=True
    )
    reader = await RawSSEClient.open(server, "GET", f"/v1/responses/{created.id}?stream=true")
    await reader.read_until("response.in_progress")

    async def refusing_put(record: Any) -> None:
        if not record.running:
            raise StoreError("the disk is full")
        await working_put(record)

    monkeypatch.setattr(store, "put", refusing_put)
    events = parse_sse(await reader.read_all())
    assert events[-2].json()["type"] == "response.completed"  # readers here are unaffected
    with trio.fail_after(10):
        await server.service.wait_idle()
    assert (await server.client.responses.retrieve(created.id)).status != "completed"

    monkeypatch.setattr(store, "put", working_put)
    # The server's maintenance retries on its own schedule: poll what a client sees.
    with trio.fail_after(20):
        while (await server.client.responses.retrieve(created.id)).status != "completed":  # noqa: ASYNC110
            await trio.sleep(0.05)


async def test_agent_tools_round_trip(start_server: StartServer, store_url: str) -> None:
    """Parallel namespace and function calls, then tool search loading a deferred
    function, each answered through previous_response_id from the store."""
    server = await _server(start_server, store_url)
    client = server.client
    weather: dict[str, Any] = {
        "type": "function",
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
    agents: dict[str, Any] = {
        "type": "namespace",
        "name": "agents",
        "description": "Sub-agents.",
        "tools": [{"type": "function", "name": "spawn", "description": "Start one."}],
    }
    search: dict[str, Any] = {"type": "tool_search", "execution": "client"}
    deferred = {**weather, "name": "get_time", "defer_loading": True}
    tools: Any = [weather, agents, search, deferred]
    calls = await client.responses.create(
        model=MODEL,
        input='call:agents.spawn {} call:get_weather {"city": "Oslo"}',
        tools=tools,
    )
    made = [item for item in calls.output if item.type == "function_call"]
    assert [(c.namespace, c.name) for c in made] == [("agents", "spawn"), (None, "get_weather")]
    answered = await client.responses.create(
        model=MODEL,
        previous_response_id=calls.id,
        input=[
            {"type": "function_call_output", "call_id": c.call_id, "output": f"done {c.name}"}
            for c in made
        ],
        tools=tools,
    )
    assert answered.output_text == "Tool result: done get_weather"

    searched = await client.responses.create(
        model=MODEL,
        previous_response_id=answered.id,
        input='call:tool_search {"query": "time"}',
        tools=tools,
    )
    call = searched.output[-1]
    assert call.type == "tool_search_call"
    loaded = await client.responses.create(
        model=MODEL,
        previous_response_id=searched.id,
        input=[
            {
                "type": "tool_search_output",
                "call_id": call.call_id,
                "tools": [{**deferred, "defer_loading": False}],
            },
            {"role": "user", "content": 'call:get_time {"city": "Oslo"}'},
        ],
        tools=tools,
    )
    assert loaded.output[-1].type == "function_call"
    assert loaded.output[-1].name == "get_time"
    items = client.responses.input_items.list(loaded.id, order="asc")
    assert [item.type async for item in items] == ["tool_search_output", "message"]
    stored = await client.responses.retrieve(searched.id)
    assert stored.output[-1].type == "tool_search_call"
