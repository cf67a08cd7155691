"""Connection handling: disconnects cancel foreground jobs, close means close,
long streams are not cut."""

from __future__ import annotations

import json
from functools import partial
from urllib.parse import urlsplit

import h11
import pytest
import trio
import trio.testing

from tests.support import (
    MODEL,
    JobSpy,
    Server,
    assert_nothing_left,
    count_tasks,
    open_socket,
    parse_sse,
    read_reply,
)
from trio_responses import Config
from trio_responses._serve import serve


def _post(body: dict[str, object], *, close: bool = False) -> bytes:
    payload = json.dumps(body).encode()
    headers = [
        "POST /v1/responses HTTP/1.1",
        "Host: test",
        "Content-Type: application/json",
        f"Content-Length: {len(payload)}",
    ]
    if close:
        headers.append("Connection: close")
    return ("\r\n".join(headers) + "\r\n\r\n").encode() + payload


async def _read_until(stream: trio.SocketStream, marker: bytes, buffer: bytearray) -> None:
    while marker not in buffer:
        chunk = await stream.receive_some(65536)
        assert chunk, "connection closed early"
        buffer.extend(chunk)


async def test_client_disconnect_mid_stream_cancels_the_job(server: Server) -> None:
    stream = await open_socket(server)
    await stream.send_all(_post({"model": MODEL, "input": "tokens:5000 delay:2", "stream": True}))
    buffer = bytearray()
    with trio.fail_after(10):
        while buffer.count(b"\n\n") < 20:
            chunk = await stream.receive_some(65536)
            assert chunk
            buffer.extend(chunk)
    body = bytes(buffer).split(b"\r\n\r\n", 1)[1]
    first = next(e for e in parse_sse(body) if e.event == "response.created")
    response_id = first.json()["response"]["id"]
    job = server.service.running(response_id)
    assert job is not None and job.status == "in_progress"

    await stream.aclose()
    with trio.fail_after(10):
        await job.wait_closed()
    assert job.status == "cancelled"
    await assert_nothing_left(server)
    stored = await server.client.responses.retrieve(response_id)
    assert stored.status == "cancelled"


