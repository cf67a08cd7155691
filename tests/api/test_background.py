"""Background responses through HTTP: queued jobs, resume, cancel, fail."""

from __future__ import annotations

import openai
import pytest
import trio

from tests.conftest import StartServer
from tests.support import MODEL, RawSSEClient, Server, check_stream, parse_sse, validate_response


async def _background(server: Server, text: str, **extra: object) -> str:
    response = await server.http.post(
        "/v1/responses", json={"model": MODEL, "input": text, "background": True, **extra}
    )
    assert response.status_code == 200, response.text
    response_id: str = response.json()["id"]
    return response_id


async def test_background_returns_queued_then_completes(server: Server) -> None:
    created = await server.client.responses.create(model=MODEL, input="later", background=True)
    assert created.status == "queued"
    assert created.background is True
    assert created.output == [] and created.usage is None

    await server.service.wait(created.id)
    done = await server.client.responses.retrieve(created.id)
    assert done.status == "completed"
    assert done.completed_at is not None
    assert done.output_text == "You said: later"
    assert done.usage is not None and done.usage.total_tokens > 0


async def test_a_background_create_answers_queued_however_soon_the_job_runs(
    server: Server,
) -> None:
    # The job may begin before the create's reply is written: the reply is the
    # response as created all the same.
    statuses: list[str] = []

    async def create() -> None:
        created = await server.client.responses.create(
            model=MODEL, input="tokens:3", background=True
        )
        statuses.append(created.status)

    for _ in range(10):
        await create()
    async with trio.open_nursery() as nursery:
        for _ in range(30):
            nursery.start_soon(create)
    assert statuses == ["queued"] * 40


async def test_retrieve_while_running_shows_finished_items(server: Server) -> None:
    response_id = await _background(server, "tokens:200 delay:20")
    with await server.service.subscribe(response_id) as subscription:
        async for event in subscription:
            if event["type"] == "response.output_item.done":
                break
    running = (await server.http.get(f"/v1/responses/{response_id}")).json()
    validate_response(running)
    assert running["status"] == "in_progress"
    assert [item["type"] for item in running["output"]] == ["reasoning"]
    assert running["usage"] is None
    await server.client.responses.cancel(response_id)


async def test_background_stream_can_be_resumed(server: Server) -> None:
    body = {"model": MODEL, "input": "tokens:300 delay:2", "background": True, "stream": True}
    first = await RawSSEClient.open(server, "POST", "/v1/responses", body)
    assert await first.read_head() == 200
    head = (await first.read_events(20))[:20]
    await first.aclose()  # the job must not notice
    payloads = [event.json() for event in head]
    assert [p["type"] for p in payloads[:3]] == [
        "response.created",
        "response.queued",
        "response.in_progress",
    ]
    assert payloads[0]["response"]["status"] == "queued"
    response_id = payloads[0]["response"]["id"]

    final = await server.service.wait(response_id)
    assert final["status"] == "completed"

    replay = await RawSSEClient.open(server, "GET", f"/v1/responses/{response_id}?stream=true")
    full = await replay.read_all()
    assert replay.status == 200
    events = parse_sse(full)
    assert events[-1].data == "[DONE]"
    log = [event.json() for event in events[:-1]]
    check_stream(log)
    assert log[:20] == payloads
    assert log[-1]["response"] == final

    again = await RawSSEClient.open(server, "GET", f"/v1/responses/{response_id}?stream=true")
    assert await again.read_all() == full

    tail = await RawSSEClient.open(
        server, "GET", f"/v1/responses/{response_id}?stream=true&starting_after=9"
    )
    tail_log = [e.json() for e in parse_sse(await tail.read_all())[:-1]]
    assert tail_log == log[10:]

    by_header = await RawSSEClient.open(
        server,
        "GET",
        f"/v1/responses/{response_id}?stream=true",
        headers={"Last-Event-ID": "9"},
    )
    assert [e.json() for e in parse_sse(await by_header.read_all())[:-1]] == log[10:]

    stream = await server.client.responses.retrieve(response_id, stream=True, starting_after=5)
    sequence = [event.sequence_number async for event in stream]
    assert sequence == list(range(6, len(log)))

    async with server.client.responses.stream(response_id=response_id, starting_after=5) as sdk:
        numbers = [event.sequence_number async for event in sdk]
        resumed = await sdk.get_final_response()
    assert numbers == list(range(6, len(log)))
    assert (
        resumed.id == response_id
        and resumed.output_text == final["output"][-1]["content"][0]["text"]
    )


async def test_stream_past_the_end_is_empty_and_closes(server: Server) -> None:
    response_id = await _background(server, "hi")
    final = await server.service.wait(response_id)
    assert final["status"] == "completed"
    last = (await server.service.subscribe(response_id)).cursor
    assert last == -1
    client = await RawSSEClient.open(
        server, "GET", f"/v1/responses/{response_id}?stream=true&starting_after=100000"
    )
    with trio.fail_after(10):
        assert await client.read_all() == b"data: [DONE]\n\n"


