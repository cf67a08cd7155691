"""Many readers of one background response, and one that stops reading."""

from __future__ import annotations

import time

import pytest
import trio

from tests.conftest import StartServer
from tests.support import MODEL, RawSSEClient, check_stream, parse_sse
from trio_responses.protocol.codec import KEEPALIVE

READERS = 1_000


@pytest.mark.slow
async def test_a_thousand_readers_get_the_identical_log(start_server: StartServer) -> None:
    server = await start_server(max_active_jobs=1)
    # Hold the only slot so the response waits in the queue while every reader connects.
    blocker = await server.client.responses.create(
        model=MODEL, input="tokens:100000 delay:10", background=True
    )
    created = await server.http.post(
        "/v1/responses", json={"model": MODEL, "input": "tokens:300", "background": True}
    )
    response_id = created.json()["id"]
    path = f"/v1/responses/{response_id}?stream=true"
    bodies: list[bytes] = []
    connected = trio.Event()

    async def read() -> None:
        client = await RawSSEClient.open(server, "GET", path)
        async with client.stream:
            await client.read_events(2)  # created, queued: the reader is live
            if server.service.statistics().subscribers == READERS:
                connected.set()
            # Keep-alive comments are per connection; the events must be identical.
            bodies.append((await client.read_all()).replace(KEEPALIVE, b""))

    with trio.fail_after(600):  # generous: a thousand connections on a loaded box
        async with trio.open_nursery() as nursery:
            for _ in range(READERS):
                nursery.start_soon(read)
            await connected.wait()
            assert (await server.client.responses.retrieve(response_id)).status == "queued"
            await server.client.responses.cancel(blocker.id)
    assert len(bodies) == READERS
    assert len(set(bodies)) == 1
    events = [e.json() for e in parse_sse(bodies[0])[:-1]]
    check_stream(events)
    assert events[-1]["type"] == "response.completed"
    assert len([e for e in events if e["type"] == "response.output_text.delta"]) == 300
    assert server.service.statistics().subscribers == 0


async def test_a_reader_that_stops_reading_is_cut_off_without_slowing_anyone(
    start_server: StartServer,
) -> None:
    server = await start_server(replay_events=500)
    created = await server.http.post(
        "/v1/responses",
        json={"model": MODEL, "input": "tokens:3000 delay:1", "background": True},
    )
    response_id = created.json()["id"]
    path = f"/v1/responses/{response_id}?stream=true"
    # A tiny receive buffer, never read: the server's writes to it block at once.
    stalled = await RawSSEClient.open(server, "GET", path, receive_buffer=4096)

    started = time.monotonic()
    bodies: list[bytes] = []

    async def read() -> None:
        client = await RawSSEClient.open(server, "GET", path)
        async with client.stream:
            bodies.append(await client.read_all())

    async with trio.open_nursery() as nursery:
        for _ in range(10):
            nursery.start_soon(read)
    job_time = time.monotonic() - started
    final = await server.service.wait(response_id)
    assert final["status"] == "completed"
    assert len(bodies) == 10 and len(set(bodies)) == 1
    # 3,000 tokens at 1 ms: the job is not held back by the stalled reader.
    assert job_time < 15, job_time

    # The stalled reader resumes: what it gets ends with a clear error, not a hang.
    with trio.fail_after(10):
        body = await stalled.read_all()
    events = parse_sse(body)
    assert events[-1].data == "[DONE]"
    error = events[-2].json()
    assert error["type"] == "error" and error["code"] == "stream_lagged"
    assert "starting_after" in error["message"]
    await stalled.aclose()
    assert server.service.statistics().subscribers == 0


@pytest.mark.parametrize("reader_writes", [False, True])
async def test_readers_get_the_whole_stream_whoever_writes_their_sockets(
    start_server: StartServer, reader_writes: bool
) -> None:
    """With the producer writing readers' sockets (the default) and with each
    reader's task writing its own (``--reader-writes``), a response's creator and
    ten readers of a live background response get every event."""
    server = await start_server(reader_writes=reader_writes, token_delay_s=0.005)
    background = await server.client.responses.create(
        model=MODEL, input="tokens:200", background=True
    )
    bodies: list[bytes] = []
    created: list[bytes] = []

    async def read() -> None:
        client = await RawSSEClient.open(
            server, "GET", f"/v1/responses/{background.id}?stream=true&starting_after=-1"
        )
        async with client.stream:
            bodies.append((await client.read_all()).replace(KEEPALIVE, b""))

    async def create() -> None:
        body = {"model": MODEL, "input": "tokens:200", "stream": True}
        client = await RawSSEClient.open(server, "POST", "/v1/responses", body=body)
        async with client.stream:
            created.append((await client.read_all()).replace(KEEPALIVE, b""))

    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(create)
            for _ in range(10):
                nursery.start_soon(read)
    assert len(bodies) == 10 and len(set(bodies)) == 1
    for body in (bodies[0], created[0]):
        events = [e.json() for e in parse_sse(body)[:-1]]
        check_stream(events)
        assert events[-1]["type"] == "response.completed"
        deltas = [e for e in events if e["type"] == "response.output_text.delta"]
        assert len(deltas) == 200