async def test_client_disconnect_while_waiting_for_json_cancels_the_job(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = JobSpy(server.service, monkeypatch)
    stream = await open_socket(server)
    await stream.send_all(_post({"model": MODEL, "input": "tokens:5000 delay:2"}))
    with trio.fail_after(5):
        job = await spy.first()
    await stream.aclose()
    with trio.fail_after(10):
        await job.wait_closed()
    assert job.status == "cancelled"
    await assert_nothing_left(server)


@pytest.mark.parametrize("stream", [False, True])
async def test_connection_close_gets_eof(server: Server, stream: bool) -> None:
    socket = await open_socket(server)
    await socket.send_all(_post({"model": MODEL, "input": "bye", "stream": stream}, close=True))
    received = bytearray()
    with trio.fail_after(5):
        while chunk := await socket.receive_some(65536):
            received.extend(chunk)
    assert received.startswith(b"HTTP/1.1 200")
    assert b"You said: bye" in received
    # The head says so (h11 decides it, on the stream's direct path too), with the
    # server's own headers.
    head = bytes(received).split(b"\r\n\r\n", 1)[0].lower().split(b"\r\n")
    assert b"connection: close" in head
    assert any(line.startswith(b"date: ") for line in head)
    assert any(line.startswith(b"x-request-id: req_") for line in head)


@pytest.fixture
def fast_clock() -> trio.testing.MockClock:
    """Real time, sped up 200 times: a minute of server time passes in 0.3 s."""
    return trio.testing.MockClock(rate=200)


async def test_stream_longer_than_a_minute_is_not_cut(
    server: Server, fast_clock: trio.testing.MockClock
) -> None:
    start = trio.current_time()
    # ~110 tokens at 0.7 s each: about 77 seconds of stream.
    body = {"model": MODEL, "input": "tokens:100 delay:700", "stream": True}
    async with server.http.stream("POST", "/v1/responses", json=body) as response:
        raw = b"".join([chunk async for chunk in response.aiter_bytes()])
    assert trio.current_time() - start > 70
    events = parse_sse(raw)
    assert events[-1].data == "[DONE]"
    assert events[-2].event == "response.completed"
    deltas = [e for e in events if e.event == "response.output_text.delta"]
    assert len(deltas) == 100


async def test_clients_hanging_up_after_the_response_cause_no_server_errors(
    server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    """Closing right after the body races hypercorn's final send; it must stay quiet."""
    request = _post({"model": MODEL, "input": "quick"})
    for _ in range(150):
        stream = await open_socket(server)
        await stream.send_all(request)
        received = bytearray()
        with trio.fail_after(5):
            await _read_until(stream, b"You said: quick", received)
        await stream.aclose()
    # Let the server notice the last hang-up.
    await trio.sleep(0.2)
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert errors == []


def _request_head(body: bytes) -> h11.Request:
    return h11.Request(
        method="POST",
        target="/v1/responses",
        headers=[
            ("Host", "test"),
            ("Content-Type", "application/json"),
            ("Content-Length", str(len(body))),
        ],
    )


async def _exchange(
    socket: trio.SocketStream, client: h11.Connection, body: bytes
) -> tuple[h11.Response, bytes]:
    """One request on ``socket``, its response read and checked by h11 (framing included)."""
    await socket.send_all(client.send(_request_head(body)))
    await socket.send_all(client.send(h11.Data(data=body)))
    await socket.send_all(client.send(h11.EndOfMessage()))
    with trio.fail_after(10):
        return await read_reply(socket, client)


async def test_streams_are_framed_for_the_client_http_version(server: Server) -> None:
    """HTTP/1.1 bodies are chunked (and the connection serves the next request after
    one); an HTTP/1.0 client gets the body up to the close. h11 checks the framing."""
    socket = await open_socket(server)
    client = h11.Connection(our_role=h11.CLIENT)
    for text in ("first", "second"):
        body = json.dumps({"model": MODEL, "input": f"tokens:40 {text}", "stream": True})
        head, received = await _exchange(socket, client, body.encode())
        assert head.status_code == 200
        assert (b"transfer-encoding", b"chunked") in head.headers
        events = parse_sse(received)
        assert events[-1].data == "[DONE]" and events[-2].event == "response.completed"
        assert len([e for e in events if e.event == "response.output_text.delta"]) == 40
        client.start_next_cycle()
    await socket.aclose()

    socket = await open_socket(server)
    request = _post({"model": MODEL, "input": "tokens:40", "stream": True})
    await socket.send_all(request.replace(b" HTTP/1.1\r\n", b" HTTP/1.0\r\n", 1))
    reply = bytearray()
    with trio.fail_after(10):
        while chunk := await socket.receive_some(65536):
            reply.extend(chunk)
    head_bytes, _, received = bytes(reply).partition(b"\r\n\r\n")
    assert head_bytes.startswith(b"HTTP/1.1 200")
    assert b"transfer-encoding" not in head_bytes.lower()
    # The body to the close is the SSE text itself, no chunk framing in it.
    assert received.startswith(b"event: response.created\n") and b"\r\n" not in received
    events = parse_sse(received)
    assert events[-1].data == "[DONE]"
    assert len([e for e in events if e.event == "response.output_text.delta"]) == 40
    await socket.aclose()
    await assert_nothing_left(server)


async def test_paced_stream_and_head_on_one_connection(server: Server) -> None:
    """A paced stream (each event written as it comes, from the producer's task),
    then a HEAD of a stored stream (a head, no body), then a request again: h11, as
    the client, checks every response's framing on the one connection."""
    socket = await open_socket(server)
    client = h11.Connection(our_role=h11.CLIENT)
    body = {"model": MODEL, "input": "tokens:30 delay:5", "stream": True, "background": True}
    head, received = await _exchange(socket, client, json.dumps(body).encode())
    assert head.status_code == 200
    events = parse_sse(received)
    assert events[-1].data == "[DONE]" and events[-2].event == "response.completed"
    assert len([e for e in events if e.event == "response.output_text.delta"]) == 30
    response_id = json.loads(events[0].data)["response"]["id"]
    client.start_next_cycle()

    target = f"/v1/responses/{response_id}?stream=true"
    await socket.send_all(
        client.send(h11.Request(method="HEAD", target=target, headers=[("Host", "test")]))
    )
    await socket.send_all(client.send(h11.EndOfMessage()))
    with trio.fail_after(10):
        events_seen: list[object] = []
        while not isinstance(event := client.next_event(), h11.EndOfMessage):
            if event is h11.NEED_DATA:
                client.receive_data(await socket.receive_some(65536))
            else:
                events_seen.append(event)
    assert isinstance(events_seen[0], h11.Response) and events_seen[0].status_code == 200
    assert not any(isinstance(event, h11.Data) and event.data for event in events_seen)
    client.start_next_cycle()

    again = json.dumps({"model": MODEL, "input": "after head", "stream": True}).encode()
    head, received = await _exchange(socket, client, again)
    assert head.status_code == 200 and b"You said: after head" in received
    await socket.aclose()
    await assert_nothing_left(server)


async def test_direct_writes_to_a_slow_reader_keep_the_stream_whole(server: Server) -> None:
    """A paced stream to a client with a tiny receive buffer that reads slowly: the
    server's socket is often full or takes part of a chunk, so writes from the
    producer fall back to the body's task mid-chunk. h11 checks the framing; every
    event arrives once, in order."""
    parts = urlsplit(server.url)
    assert parts.hostname is not None and parts.port is not None
    sock = trio.socket.socket()
    sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_RCVBUF, 4096)
    await sock.connect((parts.hostname, parts.port))
    socket = trio.SocketStream(sock)
    client = h11.Connection(our_role=h11.CLIENT)
    body = json.dumps({"model": MODEL, "input": "tokens:1500 delay:2", "stream": True}).encode()
    await socket.send_all(client.send(_request_head(body)))
    await socket.send_all(client.send(h11.Data(data=body)))
    await socket.send_all(client.send(h11.EndOfMessage()))
    received = bytearray()
    with trio.fail_after(120):
        while not isinstance(event := client.next_event(), h11.EndOfMessage):
            if event is h11.NEED_DATA:
                client.receive_data(await socket.receive_some(512))
                await trio.sleep(0.01)  # about 50 KB/s, the producer ~125 KB/s
            elif isinstance(event, h11.Data):
                received.extend(event.data)
    events = parse_sse(bytes(received))
    assert events[-1].data == "[DONE]" and events[-2].event == "response.completed"
    numbers = [json.loads(e.data)["sequence_number"] for e in events[:-1]]
    assert numbers == list(range(len(numbers)))
    assert len([e for e in events if e.event == "response.output_text.delta"]) == 1500
    await socket.aclose()
    await assert_nothing_left(server)


def _connection_tasks() -> int:
    """Tasks serving a connection (trio's ``_run_handler``), anywhere in this run."""
    return count_tasks("_run_handler")


_HEALTH = b"GET /health HTTP/1.1\r\nHost: test\r\n\r\n"


async def _health_on(stream: trio.SocketStream) -> None:
    buffer = bytearray()
    await stream.send_all(_HEALTH)
    await _read_until(stream, b"\r\n\r\n", buffer)
    head, _, body = bytes(buffer).partition(b"\r\n\r\n")
    length = int(
        next(h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length"))[15:]
    )
    while len(body) < length:
        chunk = await stream.receive_some(65536)
        assert chunk, "connection closed early"
        body += chunk


async def test_an_idle_keep_alive_connection_times_out_from_its_last_request(
    server: Server,
) -> None:
    # hypercorn's keep-alive timeout (5 s): counted from the end of the last
    # request, not from the connection's first idle spell.
    stream = await open_socket(server)
    async with stream:
        await _health_on(stream)
        await trio.sleep(3)
        await _health_on(stream)  # busy, then idle again: the timeout starts over
        answered = trio.current_time()
        with trio.fail_after(30):
            assert await stream.receive_some(65536) == b""  # the server closed it
        assert trio.current_time() - answered >= 4.0


async def test_shutdown_closes_idle_keep_alive_connections_at_once(
    nursery: trio.Nursery,
) -> None:
    # Not after hypercorn's keep-alive timeout (5 s): the server is going away.
    stop = trio.Event()
    urls = await nursery.start(partial(serve, Config(port=0), shutdown_trigger=stop.wait))
    parts = urlsplit(urls[0])
    assert parts.hostname is not None and parts.port is not None
    idle = await trio.open_tcp_stream(parts.hostname, parts.port)
    async with idle:
        await _health_on(idle)
        stop.set()
        began = trio.current_time()
        with trio.fail_after(30):
            assert await idle.receive_some(65536) == b""
        assert trio.current_time() - began < 3.0


async def test_connections_that_go_mid_stream_leave_no_task(server: Server) -> None:
    before = _connection_tasks()
    streams = [await open_socket(server) for _ in range(8)]
    for stream in streams:
        await stream.send_all(
            _post({"model": MODEL, "input": "tokens:500 delay:5", "stream": True})
        )
        await _read_until(stream, b"response.output_text.delta", bytearray())
    assert _connection_tasks() == before + 8
    for stream in streams:
        await stream.aclose()
    with trio.fail_after(10):
        await trio.testing.wait_all_tasks_blocked(0.1)  # every task that could end has
    assert _connection_tasks() == before
    await assert_nothing_left(server)