async def test_live_get_stream_replays_then_follows(server: Server) -> None:
    response_id = await _background(server, "tokens:150 delay:3")
    reader = await RawSSEClient.open(server, "GET", f"/v1/responses/{response_id}?stream=true")
    with trio.fail_after(10):
        body = await reader.read_all()
    events = [e.json() for e in parse_sse(body)[:-1]]
    check_stream(events)
    assert events[0]["type"] == "response.created"
    assert events[-1]["type"] == "response.completed"
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert len(deltas) == 150


async def test_get_stream_errors(server: Server) -> None:
    foreground = await server.client.responses.create(model=MODEL, input="fg")
    response = await server.http.get(f"/v1/responses/{foreground.id}?stream=true")
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "stream"

    missing = await server.http.get("/v1/responses/resp_nope?stream=true")
    assert missing.status_code == 404

    response_id = await _background(server, "hi")
    await server.service.wait(response_id)
    bad = await server.http.get(f"/v1/responses/{response_id}?stream=true&starting_after=x")
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "starting_after"


async def test_starting_after_older_than_the_ring_is_400(start_server: StartServer) -> None:
    server = await start_server(replay_events=50)
    response_id = await _background(server, "tokens:200")
    await server.service.wait(response_id)
    old = await server.http.get(f"/v1/responses/{response_id}?stream=true&starting_after=3")
    assert old.status_code == 400
    error = old.json()["error"]
    assert error["param"] == "starting_after" and error["code"] == "stream_expired"
    recent = await RawSSEClient.open(
        server, "GET", f"/v1/responses/{response_id}?stream=true&starting_after=200"
    )
    events = parse_sse(await recent.read_all())
    assert events[-2].event == "response.completed"


async def test_cancel_ends_every_reader_at_once(server: Server) -> None:
    response_id = await _background(server, "tokens:5000 delay:5")
    readers = [
        await RawSSEClient.open(server, "GET", f"/v1/responses/{response_id}?stream=true")
        for _ in range(3)
    ]
    for reader in readers:
        await reader.read_events(5)
    job = server.service.running(response_id)
    assert job is not None

    cancelled = await server.client.responses.cancel(response_id)
    assert cancelled.status == "cancelled"
    with trio.fail_after(10):
        for reader in readers:
            events = parse_sse(await reader.read_all())
            assert events[-1].data == "[DONE]"
            terminal = events[-2].json()
            assert terminal["type"] == "response.failed"
            assert terminal["response"]["status"] == "cancelled"
        await job.wait_closed()
    assert server.service.engine.running_requests == frozenset()  # type: ignore[attr-defined]
    assert server.service.statistics().subscribers == 0

    again = await server.client.responses.cancel(response_id)
    assert again.status == "cancelled"
    assert (await server.client.responses.retrieve(response_id)).status == "cancelled"


async def test_cancel_refusals(server: Server) -> None:
    finished = await _background(server, "hi")
    await server.service.wait(finished)
    completed = await server.http.post(f"/v1/responses/{finished}/cancel")
    assert completed.status_code == 400
    assert completed.json()["error"]["message"] == "Cannot cancel a completed response."

    foreground = await server.client.responses.create(model=MODEL, input="fg")
    sync = await server.http.post(f"/v1/responses/{foreground.id}/cancel")
    assert sync.status_code == 400
    assert sync.json()["error"]["message"] == "Cannot cancel a synchronous response."

    unknown = await server.http.post("/v1/responses/resp_unknown/cancel")
    assert unknown.status_code == 404


async def test_background_failure_reaches_every_reader(server: Server) -> None:
    response_id = await _background(server, "fail:30 delay:5")
    readers = [
        await RawSSEClient.open(server, "GET", f"/v1/responses/{response_id}?stream=true")
        for _ in range(2)
    ]
    for reader in readers:
        events = parse_sse(await reader.read_all())
        terminal = events[-2].json()
        assert terminal["type"] == "response.failed"
        assert "fail:30" in terminal["response"]["error"]["message"]
    stored = await server.client.responses.retrieve(response_id)
    assert stored.status == "failed" and stored.error is not None


async def test_admission_limits_and_queue(start_server: StartServer) -> None:
    server = await start_server(max_active_jobs=2, max_queued_jobs=2)
    ids = [await _background(server, "tokens:5000 delay:5") for _ in range(4)]
    with pytest.raises(openai.RateLimitError) as raised:
        await server.client.responses.create(model=MODEL, input="one too many", background=True)
    body = raised.value.body
    assert isinstance(body, dict) and body["code"] == "server_busy"
    assert raised.value.status_code == 429

    statuses = [(await server.client.responses.retrieve(i)).status for i in ids]
    assert statuses == ["in_progress", "in_progress", "queued", "queued"]
    assert server.service.statistics().queued_jobs == 2

    await server.client.responses.cancel(ids[0])
    job = server.service.running(ids[2])
    assert job is not None
    with trio.fail_after(10), await server.service.subscribe(ids[2]) as subscription:
        async for event in subscription:
            if event["type"] == "response.in_progress":
                break
    assert (await server.client.responses.retrieve(ids[2])).status == "in_progress"
    queued = await server.client.responses.cancel(ids[3])
    assert queued.status == "cancelled"
    for response_id in ids[1:3]:
        await server.client.responses.cancel(response_id)
